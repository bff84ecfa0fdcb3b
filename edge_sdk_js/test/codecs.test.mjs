// Transfer codecs: the JavaScript codecs read every record of tests/vectors/codecs.json (written by the
// Python SDK) to the same float32 values, write the same bytes for the same input and seed, and, for
// the deflate codecs (whose bytes differ between zlib and fflate), the Python SDK reads this SDK's records.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { codecs } from "../dist/index.js";
import { REPO, python, pythonEnv } from "./cases.mjs";

const VECTORS = JSON.parse(readFileSync(join(REPO, "tests", "vectors", "codecs.json"), "utf8"));
const ARRAYS = { float32: Float32Array, float64: Float64Array, int64: BigInt64Array, int32: Int32Array,
  float16: Uint16Array, uint8: Uint8Array, bool: Uint8Array };

function bytes(b64) {
  return new Uint8Array(Buffer.from(b64, "base64"));
}

function tensorOf({ dtype, shape, data }) {
  const raw = bytes(data);
  return { dtype, shape, data: new ARRAYS[dtype](raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength)) };
}

function rawOf(t) {
  return Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
}

const DEFLATE = new Set(["zlib", "shuffle"]);

test("every float32 record's values read one at a time are decode's, bit for bit (a grid's from its packed codes)", () => {
  let streamed = 0;
  for (const c of VECTORS.cases.filter((v) => v.decoded.dtype === "float32")) {
    const record = bytes(c.record), want = codecs.decode(record).data;
    const got = codecs.float32Values(record);
    assert.equal(got.length, want.length);
    const values = Float32Array.from({ length: got.length }, (_, i) => got.at(i));
    assert.ok(Buffer.from(values.buffer).equals(rawOf({ data: want })), `${c.codec} ${JSON.stringify(c.params)} ${c.input}`);
    if (record[3] === 5 && !("scale" in (c.params ?? {}))) streamed++;
  }
  assert.ok(streamed >= 3, `${streamed} per-block grid records read from their codes`);
});


test("every Python record decodes to the same values, shape and dtype", () => {
  for (const c of VECTORS.cases) {
    const got = codecs.decode(bytes(c.record));
    const want = tensorOf(c.decoded);
    const where = `${c.codec} ${JSON.stringify(c.params)} ${c.input} seed ${c.seed}`;
    assert.equal(got.dtype, want.dtype, where);
    assert.deepEqual(got.shape, want.shape, where);
    assert.ok(rawOf(got).equals(rawOf(want)), `${where}: decoded values differ`);
  }
});

test("the same input and seed give the same record bytes (all but the deflate codecs)", () => {
  let checked = 0;
  for (const c of VECTORS.cases.filter((c) => !DEFLATE.has(c.codec))) {
    const record = codecs.codec(c.codec, c.params).encode(tensorOf(VECTORS.inputs[c.input]), { seed: BigInt(c.seed) });
    assert.ok(Buffer.from(record).equals(Buffer.from(bytes(c.record))), `${c.codec} ${JSON.stringify(c.params)} ${c.input} seed ${c.seed}`);
    checked++;
  }
  assert.ok(checked > 60, `only ${checked} cases`);
});

test("deflate records round-trip here and decode in the Python SDK", () => {
  const mine = [];
  for (const c of VECTORS.cases.filter((c) => DEFLATE.has(c.codec))) {
    const input = tensorOf(VECTORS.inputs[c.input]);
    const record = codecs.codec(c.codec, c.params).encode(input);
    const back = codecs.decode(record);
    assert.deepEqual(back.shape, input.shape);
    assert.ok(rawOf(back).equals(rawOf(input)), `${c.codec} ${c.input} does not round-trip`);
    mine.push({ record: Buffer.from(record).toString("base64"), input: VECTORS.inputs[c.input] });
  }
  const script = [
    "import base64, json, sys, numpy as np",
    "from edge_sdk.codecs import decode",
    "for case in json.load(sys.stdin):",
    "    got = decode(base64.b64decode(case['record']))",
    "    want = case['input']",
    "    assert str(got.dtype) == want['dtype'] and list(got.shape) == want['shape'], case",
    "    assert got.tobytes() == base64.b64decode(want['data'])",
    "print('ok')",
  ].join("\n");
  const out = execFileSync(python(), ["-c", script], { env: pythonEnv(), input: JSON.stringify(mine) }).toString().trim();
  assert.equal(out, "ok");
});

test("EDEN records of many segments, a segment at a time, are the Python SDK's bytes and values", () => {
  // Sizes that cross the Python codec's slices (2^16 coordinates) and segments under 8 coordinates,
  // whose codes do not start on a byte: both SDKs walk the segments in pieces and must agree.
  const cases = [[70001, 16], [3 * 65536 + 5, 65536], [1001, 4], [13, 1], [77, 2]].flatMap(([n, segment]) =>
    [1, 2, 3, 4].map((bits) => ({ n, segment, bits, seed: n * 31 + bits })));
  const script = [
    "import base64, json, sys, numpy as np",
    "from edge_sdk.codecs import codec, decode",
    "out = []",
    "for c in json.load(sys.stdin):",
    "    x = (np.sin(np.arange(c['n'], dtype=np.float64) * 0.37) * 3).astype(np.float32)",
    "    record = codec(f\"eden{c['bits']}\", segment=c['segment']).encode(x, seed=c['seed'])",
    "    out.append({'input': base64.b64encode(x.tobytes()).decode(), 'record': base64.b64encode(record).decode(),",
    "                'decoded': base64.b64encode(decode(record).tobytes()).decode()})",
    "print(json.dumps(out))",
  ].join("\n");
  const want = JSON.parse(execFileSync(python(), ["-c", script], { env: pythonEnv(), input: JSON.stringify(cases),
    maxBuffer: 1 << 28 }).toString());
  cases.forEach((c, i) => {
    const raw = bytes(want[i].input), x = new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength));
    const record = codecs.codec(`eden${c.bits}`, { segment: c.segment }).encode({ dtype: "float32", shape: [c.n], data: x },
      { seed: BigInt(c.seed) });
    assert.ok(Buffer.from(record).equals(bytes(want[i].record)), `eden${c.bits} n ${c.n} segment ${c.segment}: record`);
    assert.ok(rawOf(codecs.decode(record)).equals(bytes(want[i].decoded)), `eden${c.bits} n ${c.n}: decoded`);
  });
});

test("bad records are refused with a CodecError before anything large is allocated", () => {
  const good = codecs.CODECS.sr8.encode({ dtype: "float32", shape: [300], data: new Float32Array(300).map((_, i) => i / 7) }, { seed: 1n });
  const bad = [
    good.subarray(0, 5), // shorter than the fixed header
    good.subarray(0, good.length - 1), // truncated codes
    Uint8Array.from([...good, 0]), // a trailing byte
    Uint8Array.from(good, (b, i) => (i === 0 ? 0x46 : b)), // not "EC"
    Uint8Array.from(good, (b, i) => (i === 3 ? 99 : b)), // unknown codec id
  ];
  const huge = good.slice();
  new DataView(huge.buffer).setBigUint64(8, 1n << 40n, true); // a shape of 2^40 floats
  bad.push(huge);
  const deflated = codecs.CODECS.zlib.encode({ dtype: "uint8", shape: [1000], data: new Uint8Array(1000) });
  const adler = deflated.slice();
  adler[adler.length - 1] ^= 1;
  bad.push(adler, Uint8Array.from([...deflated, 1]));
  for (const record of bad) assert.throws(() => codecs.decode(record), codecs.CodecError);
});

test("error feedback sends what earlier rounds' compression left out", () => {
  const ef = new codecs.ErrorFeedback();
  const delta = { dtype: "float32", shape: [512], data: Float32Array.from({ length: 512 }, (_, i) => Math.sin(i) * 1e-3) };
  const sent = new Float64Array(512);
  for (let round = 0; round < 20; round++) {
    const back = codecs.decode(ef.encode("w", delta, codecs.CODECS.eden1, { seed: round })).data;
    for (let i = 0; i < 512; i++) sent[i] += back[i];
  }
  // sum of what was sent = 20 delta - the last residual: the residual stays bounded, so the mean converges.
  const residual = ef.residuals.get("w");
  for (let i = 0; i < 512; i++) assert.ok(Math.abs(sent[i] + residual[i] - 20 * delta.data[i]) < 1e-5);
  let err = 0, norm = 0;
  for (let i = 0; i < 512; i++) { err += (sent[i] / 20 - delta.data[i]) ** 2; norm += delta.data[i] ** 2; }
  assert.ok(Math.sqrt(err / norm) < 0.1, `mean of 20 rounds off by ${Math.sqrt(err / norm)}`);
});
