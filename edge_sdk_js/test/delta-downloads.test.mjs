// Delta downloads (docs/protocol.md, "Delta downloads"): the JavaScript device rebuilds, from the Python
// server's delta payloads and the same bases, the same bytes (tests/vectors/delta.json, written by
// tests/vectors/make_delta_vectors.py) and refuses a delta that does not fit its base. The run against
// a real server is in wire-codecs.test.mjs (the slow tier).
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { DEFAULT_LIMITS, ProtocolError, applyDelta } from "../dist/index.js";
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

test("a delta rebuilt in place writes the same bytes over its base, a view inside a larger buffer", () => {
  const cases = VECTORS.cases.filter((v) => v.base !== null);
  assert.ok(cases.length >= 1);
  for (const c of cases) {
    const held = bytes(c.base);
    const room = new Uint8Array(8 + held.length + 24);
    room.set(held, 8);
    const base = room.subarray(8, 8 + held.length);
    const out = applyDelta(bytes(c.delta), base, DEFAULT_LIMITS, true);
    assert.equal(out.buffer, room.buffer, "rebuilt in the base's own bytes, no second payload");
    assert.equal(out.byteOffset, 8);
    assert.equal(sha(out), c.rebuilt_sha256, `${c.payload} ${c.bits} bits in place`);
    assert.deepEqual([...room.subarray(0, 8), ...room.subarray(8 + held.length)], new Array(32).fill(0), "nothing written outside the base");
  }
  // Not asked to: the base is left as it was (a store that hands out what it keeps).
  const c = cases[0], base = bytes(c.base);
  applyDelta(bytes(c.delta), base, DEFAULT_LIMITS);
  assert.deepEqual(base, bytes(c.base));
});
