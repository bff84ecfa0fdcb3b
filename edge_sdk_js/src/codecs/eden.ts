/**
 * `eden1`..`eden4` (edge_sdk/codecs/eden.py; EDEN, Vargaftik et al. 2022, Algorithm 1; DRIVE at 1 bit):
 * two randomized Hadamard transforms with SHAKE128 signs (D1 then D2), the nearest Lloyd-Max centroid of N(0, 1) per
 * coordinate, and the unbiased scale S = ||x||^2 / <Rx, q> per segment. Every step in the order and
 * precision of the Python codec, so records are the same bytes for the same seed.
 */
import type { Tensor } from "../tensors.js";
import type { Codec, EncodeOptions } from "./base.js";
import { packedSize } from "./bits.js";
import { rotate, treeSum, unrotate } from "./hadamard.js";
import { CodecError, type Header, checkFinite, concat, float32Input, packHeader, take, view } from "./record.js";
import { EDEN_LABEL, type Seed, newSeed, seedBig, seededBytes } from "./stream.js";

const HALF: Record<number, number[]> = {
  1: [0.7978845608028654],
  2: [0.4527800346364921, 1.510417608499096],
  3: [0.24509417894422147, 0.7560052812058766, 1.3439092785049995, 2.1519457045369856],
  4: [0.12839502985114698, 0.388048299490291, 0.6567591185324643, 0.9423404564869607,
    1.2562311973471791, 1.6180463860218819, 2.069017226531385, 2.7325895709951578],
};
/** Lloyd-Max centroids of N(0, 1), ascending, per bit width. */
export const CENTROIDS: Record<number, Float64Array> = Object.fromEntries(Object.entries(HALF).map(([b, h]) =>
  [b, Float64Array.from([...h.map((c) => -c).reverse(), ...h])]));
const THRESHOLDS: Record<number, Float64Array> = Object.fromEntries(Object.entries(CENTROIDS).map(([b, c]) =>
  [b, Float64Array.from(c.subarray(1).map((v, i) => (v + c[i]!) / 2))]));
/** The asymptotic normalized error of unbiased EDEN at b bits (EDEN Section 4). */
export const NMSE: Record<number, number> = { 1: 0.5707963267948963, 2: 0.13312116871518942, 3: 0.03578401849968207, 4: 0.00959214303599245 };
export const DEFAULT_SEGMENT = 1 << 16;
const PARAMS = 16; // u8 bits, 3 zero, u32 segment, u64 seed

interface Layout { whole: number; rest: number; padded: number; total: number; count: number }

function layout(n: number, segment: number): Layout {
  const whole = Math.floor(n / segment), rest = n - whole * segment;
  let padded = rest ? 1 : 0;
  while (padded < rest) padded *= 2;
  return { whole, rest, padded, total: whole * segment + padded, count: whole + (rest ? 1 : 0) };
}

/**
 * The signs of both passes, read a segment at a time from the packed stream: bits [0, total) are D1,
 * [total, 2 total) are D2. Only the stream (2 bits a coordinate) and one segment's signs are held.
 */
class SignStream {
  private readonly bytes: Uint8Array;
  constructor(seed: Seed, private readonly total: number) {
    this.bytes = seededBytes(EDEN_LABEL, seed, Math.ceil((2 * total) / 8));
  }

  /** The signs of padded coordinates [off, off + d) of both passes, into `sg` (each at least d long). */
  read(off: number, d: number, sg: [Float32Array, Float32Array]): void {
    for (const [pass, base] of [[0, off], [1, this.total + off]] as const) {
      const out = sg[pass];
      for (let i = 0; i < d; i++) out[i] = (this.bytes[(base + i) >>> 3]! >>> ((base + i) & 7)) & 1 ? -1 : 1;
    }
  }
}

/** Codes [0, d) packed into `out` from code `at` on (`out` zeroed): pack()'s bits, a segment at a time. */
function packAt(out: Uint8Array, at: number, codes: Uint8Array, d: number, bits: number): void {
  let bit = at * bits;
  for (let i = 0; i < d; i++, bit += bits) {
    const v = codes[i]!, byte = bit >>> 3, shift = bit & 7;
    out[byte]! |= (v << shift) & 0xff;
    if (shift + bits > 8) out[byte + 1]! |= v >>> (8 - shift);
  }
}

/** Codes [at, at + d) of a packed body into `codes`: unpack()'s bits, a segment at a time. */
function unpackAt(body: Uint8Array, at: number, d: number, bits: number, codes: Uint8Array): void {
  const mask = (1 << bits) - 1;
  let bit = at * bits;
  for (let i = 0; i < d; i++, bit += bits) {
    const byte = bit >>> 3, shift = bit & 7;
    let v = body[byte]! >>> shift;
    if (shift + bits > 8) v |= body[byte + 1]! << (8 - shift);
    codes[i] = v & mask;
  }
}

function checkSegment(segment: number): boolean {
  return Number.isInteger(segment) && segment >= 1 && segment <= 2 ** 24 && (segment & (segment - 1)) === 0;
}

/** Codes and the float32 scale of y[off, off + d) (rotated in place from x). */
function quantize(y: Float32Array, sg: [Float32Array, Float32Array], off: number, d: number, bits: number, codes: Uint8Array): number {
  const sq = new Float64Array(d);
  for (let i = 0; i < d; i++) sq[i] = y[off + i]! * y[off + i]!;
  const norm2 = treeSum(sq);
  rotate(y, sg[0], off, d);
  rotate(y, sg[1], off, d);
  const th = THRESHOLDS[bits]!, c = CENTROIDS[bits]!;
  const inv = Math.sqrt(d) / Math.sqrt(norm2 > 0 ? norm2 : 1);
  const prod = new Float64Array(d);
  for (let i = 0; i < d; i++) {
    const z = y[off + i]! * inv;
    let k = 0;
    while (k < th.length && th[k]! <= z) k++;
    codes[off + i] = k;
    prod[i] = y[off + i]! * c[k]!;
  }
  const dot = treeSum(prod);
  return norm2 > 0 && dot > 0 ? Math.fround(norm2 / dot) : 0;
}

export class EdenCodec implements Codec {
  readonly codecId = 6;
  readonly name: string;
  readonly lossless = false;
  readonly unbiased = true;
  readonly linear = false;

  constructor(readonly bits: number, readonly segment = DEFAULT_SEGMENT) {
    if (!(bits in CENTROIDS)) throw new RangeError(`eden bits are 1-4, got ${bits}`);
    if (!checkSegment(segment)) throw new RangeError(`eden segment is a power of two up to 2^24, got ${segment}`);
    this.name = `eden${bits}`;
  }

  /**
   * Segment by segment (Algorithm 1 works per vector): the workspace is one segment's coordinates,
   * signs and codes, beside the input, the record and the packed sign stream (edge_sdk/codecs/eden.py,
   * "Memory"). The same bytes as rotating every segment at once.
   */
  encode(t: Tensor, options: EncodeOptions = {}): Uint8Array {
    const x = float32Input(t, this.name);
    const seed = options.seed === undefined ? newSeed() : seedBig(options.seed);
    const L = layout(x.length, this.segment), width = L.whole ? this.segment : L.padded;
    const stream = new SignStream(seed, L.total);
    const y = new Float32Array(width), codes = new Uint8Array(width);
    const sg: [Float32Array, Float32Array] = [new Float32Array(width), new Float32Array(width)];
    const scales = new Uint8Array(4 * L.count), sv = view(scales), body = new Uint8Array(packedSize(L.total, this.bits));
    for (let s = 0; s < L.count; s++) {
      const off = s * this.segment, d = s < L.whole ? this.segment : L.padded;
      y.fill(0, 0, d);
      y.set(x.subarray(off, Math.min(off + d, x.length)));
      stream.read(off, d, sg);
      sv.setFloat32(4 * s, quantize(y, sg, 0, d, this.bits, codes), true);
      packAt(body, off, codes, d, this.bits);
    }
    const head = packHeader(this.codecId, t, PARAMS), hv = view(head), at = head.length - PARAMS;
    head[at] = this.bits;
    hv.setUint32(at + 4, this.segment, true);
    hv.setBigUint64(at + 8, seed, true);
    return concat([head, scales, body]);
  }

  decodeBody(header: Header, record: Uint8Array): Tensor {
    const p = take(record, header.offset, PARAMS, "eden parameters"), pv = view(p);
    const bits = p[0]!, segment = pv.getUint32(4, true), seed = pv.getBigUint64(8, true);
    if (!(bits in CENTROIDS) || !checkSegment(segment) || header.dtype !== "float32") throw new CodecError(`eden record with ${bits} bits, segment ${segment}, dtype ${header.dtype}`);
    const L = layout(header.size, segment), at = header.offset + PARAMS;
    const sv = view(take(record, at, 4 * L.count, "scales"));
    const body = record.subarray(at + 4 * L.count);
    if (body.length !== packedSize(L.total, bits)) throw new CodecError(`eden record holds ${body.length} code bytes, ${L.total} codes need ${packedSize(L.total, bits)}`);
    const c = CENTROIDS[bits]!, stream = new SignStream(seed, L.total), width = L.whole ? segment : L.padded;
    const y = new Float32Array(width), codes = new Uint8Array(width);
    const sg: [Float32Array, Float32Array] = [new Float32Array(width), new Float32Array(width)];
    const out = new Float32Array(header.size);
    for (let s = 0; s < L.count; s++) {
      const S = sv.getFloat32(4 * s, true);
      if (!Number.isFinite(S)) throw new CodecError("eden record holds a non-finite scale");
      const table = Float32Array.from(c, (v) => S * v);
      const off = s * segment, d = s < L.whole ? segment : L.padded;
      unpackAt(body, off, d, bits, codes);
      for (let i = 0; i < d; i++) y[i] = table[codes[i]!]!;
      stream.read(off, d, sg);
      unrotate(y, sg[1], 0, d);
      unrotate(y, sg[0], 0, d);
      out.set(y.subarray(0, Math.min(d, header.size - off)), off);
    }
    checkFinite(out, "eden record");
    return { dtype: "float32", shape: header.shape, data: out };
  }
}
