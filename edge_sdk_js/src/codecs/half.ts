/**
 * `float16` (edge_sdk/codecs/half.py): IEEE binary16, round to nearest even, written bit by bit as
 * numpy's float32 -> float16 conversion; magnitudes >= 65520 (which would round to infinity) are refused.
 */
import type { Tensor } from "../tensors.js";
import type { Codec } from "./base.js";
import { CodecError, type Header, checkFinite, concat, float32Input, packHeader } from "./record.js";

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/** The binary16 bits of float32 `x` (finite, |x| < 65520), rounded to nearest even. */
export function toHalf(x: number): number {
  F32[0] = x;
  const u = U32[0]!;
  const sign = (u >>> 16) & 0x8000;
  const abs = u & 0x7fffffff;
  if (abs < 0x38800000) { // below 2^-14: subnormal (or zero) in binary16, steps of 2^-24
    const v = Math.abs(F32[0]!) * 2 ** 24; // exact in float64
    let r = Math.round(v);
    if (r - v === 0.5 && r % 2 === 1) r -= 1; // ties to even (Math.round rounds ties up)
    return sign | r; // r = 1024 is the smallest normal's bit pattern, as it should be
  }
  const mant = abs & 0x7fffff;
  let half = (((abs >>> 23) - 112) << 10) | (mant >>> 13);
  const rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest === 0x1000 && (half & 1) === 1)) half += 1;
  return sign | half;
}

/** The float32 value of binary16 bits `h` (exact). */
export function fromHalf(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f, mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 31) return mant ? NaN : sign * Infinity;
  return sign * (1024 + mant) * 2 ** (exp - 25);
}

let TABLE: Float32Array | undefined;

/** Every binary16 value as float32, built on first use (256 KiB): decoding is one lookup per element. */
function halfTable(): Float32Array {
  if (!TABLE) TABLE = Float32Array.from({ length: 65536 }, (_, h) => fromHalf(h));
  return TABLE;
}

export class Float16Codec implements Codec {
  readonly name = "float16";
  readonly codecId = 4;
  readonly lossless = false;
  readonly unbiased = false;
  readonly linear = false;

  encode(t: Tensor): Uint8Array {
    const x = float32Input(t, this.name);
    const body = new Uint8Array(2 * x.length);
    const dv = new DataView(body.buffer);
    for (let i = 0; i < x.length; i++) {
      if (Math.abs(x[i]!) >= 65520) throw new CodecError(`float16: a magnitude of ${x[i]} does not fit binary16 (< 65520)`);
      dv.setUint16(2 * i, toHalf(x[i]!), true);
    }
    return concat([packHeader(this.codecId, t, 0), body]);
  }

  decodeBody(header: Header, record: Uint8Array): Tensor {
    const body = record.subarray(header.offset);
    if (header.dtype !== "float32" || body.length !== 2 * header.size) throw new CodecError(`float16 record of ${header.dtype} [${header.shape}] with ${body.length} body bytes`);
    const dv = new DataView(body.buffer, body.byteOffset, body.byteLength), table = halfTable();
    const out = new Float32Array(header.size);
    for (let i = 0; i < out.length; i++) out[i] = table[dv.getUint16(2 * i, true)]!;
    checkFinite(out, "float16 record");
    return { dtype: "float32", shape: header.shape, data: out };
  }
}
