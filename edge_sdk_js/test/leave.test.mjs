// DeviceClient.stop(), pause() and resume() (docs/js-device.md, "Stop and pause") through a real
// orchestrator with in-process onnxruntime-node devices: a device that pauses after its first round
// says goodbye, is gone from the server until it resumes, then is selected again and trains the next
// rounds; a device that stops after its first round ends its run() with that round's report while the
// server goes on; a device refused for its declared data gets the server's one-line reason.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import WebSocket from "ws";
import { DeviceClient, DeviceRefused, loadRuntime, tensor } from "../dist/index.js";
import { loadShard } from "../dist/shard.js";
import { journal, startServer, tempDir, writeShards } from "./fleet.mjs";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function device(url, deviceId, data, onEvent, extra = {}) {
  return new DeviceClient({ server: url, deviceId, budgetBytes: 1 << 30, runtime: await loadRuntime("node"), data, onEvent,
    webSocket: (u, maxPayload) => new WebSocket(u, { maxPayload, perMessageDeflate: false }), ...extra });
}

test("pause leaves between rounds and comes back; stop ends the run with the rounds made", { timeout: 300_000 }, async () => {
  const dir = tempDir("edgetrain-js-leave-");
  const shards = writeShards(dir, [0, 1], 2);
  const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--rounds", "3", "--min-devices", "2",
    "--local-steps", "3", "--deadline", "120", "--straggler-policy", "deadline"]);
  try {
    const events = { pauser: [], stopper: [] };
    let pauser = null;
    let stopper = null;
    // Each leaves once its first round is acknowledged: the pauser for a while, the stopper for good.
    const log = (name) => (kind, d) => {
      events[name].push({ kind, ...d });
      if (kind === "round_done" && d.round === 1) (name === "pauser" ? pauser.pause() : stopper.stop());
    };
    pauser = await device(url, "pauser", loadShard(shards[0]), log("pauser"));
    stopper = await device(url, "stopper", loadShard(shards[1]), log("stopper"));
    const pauserEvents = events.pauser;
    const runs = [pauser.run(), stopper.run()];
    while (!pauserEvents.some((e) => e.kind === "paused")) await sleep(100);
    assert.equal(pauser.paused, true);
    await sleep(2000);
    const serverLog = readFileSync(join(dir, "server.log"), "utf8");
    assert.match(serverLog, /"event": "disconnected", "device": "pauser"/, "a paused device has left the server");
    pauser.resume();
    const [stopped, reports] = await Promise.all([runs[1], runs[0]]);
    assert.deepEqual(stopped.map((r) => r.round), [1], "stop() ends run() with the rounds made");
    assert.deepEqual(events.stopper.filter((e) => ["stopping", "stopped"].includes(e.kind)).map((e) => e.kind), ["stopping", "stopped"]);
    assert.deepEqual(reports.map((r) => [r.round, r.accepted]), [[1, true], [2, true], [3, true]],
      "the paused device came back and trained every later round");
    assert.ok(pauserEvents.findIndex((e) => e.kind === "resumed") < pauserEvents.findIndex((e) => e.round === 2 && e.kind === "round_done"));
    assert.equal(await server.done, 0);
    const j = journal(dir);
    assert.deepEqual(j.reports.filter((r) => r.device === "stopper").map((r) => r.round), [1]);
  } finally {
    if (server.exitCode === null) server.kill();
  }
});

test("a hello declares the data's shape and classes: other data is refused with the server's reason", { timeout: 120_000 }, async () => {
  const dir = tempDir("edgetrain-js-declare-");
  const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--rounds", "1", "--min-devices", "1"]);
  try {
    const n = 8;
    const wrongShape = { x: tensor("float32", [n, 10], new Float32Array(n * 10)), y: tensor("int64", [n], new BigInt64Array(n)) };
    const tooManyClasses = { x: tensor("float32", [n, 64], new Float32Array(n * 64)), y: tensor("int64", [n], new BigInt64Array(n)) };
    const outcomes = await Promise.allSettled([
      (await device(url, "csv-10", wrongShape, () => {}, { reconnect: false })).run(),
      (await device(url, "images-12", tooManyClasses, () => {}, { reconnect: false, numClasses: 12 })).run(),
    ]);
    for (const o of outcomes) assert.equal(o.status, "rejected");
    assert.ok(outcomes[0].reason instanceof DeviceRefused);
    assert.match(outcomes[0].reason.message, /^refused: model digits_mlp takes samples of shape \(64,\) and 10 classes, but this device's data has samples of shape \(10,\)/);
    assert.match(outcomes[1].reason.message, /labels 0\.\.11/);
  } finally {
    server.kill();
  }
});
