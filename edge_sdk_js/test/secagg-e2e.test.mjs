// A JavaScript device takes part in secure aggregation: a real orchestrator (`serve
// --secure-aggregation --require-credentials`), three Python devices and one Node device (its
// onnxruntime-node backend, on a weak budget: it trains the last blocks only, so the block cohorts
// are nested), each with its enrolled credential file, train digits_mlp for two rounds. From the
// store's journal: every round finished, every block of every round revealed (the Node device's
// masks cancelled against the Python devices', its self mask removed with the shares it revealed;
// three strong devices, so every block has the round's t = 3 trainers), four masked uploads a round, and the Node device's report accepted in each. A second run holds the
// server to blindness with a JavaScript device's bytes: the test knows what the server process does not,
// the Node device's quantized update (its encodings, recorded as it makes them), and sees every frame
// it sends: none carries the quantized words, the masked words it uploads are in them, and the masked
// words do not correlate with the quantized ones. In `make test-slow`.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import WebSocket from "ws";
import { DeviceClient, loadRuntime } from "../dist/index.js";
import { BlockEncoder } from "../dist/secagg/fixedpoint.js";
import { DeviceRound } from "../dist/secagg/round.js";
import { loadShard } from "../dist/shard.js";
import { python } from "./cases.mjs";
import { enroll, journal, nodeDevice, start, startServer, tempDir, writeShards } from "./fleet.mjs";

const ROUNDS = 2;
const DEVICES = ["py-0", "py-1", "node-2", "py-3"];
const PYTHON_DEVICES = [[0, "py-0"], [1, "py-1"], [3, "py-3"]]; // strong: client index, id

// The 32-bit ring (int32 words), and a compressed round (8-bit values, the words packed at the ring's
// bits: docs/security.md, "Compressed secure uploads"), where the server unpacks the Node device's words.
for (const [what, extra] of [["", []], [" (compressed: 8-bit values, packed words)", ["--secure-value-bits", "8"]]]) {
test(`a Node device takes part in secure rounds beside Python devices${what}: every block revealed, its reports accepted`,
  { timeout: 900_000 }, async () => {
    const dir = tempDir("edgetrain-secagg-js-");
    const secrets = Object.fromEntries(DEVICES.map((id) => [id, enroll(dir, id)]));
    const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--rounds", String(ROUNDS), "--min-devices", "4",
      "--local-steps", "5", "--lr", "0.1", "--deadline", "300", "--straggler-policy", "deadline", "--require-credentials",
      "--secure-aggregation", "--secure-clip", "20", ...extra]);
    const shards = writeShards(dir, [2], 4);
    const procs = [];
    try {
      for (const [c, id] of PYTHON_DEVICES) {
        procs.push(start(dir, id, python(), ["-m", "edge_sdk", "--server", url, "--id", id, "--budget", "2GiB", "--data", "digits",
          "--client", String(c), "--num-clients", "4", "--secret-file", secrets[id], "--json-events", "--once"]));
      }
      procs.push(nodeDevice(dir, url, "node-2", "195MiB", shards[2], "node", ["--secret-file", secrets["node-2"]]));
      const codes = await Promise.all(procs.map((p) => p.done));
      assert.deepEqual(codes, [0, 0, 0, 0], `device exit codes (logs in ${dir})`);
      assert.equal(await server.done, 0, `the server's exit code (logs in ${dir})`);
    } finally {
      for (const p of [server, ...procs]) if (p.exitCode === null) p.kill();
    }
    const j = journal(dir);
    assert.equal(j.rounds.length, ROUNDS);
    assert.ok(j.devices["node-2"].split > 0 && j.devices["py-0"].split === 0, `nested cohorts: ${JSON.stringify(j.devices)}`);
    for (const r of j.rounds) {
      assert.ok(r.finished, `round ${r.round} finished (logs in ${dir})`);
      const secure = r.metrics.secure;
      assert.equal(secure.masked, DEVICES.length, `round ${r.round}: four masked uploads`);
      const blocks = Object.values(secure.blocks);
      assert.ok(blocks.length > 0 && blocks.every((b) => b.revealed), `round ${r.round}: every block revealed: ${JSON.stringify(secure)}`);
      assert.equal(Math.max(...blocks.map((b) => b.cohort)), DEVICES.length, "the Node device's blocks summed with the Python devices'");
    }
    const mine = j.reports.filter((r) => r.device === "node-2" && r.phase === "train");
    assert.deepEqual(mine.map((r) => [r.round, r.accepted]), Array.from({ length: ROUNDS }, (_, r) => [r + 1, 1]));
    const reveals = readFileSync(join(dir, "node-2.log"), "utf8").split("\n").filter((l) => l.includes('"secure_reveal"'))
      .map((l) => JSON.parse(l));
    assert.deepEqual(reveals.map((e) => [e.round, e.survivors, e.dropped]), Array.from({ length: ROUNDS }, (_, r) => [r + 1, DEVICES.length, 0]),
      "the Node device answered each round's unmasking request");
    // 10 classes: chance is 0.1 (two rounds of five steps, the updates clipped to 20 and quantized).
    assert.ok(j.rounds.at(-1).metrics.accuracy > 0.2, `accuracy after ${ROUNDS} rounds: ${j.rounds.at(-1).metrics.accuracy}`);
  });
}

/** The ring word `w` of `bits` as a signed integer (the centred lift). */
function lift(w, bits) {
  return w >= 2 ** (bits - 1) ? w - 2 ** bits : w;
}

function correlation(a, b) {
  const n = a.length;
  const ma = a.reduce((x, y) => x + y, 0) / n, mb = b.reduce((x, y) => x + y, 0) / n;
  let sab = 0, saa = 0, sbb = 0;
  for (let i = 0; i < n; i++) {
    sab += (a[i] - ma) * (b[i] - mb); saa += (a[i] - ma) ** 2; sbb += (b[i] - mb) ** 2;
  }
  return sab / Math.sqrt(saa * sbb);
}

/** Whether `needle` occurs in `hay` (both Uint8Array). */
function contains(hay, needle) {
  outer: for (let i = 0; i + needle.length <= hay.length; i++) {
    for (let j = 0; j < needle.length; j++) if (hay[i + j] !== needle[j]) continue outer;
    return true;
  }
  return false;
}

/** 64-byte windows of `words` (little-endian, as they travel) at `count` offsets spread over it. */
function windows(words, count = 8) {
  const bytes = new Uint8Array(words.buffer, words.byteOffset, words.byteLength);
  const step = Math.max(4, Math.floor((bytes.length - 64) / count / 4) * 4);
  const out = [];
  for (let at = 0; at + 64 <= bytes.length && out.length < count; at += step) out.push(bytes.slice(at, at + 64));
  return out;
}

test("blind to a Node device's bytes: no frame it sends carries its quantized update or correlates with it",
  { timeout: 900_000 }, async () => {
    const dir = tempDir("edgetrain-secagg-blind-");
    const ids = ["py-0", "py-1", "node-in", "py-3"];
    const secrets = Object.fromEntries(ids.map((id) => [id, enroll(dir, id)]));
    const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--rounds", "1", "--min-devices", "4",
      "--local-steps", "5", "--lr", "0.1", "--deadline", "300", "--straggler-policy", "deadline", "--require-credentials",
      "--secure-aggregation", "--secure-clip", "20"]);
    const shards = writeShards(dir, [2], 4);
    // What the device encodes and masks, recorded as it does (the server process never sees it).
    const encodings = [], masked = [];
    // The device encodes a block a slice at a time (BlockEncoder): its words are the slices', then the weight word.
    const [values, weightWord, mask] = [BlockEncoder.prototype.values, BlockEncoder.prototype.weightWord, DeviceRound.prototype.mask];
    const pieces = new Map();
    BlockEncoder.prototype.values = async function (...args) {
      const words = await values.apply(this, args);
      pieces.set(this, [...(pieces.get(this) ?? []), Uint32Array.from(words)]);
      return words;
    };
    BlockEncoder.prototype.weightWord = async function (...args) {
      const word = await weightWord.apply(this, args);
      const all = [...(pieces.get(this) ?? []), word];
      const words = new Uint32Array(all.reduce((n, p) => n + p.length, 0));
      all.reduce((at, p) => (words.set(p, at), at + p.length), 0);
      encodings.push({ words, bits: this.fixed.ringBits });
      pieces.delete(this);
      return word;
    };
    DeviceRound.prototype.mask = async function (...args) {
      const out = await mask.apply(this, args);
      masked.push(...out.map((w) => Uint32Array.from(w)));
      return out;
    };
    const sent = [];
    const procs = [];
    try {
      for (const [c, id] of PYTHON_DEVICES) {
        procs.push(start(dir, id, python(), ["-m", "edge_sdk", "--server", url, "--id", id, "--budget", "2GiB", "--data", "digits",
          "--client", String(c), "--num-clients", "4", "--secret-file", secrets[id], "--json-events", "--once"]));
      }
      const client = new DeviceClient({
        server: url, deviceId: "node-in", budgetBytes: 400 * 2 ** 20, runtime: await loadRuntime("node"), data: loadShard(shards[2]),
        secret: readFileSync(secrets["node-in"], "utf8").trim(), maxRetries: 3,
        webSocket: (u, maxPayload, headers) => {
          const ws = new WebSocket(u, { maxPayload, perMessageDeflate: false, headers });
          const send = ws.send.bind(ws);
          ws.send = (data, ...rest) => { sent.push(new Uint8Array(typeof data === "string" ? Buffer.from(data) : data)); return send(data, ...rest); };
          return ws;
        },
      });
      const reports = await client.run();
      assert.equal(reports.length, 1, "the Node device reported its round");
      assert.deepEqual(await Promise.all(procs.map((p) => p.done)), [0, 0, 0], `device exit codes (logs in ${dir})`);
      assert.equal(await server.done, 0, `the server's exit code (logs in ${dir})`);
    } finally {
      Object.assign(BlockEncoder.prototype, { values, weightWord });
      DeviceRound.prototype.mask = mask;
      for (const p of [server, ...procs]) if (p.exitCode === null) p.kill();
    }
    const r = journal(dir).rounds[0];
    assert.ok(r.finished && Object.values(r.metrics.secure.blocks).every((b) => b.revealed), `every block revealed: ${JSON.stringify(r.metrics.secure)}`);
    assert.equal(r.metrics.secure.masked, 4);
    assert.ok(encodings.length > 0 && encodings.length === masked.length, `one encoding per masked block: ${encodings.length}, ${masked.length}`);
    for (const [i, { words, bits }] of encodings.entries()) {
      const n = words.length;
      // The recorder sees the upload: the masked words travel in the frames the device sent.
      assert.ok(windows(masked[i]).some((w) => sent.some((f) => contains(f, w))), `block ${i}'s masked words are in the frames sent`);
      // No frame carries the quantized words (nor any 64-byte run of them).
      for (const w of windows(words)) assert.ok(!sent.some((f) => contains(f, w)), `block ${i}: a run of its quantized words was sent`);
      const plain = Array.from(words, (x) => lift(x, bits)), hidden = Array.from(masked[i], (x) => lift(x, bits));
      const rho = correlation(plain, hidden);
      console.log(`# block ${i}: ${n} words of ${bits} bits, correlation of the masked with the quantized ${rho.toFixed(4)}`);
      assert.ok(Math.abs(rho) < 5 / Math.sqrt(n), `block ${i}: masked words correlate with the quantized ones (${rho}, ${n} words)`);
    }
  });
