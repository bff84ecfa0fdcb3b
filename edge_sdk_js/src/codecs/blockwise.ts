/**
 * Grid quantization (edge_sdk/codecs/blockwise.py): `int8` (nearest) and `sr1`..`sr8` (stochastic
 * rounding, unbiased) on per-block min/max grids, or on one shared scale (linear: composes with
 * secure aggregation's masking). The same float32 steps in the same order as numpy: the same codes.
 */
import type { Tensor } from "../tensors.js";
import type { Codec, EncodeOptions } from "./base.js";
import { pack, packedSize, unpack } from "./bits.js";
import { CodecError, type Header, checkFinite, concat, float32Input, packHeader, take, view } from "./record.js";
import { uniformU32 } from "./stream.js";

export const DEFAULT_BLOCK = 256;
const PARAMS = 8; // u8 bits, u8 rounding, u16 zero, u32 block (0: one shared scale)
const f = Math.fround;

/** Round half to even (numpy's rint). */
export function rint(t: number): number {
  const r = Math.round(t);
  return r - t === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** The grid codecs' id in a record's header. */
export const GRID_CODEC_ID = 5;

export class BlockwiseCodec implements Codec {
  readonly codecId = GRID_CODEC_ID;
  readonly name: string;
  readonly lossless = false;
  readonly unbiased: boolean;
  readonly linear: boolean;
  readonly block: number;
  readonly scale?: number;

  constructor(readonly bits: number, readonly stochastic: boolean, block = DEFAULT_BLOCK, scale?: number, name = "") {
    if (![1, 2, 4, 8].includes(bits) || (scale !== undefined && bits === 1)) throw new RangeError(`grid bits are 1, 2, 4 or 8 (2, 4 or 8 with a shared scale), got ${bits}`);
    if (scale !== undefined && !(Number.isFinite(scale) && f(scale) > 0)) throw new RangeError(`a shared scale is a positive float32, got ${scale}`);
    if (scale === undefined && !(Number.isInteger(block) && block >= 1 && block < 2 ** 32)) throw new RangeError(`block is 1 to 2^32 - 1 elements, got ${block}`);
    this.block = scale === undefined ? block : 0;
    this.scale = scale === undefined ? undefined : f(scale);
    this.name = name || `${stochastic ? "sr" : "int"}${bits}${scale === undefined ? "" : "-shared"}`;
    this.unbiased = stochastic && scale === undefined;
    this.linear = scale !== undefined;
  }

  private round(t: number, u: Uint32Array | undefined, i: number): number {
    return u ? Math.floor(t + u[i]! * 2 ** -32) : rint(t);
  }

  encode(t: Tensor, options: EncodeOptions = {}): Uint8Array {
    const x = float32Input(t, this.name);
    const head = packHeader(this.codecId, t, PARAMS);
    const at = head.length - PARAMS;
    head[at] = this.bits; head[at + 1] = this.stochastic ? 1 : 0;
    view(head).setUint32(at + 4, this.block, true);
    const u = this.stochastic ? uniformU32(x.length, options.seed) : undefined;
    const codes = new Uint8Array(x.length);
    if (this.scale !== undefined) {
      const m = 2 ** (this.bits - 1) - 1, s = this.scale, mask = (1 << this.bits) - 1;
      for (let i = 0; i < x.length; i++) {
        const q = Math.min(m, Math.max(-m, this.round(Math.min(m, Math.max(-m, f(x[i]! / s))), u, i)));
        codes[i] = q & mask;
      }
      const sc = new Uint8Array(4);
      view(sc).setFloat32(0, s, true);
      return concat([head, sc, pack(codes, this.bits)]);
    }
    const blocks = Math.ceil(x.length / this.block), levels = 2 ** this.bits - 1;
    const scales = new Uint8Array(8 * blocks), sv = view(scales);
    for (let b = 0; b < blocks; b++) {
      const start = b * this.block, end = Math.min(x.length, start + this.block);
      let lo = x[start]!, hi = x[start]!;
      for (let i = start; i < end; i++) { lo = Math.min(lo, x[i]!); hi = Math.max(hi, x[i]!); }
      const scale = f(f(hi - lo) / levels);
      if (!Number.isFinite(scale)) throw new CodecError(`${this.name}: a block's range overflows float32`);
      sv.setFloat32(8 * b, lo, true); sv.setFloat32(8 * b + 4, scale, true);
      for (let i = start; i < end; i++) {
        const ti = scale > 0 ? f(f(x[i]! - lo) / scale) : 0;
        codes[i] = Math.min(levels, Math.max(0, this.round(ti, u, i)));
      }
    }
    return concat([head, scales, pack(codes, this.bits)]);
  }

  decodeBody(header: Header, record: Uint8Array): Tensor {
    const { bits, block, blocks, sv, body } = parseGrid(header, record), n = header.size;
    const q = unpack(body, n, bits), out = new Float32Array(n);
    if (!block) {
      const s = sv.getFloat32(0, true), top = 1 << (bits - 1);
      for (let i = 0; i < n; i++) out[i] = (q[i]! >= top ? q[i]! - 2 * top : q[i]!) * s;
    } else {
      for (let b = 0; b < blocks; b++) {
        const lo = sv.getFloat32(8 * b, true), s = sv.getFloat32(8 * b + 4, true);
        for (let i = b * block, end = Math.min(n, i + block); i < end; i++) out[i] = f(q[i]! * s) + lo;
      }
    }
    checkFinite(out, "grid record");
    return { dtype: "float32", shape: header.shape, data: out };
  }
}

/** A grid record's parameters, scales and codes, checked. */
function parseGrid(header: Header, record: Uint8Array): { bits: number; block: number; blocks: number; sv: DataView; body: Uint8Array } {
  const p = take(record, header.offset, PARAMS, "grid parameters"), pv = view(p);
  const bits = p[0]!, block = pv.getUint32(4, true);
  if (![1, 2, 4, 8].includes(bits) || pv.getUint16(2, true) !== 0 || header.dtype !== "float32") throw new CodecError(`grid record with ${bits} bits of ${header.dtype}`);
  const n = header.size, at = header.offset + PARAMS;
  const blocks = block ? Math.ceil(n / block) : 1;
  const sv = view(take(record, at, block ? 8 * blocks : 4, "scales"));
  const body = record.subarray(at + (block ? 8 * blocks : 4));
  if (body.length !== packedSize(n, bits)) throw new CodecError(`grid record holds ${body.length} code bytes, ${n} codes of ${bits} bits need ${packedSize(n, bits)}`);
  return { bits, block, blocks, sv, body };
}

/**
 * The values of a per-block grid record (`decodeBody`'s, bit for bit: `fround(q * scale) + lo` in
 * float32) read one at a time from its packed codes, never held as a float32 array: a delta download
 * adds a chunk's 4.3 million of them to its base (src/wire-codecs.ts) without a 17 MB array beside it.
 * Null for a record on one shared scale (`decode` reads those).
 */
export function gridReader(header: Header, record: Uint8Array): { length: number; at: (i: number) => number } | null {
  const { bits, block, sv, body } = parseGrid(header, record);
  if (!block) return null;
  const mask = (1 << bits) - 1;
  return {
    length: header.size,
    at(i: number): number {
      const bit = i * bits, where = Math.floor(bit / 8), shift = bit % 8;
      let q = body[where]! >>> shift;
      if (shift + bits > 8) q |= body[where + 1]! << (8 - shift);
      const b = Math.floor(i / block);
      const v = f(f((q & mask) * sv.getFloat32(8 * b + 4, true)) + sv.getFloat32(8 * b, true));
      if (!Number.isFinite(v)) throw new CodecError("grid record decodes to NaN or infinity");
      return v;
    },
  };
}

/** The signed integer codes and shared scale of a shared-grid record: sum the codes (masked) in the ring, times the scale. */
export function linearCodes(header: Header, record: Uint8Array): { codes: Int32Array; scale: number } {
  const p = take(record, header.offset, PARAMS, "grid parameters");
  const bits = p[0]!, block = view(p).getUint32(4, true);
  if (header.codecId !== 5 || block !== 0 || ![2, 4, 8].includes(bits)) throw new CodecError("not a shared-grid record: per-block scales do not add across devices");
  const scale = view(take(record, header.offset + PARAMS, 4, "scale")).getFloat32(0, true);
  const body = record.subarray(header.offset + PARAMS + 4);
  if (body.length !== packedSize(header.size, bits)) throw new CodecError("grid record's codes do not match its shape");
  const q = unpack(body, header.size, bits), top = 1 << (bits - 1), codes = new Int32Array(header.size);
  for (let i = 0; i < q.length; i++) codes[i] = q[i]! >= top ? q[i]! - 2 * top : q[i]!;
  return { codes, scale };
}
