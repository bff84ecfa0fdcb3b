// Credential proofs (format 2) are the Python device's, byte for byte (tests/vectors/proofs.json, written by
// tests/vectors/make_proof_vectors.py); a 401 on the websocket upgrade stops the Node device with one line and the
// Python device's exit status for a refusal (3), without a retry; and a browser page's ticket (fetchTicket, carried
// as ?ticket=) opens one upgrade of a real orchestrator, once (in a headless Chromium page: ticket-page.test.mjs).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import WebSocket from "ws";
import { DeviceRefused, fetchTicket, makeProof, proofMessage, withTicket } from "../dist/index.js";
import { doorRefusal } from "../dist/transport.js";
import { HERE, REPO } from "./cases.mjs";
import { startServer, tempDir, writeShards } from "./fleet.mjs";

const V = JSON.parse(readFileSync(join(REPO, "tests", "vectors", "proofs.json"), "utf8"));
const CLI = join(HERE, "..", "dist", "cli.js");
const TOKEN = "s3cret-token";

test("proofs: each vector's message and proof, as the Python SDK makes them", () => {
  assert.equal(V.scheme, "hmac2");
  assert.equal(V.proofs.length, 16);
  for (const v of V.proofs) {
    assert.equal(Buffer.from(proofMessage(v.purpose, v.device_id, v.seconds, v.nonce)).toString("hex"), v.message_hex, v.proof);
    assert.equal(makeProof(v.device_id, v.secret, v.purpose, v.seconds, v.nonce), v.proof);
  }
  assert.match(makeProof("dev", "s"), /^hmac2:hello:\d+:[0-9a-f]{32}:[0-9a-f]{64}$/, "a hello's proof by default");
  assert.throws(() => makeProof("dev", "s", "enrol"), /purpose is one of hello, upgrade, status, ticket/);
});

test("an upgrade answered 401 or 403 is a refusal; other statuses are failures to retry", () => {
  assert.ok(doorRefusal("Unexpected server response: 401: bad credentials in the Authorization header") instanceof DeviceRefused);
  assert.equal(doorRefusal("Unexpected server response: 401: bad credentials\n").message, "unauthorized: bad credentials");
  assert.equal(doorRefusal("Unexpected server response: 403").message, "forbidden: HTTP 403 on the websocket upgrade");
  for (const other of ["Unexpected server response: 503: full", "Unexpected server response: 429", "connect ECONNREFUSED", undefined]) {
    assert.equal(doorRefusal(other), null, String(other));
  }
  assert.equal(withTicket("wss://host:8765/", "a-b_c"), "wss://host:8765/?ticket=a-b_c");
  assert.equal(withTicket("ws://host:8765", null), "ws://host:8765");
});

/** The HTTP status of an opening handshake to `url` with no header (101: opened). */
function handshake(url) {
  return new Promise((resolve) => {
    const ws = new WebSocket(url, { perMessageDeflate: false });
    ws.on("unexpected-response", (_req, res) => { resolve(res.statusCode); res.resume(); ws.terminate(); });
    ws.on("open", () => { resolve(101); ws.terminate(); });
    ws.on("error", () => resolve(null));
  });
}

test("door: a wrong token stops the Node device at once (exit 3, one line); a ticket opens one upgrade", { timeout: 180_000 }, async () => {
  const dir = tempDir("edgetrain-js-proofs-");
  const shard = writeShards(dir, [0], 2)[0];
  const { server, url } = await startServer(dir, ["--web", "--token", TOKEN, "--model", "digits_mlp", "--rounds", "1",
    "--min-devices", "5"]); // it waits 120 s for devices that do not come: long enough
  const origin = url.replace("ws://", "http://");
  try {
    const started = Date.now();
    const out = spawnSync(process.execPath, [CLI, "--server", url, "--id", "d", "--budget", "300MiB", "--data", shard,
      "--token", "wrong", "--reconnect-max-delay", "0.2"], { encoding: "utf8", timeout: 60_000 });
    assert.equal(out.status, 3, out.stderr);
    assert.deepEqual(out.stderr.trim().split("\n").filter((l) => !l.startsWith("{")),
      ["error: the server refused this device: unauthorized: bad credentials in the Authorization header"]);
    assert.ok(!/reconnect/.test(out.stdout + out.stderr), "no retry");
    console.log(`# refused in ${Date.now() - started} ms`);

    const ticket = await fetchTicket(origin, "page-1", undefined, TOKEN);
    assert.match(ticket, /^[A-Za-z0-9_-]{20,}$/);
    assert.equal(await handshake(withTicket(url, ticket)), 101, "the ticket opens the upgrade");
    assert.equal(await handshake(withTicket(url, ticket)), 401, "once");
    assert.equal(await handshake(withTicket(url, "made-up")), 401);
    await assert.rejects(fetchTicket(origin, "page-1", undefined, "wrong"), (e) => e instanceof DeviceRefused && /unauthorized/.test(e.message));
  } finally {
    server.kill();
  }
});
