// Bytes on the wire from a Node device (docs/protocol.md, "Held payloads", "Codecs on the wire"): a
// device that keeps its payloads by sha256 (--payload-cache) is sent no byte of a payload it holds,
// and the server's journal says which payloads came from the device's own store; every update codec
// a Node device encodes is decoded by the server's intake (edge_sdk.wire_codecs) to the numbers the
// device meant; downloads and updates travel encoded in a real run.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { DEFAULT_LIMITS, UpdateEncoder, codecs, decodeState } from "../dist/index.js";
import { nodeDevice, startServer, tempDir, writeShards } from "./fleet.mjs";
import { HERE, python, pythonEnv } from "./cases.mjs";

/** The server journal's payload movements (orchestrator.store.Store.transfers). */
function transfers(dir) {
  const code = "import json, sys\nfrom orchestrator.store import Store\n"
    + "with Store.open_readonly(sys.argv[1]) as s: print(json.dumps(s.transfers.all()))";
  return JSON.parse(execFileSync(python(), ["-c", code, join(dir, "store")], { env: pythonEnv(), cwd: join(HERE, "..", "..") }).toString());
}

function events(dir, id) {
  return readFileSync(join(dir, `${id}.log`), "utf8").trim().split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
}

// Held payloads and delta downloads (docs/protocol.md, "Held payloads", "Delta downloads") in one run of three
// rounds: the held chunks and graph cost no byte from round 2, and each changed tail comes as a 4-bit difference
// from the version the device holds (int4, the default, named here).
test("a Node device is sent no byte of the chunks and training graph it holds, and deltas from the version it holds",
  { timeout: 300_000 }, async () => {
  const dir = tempDir("edgetrain-js-held-");
  const shards = writeShards(dir, [0], 2);
  const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--rounds", "3", "--min-devices", "1",
    "--local-steps", "2", "--deadline", "90", "--download-delta", "int4", "--no-direction-trust"]);
  // One device: direction trust could leave a block as it was (a report trusted 0), and then its
  // payload would be held too; off here, every block this device trains changes every round.
  // weak: the frozen chunk is never trained, so its bytes stay the same while its id follows the version
  const device = nodeDevice(dir, url, "node-held", "185MiB", shards[0], "node", ["--payload-cache", join(dir, "held")]);
  try {
    assert.equal(await device.done, 0, `device log in ${dir}`);
    assert.equal(await server.done, 0);
  } finally {
    for (const p of [server, device]) if (p.exitCode === null) p.kill();
  }
  const used = events(dir, "node-held").filter((e) => e.event === "from_store").map((e) => `${e.round}:${e.kind}`);
  assert.deepEqual([...new Set(used)].filter((u) => !u.startsWith("3:")).sort(), ["2:chunk", "2:train_graph"]);
  const rows = transfers(dir);
  const held = (round) => rows.filter((r) => r.round === round && (r.kind === "chunk" || r.kind === "train_graph"));
  assert.ok(held(1).length >= 2 && held(1).every((r) => r.bytes > 0 && !r.from_device_store));
  assert.deepEqual(held(2).map((r) => [r.kind, r.bytes, r.held, r.from_device_store]),
    held(1).map((r) => [r.kind, 0, r.bytes, true]), "every chunk and the graph: 0 bytes, all from the device's store");
  assert.ok(rows.some((r) => r.round === 2 && r.kind === "model" && r.bytes > 0), "the tail's new weights are sent");
  assert.ok(readdirSync(join(dir, "held")).some((n) => /^[0-9a-f]{64}$/.test(n)), "the payloads are kept by sha256");
  // Delta downloads: the first tail whole (quantized), each later one a difference from the version held.
  const applied = events(dir, "node-held").filter((e) => e.event === "delta_applied");
  const tails = applied.filter((e) => e.kind === "model");
  assert.deepEqual(tails.map((e) => [e.round, e.base]), [[1, false], [2, true], [3, true]]);
  for (const e of applied) assert.ok(e.bytes < e.rebuilt / 7, `${e.kind} round ${e.round}: ${e.bytes} of ${e.rebuilt} bytes`);
  const done = events(dir, "node-held").filter((e) => e.event === "round_done");
  assert.deepEqual(done.map((e) => [e.round, e.accepted]), [[1, true], [2, true], [3, true]]);
});

/** Every codec of the registry an update may travel through besides none. */
const UPDATE_CODECS = Object.keys(codecs.CODECS).filter((name) => name !== "none");

test("every update codec a Node device encodes decodes in the server's intake to the device's own numbers", () => {
  const shape = [37, 11];
  const data = Float32Array.from({ length: 37 * 11 }, (_, i) => Math.sin(i * 0.7) * 0.01);
  const cases = UPDATE_CODECS.map((name) => {
    const config = { update_codec: name, update_feedback: name === "float16" || name === "int8" };
    const payload = new UpdateEncoder().encode({ w: { dtype: "float32", shape, data }, n: { dtype: "int64", shape: [], data: BigInt64Array.of(5n) } }, config);
    const mine = decodeState(payload, DEFAULT_LIMITS);
    return { name, payload: Buffer.from(payload).toString("base64"), mine: Array.from(mine.w.data), lossless: codecs.CODECS[name].lossless };
  });
  const code = "import base64, json, sys\nimport numpy as np\nfrom edge_sdk.wire_codecs import decode_state\n"
    + "out = {}\nfor c in json.load(sys.stdin):\n    t = decode_state(base64.b64decode(c['payload']))\n"
    + "    out[c['name']] = [t['w'].astype(float).ravel().tolist(), list(t['w'].shape), int(t['n']), list(t['n'].shape)]\n"
    + "print(json.dumps(out))";
  const theirs = JSON.parse(execFileSync(python(), ["-c", code], { input: JSON.stringify(cases), env: pythonEnv(), cwd: join(HERE, "..", "..") }).toString());
  for (const c of cases) {
    const [values, s, n, nShape] = theirs[c.name];
    assert.deepEqual([s, n, nShape], [shape, 5, []], c.name);
    assert.deepEqual(values, c.mine, `${c.name}: the server decodes the numbers the device decodes`);
    const err = Math.max(...values.map((v, i) => Math.abs(v - data[i])));
    assert.ok(c.lossless ? err === 0 : err > 0 && err < 0.05, `${c.name}: error ${err}`);
  }
});

test("a Node device trains on encoded downloads and sends encoded updates in a real run", { timeout: 300_000 }, async () => {
  const dir = tempDir("edgetrain-js-codecs-");
  const shards = writeShards(dir, [0], 2);
  const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--rounds", "2", "--min-devices", "1",
    "--local-steps", "2", "--deadline", "90", "--chunk-codec", "shuffle", "--tail-codec", "int8", "--graph-codec", "zlib",
    "--update-codec", "eden2"]);
  const device = nodeDevice(dir, url, "node-codecs", "185MiB", shards[0], "node");
  try {
    assert.equal(await device.done, 0, `device log in ${dir}`);
    assert.equal(await server.done, 0);
  } finally {
    for (const p of [server, device]) if (p.exitCode === null) p.kill();
  }
  const done = events(dir, "node-codecs").filter((e) => e.event === "round_done");
  assert.deepEqual(done.map((e) => [e.round, e.accepted]), [[1, true], [2, true]]);
  const rows = transfers(dir);
  const tail = rows.find((r) => r.round === 1 && r.kind === "model").bytes;
  const update = rows.find((r) => r.round === 1 && r.kind === "update").bytes;
  assert.ok(tail < 0.3 * 82088, `an int8 tail: ${tail} bytes`); // 82,088 bytes in float32
  assert.ok(update < 0.15 * 82088, `a 2-bit update: ${update} bytes`); // 1/16 of float32, plus headers and scales
});
