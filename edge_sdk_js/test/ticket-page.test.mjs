// A browser page cannot set the websocket upgrade's Authorization header: in headless Chromium, a page of the
// orchestrator's own origin fetches a ticket (/ticket.json with a proof made for "ticket") and opens the upgrade
// with it past a full per-address pending-hello cap that turns away its connection without one; the ticket is
// good once, and a proof made for another door does not buy one.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import WebSocket from "ws";
import { CHROMIUM } from "./browser.mjs";
import { python, pythonEnv } from "./cases.mjs";
import { startServer, tempDir } from "./fleet.mjs";
import { launchBrowser } from "./status-page.mjs";

test("a browser page's ticket opens the upgrade past a full pending-hello cap; without one it is turned away",
  { timeout: 240_000, skip: CHROMIUM === undefined && "chromium is not installed (apt-get install chromium)" }, async () => {
    const dir = tempDir("edgetrain-js-ticket-");
    const secretFile = join(dir, "page-1.secret");
    execFileSync(python(), ["-m", "edgetrain", "device", "enroll", "--store", join(dir, "store"), "--id", "page-1",
      "--out", secretFile], { env: pythonEnv(), stdio: ["ignore", "ignore", "pipe"] });
    const { server, url } = await startServer(dir, ["--web", "--require-credentials", "--model", "digits_mlp", "--rounds", "1",
      "--min-devices", "5"]);
    // 16 connections from this address that never say hello: its share of pending connections (max_pending_per_address)
    const held = await Promise.all(Array.from({ length: 16 }, () => new Promise((resolve, reject) => {
      const ws = new WebSocket(url, { perMessageDeflate: false });
      ws.on("open", () => resolve(ws));
      ws.on("error", reject);
    })));
    const browser = await launchBrowser();
    try {
      const page = await browser.newPage();
      await page.goto(`${url.replace("ws://", "http://")}/status`);
      const seen = await page.evaluate(async (wsUrl, secret) => {
        const sdk = await import("/sdk/dist/edgetrain.browser.mjs");
        const opened = (u) => new Promise((resolve) => {
          const ws = new WebSocket(u);
          ws.binaryType = "arraybuffer";
          ws.onopen = () => resolve(ws);
          ws.onclose = () => resolve(null);
        });
        const plain = await opened(wsUrl);
        const ticket = await sdk.fetchTicket(location.origin, "page-1", secret);
        const ws = await opened(sdk.withTicket(wsUrl, ticket));
        if (ws === null) return { plain: plain !== null, ticket: false };
        ws.send(sdk.encode({ t: "hello", device_id: "page-1", token: sdk.makeProof("page-1", secret, "hello"), budget_bytes: 2 ** 30,
          cores: 1, runtimes: ["onnxruntime-web"], num_samples: 10, device_class: "", labels: {}, resume_round: -1, rows: {}, ext: {} }));
        const reply = await new Promise((resolve) => { ws.onmessage = (e) => resolve(sdk.decode(new Uint8Array(e.data))); });
        const again = await opened(sdk.withTicket(wsUrl, ticket));
        const statusProof = await fetch(`/ticket.json?id=page-1`,
          { headers: { Authorization: `Edgetrain page-1 ${sdk.makeProof("page-1", secret, "status")}` } });
        return { plain: plain !== null, ticket: true, reply: reply.t, again: again !== null, statusProof: statusProof.status };
      }, url, readFileSync(secretFile, "utf8").trim());
      assert.deepEqual(seen, { plain: false, ticket: true, reply: "welcome", again: false, statusProof: 401 });
    } finally {
      await browser.close();
      for (const ws of held) ws.terminate();
      server.kill();
    }
  });
