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
