// Delta downloads (docs/protocol.md, "Delta downloads"): the JavaScript device rebuilds, from the Python
// server's delta payloads and the same bases, the same bytes (tests/vectors/delta.json, written by
// tests/vectors/make_delta_vectors.py), refuses a delta that does not fit its base, and in a real run
// a Node device is sent each changed chunk and tail as a 4-bit difference from the version it holds.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { DEFAULT_LIMITS, ProtocolError, applyDelta } from "../dist/index.js";
import { nodeDevice, startServer, tempDir, writeShards } from "./fleet.mjs";
import { REPO } from "./cases.mjs";

const VECTORS = JSON.parse(readFileSync(join(REPO, "tests", "vectors", "delta.json"), "utf8"));
const bytes = (b64) => new Uint8Array(Buffer.from(b64, "base64"));
const sha = (data) => createHash("sha256").update(data).digest("hex");

test("every Python delta rebuilds the Python SDK's bytes, whole and against a base", () => {
  assert.equal(VECTORS.cases.length, 12);
  for (const c of VECTORS.cases) {
    const base = c.base === null ? undefined : bytes(c.base);
    const out = applyDelta(bytes(c.delta), base, DEFAULT_LIMITS);
    assert.equal(sha(out), c.rebuilt_sha256, `${c.payload} ${c.bits} bits ${base ? "on a base" : "whole"}`);
  }
});

test("a delta applied to a base of another size, or cut short, is a protocol error", () => {
  const c = VECTORS.cases.find((v) => v.base !== null);
  const base = bytes(c.base);
  assert.throws(() => applyDelta(bytes(c.delta), base.subarray(0, base.length - 8), DEFAULT_LIMITS), ProtocolError);
  const delta = bytes(c.delta);
  assert.throws(() => applyDelta(delta.subarray(0, delta.length >> 1), base, DEFAULT_LIMITS), ProtocolError);
});

function events(dir, id) {
  return readFileSync(join(dir, `${id}.log`), "utf8").trim().split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
}

test("a Node device is sent deltas from the version it holds in a real run", { timeout: 300_000 }, async () => {
  const dir = tempDir("edgetrain-js-delta-");
  const shards = writeShards(dir, [0], 2);
  const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--rounds", "3", "--min-devices", "1",
    "--local-steps", "2", "--deadline", "90", "--download-delta", "int4"]);
  const device = nodeDevice(dir, url, "node-delta", "185MiB", shards[0], "node", ["--payload-cache", join(dir, "held")]);
  try {
    assert.equal(await device.done, 0, `device log in ${dir}`);
    assert.equal(await server.done, 0);
  } finally {
    for (const p of [server, device]) if (p.exitCode === null) p.kill();
  }
  const applied = events(dir, "node-delta").filter((e) => e.event === "delta_applied");
  const tails = applied.filter((e) => e.kind === "model");
  assert.deepEqual(tails.map((e) => [e.round, e.base]), [[1, false], [2, true], [3, true]]);
  for (const e of applied) assert.ok(e.bytes < e.rebuilt / 7, `${e.kind} round ${e.round}: ${e.bytes} of ${e.rebuilt} bytes`);
  const done = events(dir, "node-delta").filter((e) => e.event === "round_done");
  assert.deepEqual(done.map((e) => [e.round, e.accepted]), [[1, true], [2, true], [3, true]]);
});
