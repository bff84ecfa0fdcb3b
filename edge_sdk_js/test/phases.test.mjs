// Phases from a device's registry, through a real orchestrator on 127.0.0.1 with in-process
// onnxruntime-node devices: a phase and a report hook defined in this file (a label census, the
// server side of which is the strategy of tests/test_device_phase_registry.py) train two rounds
// with no change to the SDK; a device without the phase refuses it by name and the server goes on;
// FedALIGN's incentive check (src/algorithms/fedalign.ts) reports its verdict on evaluate and
// train reports.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import WebSocket from "ws";
import { DEFAULT_REGISTRY, DeviceClient, ProtocolError, loadRuntime, tensor } from "../dist/index.js";
import { loadShard } from "../dist/shard.js";
import { journal, startServer, tempDir, writeShards } from "./fleet.mjs";

const CENSUS = "label_census";
const CENSUS_STRATEGY = "tests.test_device_phase_registry:CensusThenTrain";

/** Count the local labels per class (at least the instruction's `classes`) and score the received model. */
async function labelCensus(ctx) {
  const labels = Array.from(ctx.y.data, Number);
  const counts = new Array(Math.max(Number(ctx.instruction.config["classes"]), ...labels.map((l) => l + 1))).fill(0);
  for (const label of labels) counts[label] += 1;
  ctx.notes["census_done"] = 1;
  return { metrics: { ...Object.fromEntries(counts.map((n, c) => [`count_${c}`, n])), ...await ctx.evaluate() } };
}

/** After train: whether this round's census ran on this device first (a round note). */
function censusNote(ctx, metrics) {
  metrics["after_census"] = Number(ctx.notes["census_done"] ?? 0);
}

const REGISTRY = DEFAULT_REGISTRY.extended({ phases: { [CENSUS]: labelCensus }, after: { train: censusNote } });

/** The rows of `data` whose label is `label`. */
function onlyLabel(data, label) {
  const rows = [...data.y.data.keys()].filter((i) => data.y.data[i] === label);
  const width = data.x.data.length / data.x.shape[0];
  const x = new Float32Array(rows.length * width);
  rows.forEach((r, i) => x.set(data.x.data.subarray(r * width, (r + 1) * width), i * width));
  return { x: tensor("float32", [rows.length, ...data.x.shape.slice(1)], x), y: tensor("int64", [rows.length], BigInt64Array.from(rows, () => label)) };
}

async function device(url, deviceId, data, extra = {}) {
  return new DeviceClient({ server: url, deviceId, budgetBytes: 1 << 30, runtime: await loadRuntime("node"), data,
    webSocket: (u, maxPayload) => new WebSocket(u, { maxPayload, perMessageDeflate: false }), ...extra });
}

/** Run the devices until the server ends its run; resolves their outcomes and the server's journal. */
async function untilDone(server, dir, runs) {
  try {
    const outcomes = await Promise.allSettled(runs);
    assert.equal(await server.done, 0, `the server's exit code (logs in ${dir})`);
    return [outcomes, journal(dir)];
  } finally {
    if (server.exitCode === null) server.kill();
  }
}

test("a phase and a hook of this file's own run two rounds on JavaScript devices", { timeout: 300_000 }, async () => {
  const dir = tempDir("edgetrain-js-phases-");
  const shards = writeShards(dir, [1, 2], 4);
  const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--strategy", CENSUS_STRATEGY, "--rounds", "2",
    "--min-devices", "2", "--local-steps", "3", "--deadline", "90"]);
  const mixed = loadShard(shards[1]);
  const ones = onlyLabel(loadShard(shards[2]), 1n); // one class only: the strategy asks it for no train
  const ext = { helloExt: { "census.classes": 10 }, registry: REGISTRY };
  const clients = [await device(url, "mixed-1", mixed, ext), await device(url, "ones-2", ones, ext)];
  const [outcomes, j] = await untilDone(server, dir, clients.map((c) => c.run()));
  assert.deepEqual(outcomes.map((o) => o.reason), [undefined, undefined]);
  assert.deepEqual(j.rounds.map((r) => r.finished), [true, true]);
  const [m, o] = clients.map((c) => c.reports);
  assert.deepEqual(m.map((r) => [r.round, r.phase]), [[1, CENSUS], [1, "train"], [2, CENSUS], [2, "train"]]);
  assert.deepEqual(o.map((r) => [r.round, r.phase]), [[1, CENSUS], [2, CENSUS]]);
  for (const [client, data] of [[clients[0], mixed], [clients[1], ones]]) {
    for (const r of client.reports.filter((r) => r.phase === CENSUS)) {
      // The handler's counts, over the classes the hello declared (the strategy sent them back):
      // the test's own count of each device's labels; and the device's own evaluation.
      for (let c = 0; c < 10; c++) assert.equal(r.metrics[`count_${c}`], data.y.data.filter((l) => l === BigInt(c)).length);
      assert.ok(Number.isFinite(r.metrics.loss) && r.accepted);
    }
  }
  for (const r of m.filter((r) => r.phase === "train")) {
    assert.equal(r.metrics.after_census, 1, "the hook saw the census's note of the round");
    assert.ok(r.accepted && r.metrics.steps === 3 && r.trained[1] > r.trained[0]);
  }
  assert.deepEqual(j.reports.filter((r) => r.device === "mixed-1").map((r) => r.phase).sort(), [CENSUS, CENSUS, "train", "train"]);
});

test("a device without the phase refuses it by name; the server goes on with the one that knows it", { timeout: 300_000 }, async () => {
  const dir = tempDir("edgetrain-js-phases-");
  const shards = writeShards(dir, [1, 2], 4);
  const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--strategy", CENSUS_STRATEGY, "--rounds", "1",
    "--min-devices", "2", "--local-steps", "2", "--deadline", "90"]);
  const events = [];
  const knows = await device(url, "knows-1", loadShard(shards[1]), { registry: REGISTRY });
  const plain = await device(url, "plain-2", loadShard(shards[2]), { onEvent: (kind, data) => events.push({ kind, ...data }) });
  const [outcomes, j] = await untilDone(server, dir, [knows.run(), plain.run()]);
  assert.equal(outcomes[0].status, "fulfilled", String(outcomes[0].reason));
  const refusal = outcomes[1].reason;
  assert.ok(refusal instanceof ProtocolError && refusal.code === "unexpected", String(refusal));
  assert.match(refusal.message, /does not know the phase 'label_census' \(it knows compare, evaluate, train\)/);
  assert.deepEqual(events.filter((e) => e.kind === "error").map((e) => e.code), ["unexpected"]);
  assert.match(readFileSync(join(dir, "server.log"), "utf8"), /label_census/, "the server logged the device's error");
  assert.deepEqual(j.rounds.map((r) => r.finished), [true]);
  assert.deepEqual(j.reports.filter((r) => r.device === "plain-2"), []);
  assert.deepEqual(knows.reports.map((r) => r.phase), [CENSUS, "train"]);
});

test("FedALIGN's incentive check: the verdict on evaluate and train reports of a JavaScript device", { timeout: 300_000 }, async () => {
  const dir = tempDir("edgetrain-js-fedalign-");
  const shards = writeShards(dir, [1, 2], 4);
  const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--strategy", "fedalign", "-O", "epsilon=100",
    "-O", "warmup=0", "--rounds", "1", "--min-devices", "2", "--local-steps", "2", "--deadline", "90"]);
  const events = [];
  const priority = await device(url, "prio-1", loadShard(shards[1]), { labels: { priority: "1" } });
  const helper = await device(url, "help-2", loadShard(shards[2]), { onEvent: (kind, data) => events.push({ kind, ...data }) });
  const [outcomes, j] = await untilDone(server, dir, [priority.run(), helper.run()]);
  assert.deepEqual(outcomes.map((o) => o.reason), [undefined, undefined]);
  assert.deepEqual(j.rounds.map((r) => r.finished), [true]);
  // The priority device is asked for no check; the other is, and is within epsilon = 100.
  assert.ok(priority.reports.every((r) => !("within_epsilon" in r.metrics)));
  assert.deepEqual(helper.reports.map((r) => [r.phase, r.metrics.within_epsilon, r.accepted]), [["evaluate", 1, true], ["train", 1, true]]);
  assert.deepEqual(events.filter((e) => e.kind === "incentive_check").map((e) => e.within_epsilon), [true]);
});
