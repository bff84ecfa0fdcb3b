// Conformance in a real browser: headless Chromium runs the same cases as conformance.test.mjs
// on onnxruntime-web, in a cross-origin isolated page served from 127.0.0.1. Skipped, with one
// line, where Debian's chromium is not installed (apt-get install chromium).
import assert from "node:assert/strict";
import { dirname } from "node:path";
import { test } from "node:test";
import { CHROMIUM, conformanceInPage, openPage, servePage } from "./browser.mjs";
import { referenceCases } from "./cases.mjs";
import { TOLERANCE } from "./conformance-core.mjs";

const CASES = (process.env.EDGETRAIN_JS_CONFORMANCE ?? "digits_mlp:2,resnet20:7").split(",");

test("the training graphs train in headless Chromium as in the Python device", { skip: CHROMIUM ? false : "chromium is not installed (apt-get install chromium): browser tests skipped", timeout: 240_000 }, async () => {
  const folders = referenceCases(CASES);
  const site = await servePage({ cases: dirname(folders[0]) });
  const { browser, page } = await openPage(site.url);
  try {
    for (const [i, name] of CASES.entries()) {
      const { err, deltaNames, expectedNames, isolated } = await conformanceInPage(page, folders[i]);
      console.log(`# ${name} chromium onnxruntime-web: ${JSON.stringify(err)}`);
      assert.ok(isolated, "the page is cross-origin isolated (COOP + COEP)");
      assert.deepEqual(deltaNames, expectedNames);
      for (const [key, limit] of Object.entries(TOLERANCE)) assert.ok(err[key] <= limit, `${name}: ${key} off by ${err[key]} > ${limit}`);
    }
  } finally {
    await browser.close();
    await site.close();
  }
});

/** A websocket relay to `target` on 127.0.0.1 that replaces the server's first message with a byte no msgpack value starts with. */
async function corruptingRelay(target) {
  const { WebSocketServer, default: WebSocket } = await import("ws");
  const relay = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  relay.on("connection", (down) => {
    const up = new WebSocket(target, { perMessageDeflate: false });
    const early = [];
    let first = true;
    up.on("open", () => { for (const m of early.splice(0)) up.send(m); });
    up.on("message", (data) => { down.send(first ? Uint8Array.of(0xc1) : data); first = false; });
    down.on("message", (data) => (up.readyState === WebSocket.OPEN ? up.send(data) : early.push(data)));
    up.on("close", () => down.close());
    down.on("close", () => up.close());
  });
  await new Promise((resolve) => relay.on("listening", resolve));
  return { url: `ws://127.0.0.1:${relay.address().port}`, close: () => new Promise((r) => relay.close(r)) };
}

test("a page given a malformed frame shows the error, and the server goes on", { skip: CHROMIUM ? false : "chromium is not installed (apt-get install chromium): browser tests skipped", timeout: 240_000 }, async () => {
  const { readFileSync, writeFileSync } = await import("node:fs");
  const { join } = await import("node:path");
  const { encodeTensors } = await import("../dist/index.js");
  const { loadShard } = await import("../dist/shard.js");
  const { journal, startServer, tempDir, writeShards } = await import("./fleet.mjs");
  const dir = tempDir("edgetrain-js-malformed-");
  const data = loadShard(writeShards(dir, [0], 1)[0]);
  writeFileSync(join(dir, "shard.bin"), encodeTensors({ x: data.x, y: data.y }));
  // Two rounds: the first loses its only device to the error (a straggler), the second trains.
  const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--rounds", "2", "--min-devices", "1",
    "--local-steps", "2", "--deadline", "120"]);
  const relay = await corruptingRelay(url);
  const site = await servePage({ shards: dir });
  const { browser, page } = await openPage(site.url);
  const device = (server) => page.evaluate(async (server) => {
    const { DeviceClient, decodeTensors, makeRuntime } = window.sdk;
    const t = decodeTensors(new Uint8Array(await (await fetch("/shards/shard.bin")).arrayBuffer()));
    const log = document.getElementById("log");
    const client = new DeviceClient({ server, deviceId: "tab-m", budgetBytes: 400 * 2 ** 20, webSocket: (u) => new WebSocket(u),
      runtime: makeRuntime("onnxruntime-web", window.ort, 1), data: { x: t.x, y: t.y },
      onEvent: (kind, d) => { if (kind === "error") log.textContent += `error ${d.code}: ${d.message}\n`; } });
    try {
      return { rounds: (await client.run()).length };
    } catch (exc) {
      return { failed: `${exc.name}: ${exc.message}`, shown: log.textContent };
    }
  }, server);
  try {
    const bad = await device(relay.url);
    assert.match(bad.failed ?? "", /ProtocolError/);
    assert.match(bad.shown, /^error malformed: /, "the page shows the error");
    const good = await device(url); // the same server, directly: it is still up and runs a round with the tab
    assert.ok(good.rounds >= 1, JSON.stringify(good));
    assert.equal(await server.done, 0);
  } finally {
    if (server.exitCode === null) server.kill();
    await browser.close();
    await site.close();
    await relay.close();
  }
  assert.match(readFileSync(join(dir, "server.log"), "utf8"), /device tab-m stopped: malformed/);
  const j = journal(dir);
  assert.ok(j.rounds.length === 2 && j.rounds.every((r) => r.finished));
  assert.ok(j.reports.some((r) => r.device === "tab-m" && r.round === 2 && r.accepted === 1), JSON.stringify(j.reports));
});
