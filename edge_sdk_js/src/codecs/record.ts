/**
 * The record every codec writes (docs/protocol.md, "Codecs"); the same bytes as edge_sdk/codecs/record.py:
 *
 *     "EC" | u8 format (1) | u8 codec id | u8 dtype code | u8 rank | u16 zero | rank x u64 dims (LE)
 *     | the codec's parameters | body
 *
 * A decoder knows from the header how large the tensor is before it allocates anything.
 */
import type { DType, Tensor, TypedData } from "../tensors.js";

/** A record that does not decode, or a tensor a codec refuses. */
export class CodecError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "CodecError";
  }
}

export const FORMAT = 1;
/** The largest decoded tensor a record may describe by default (the protocol's maxTensorBytes). */
export const MAX_BYTES = 2 ** 30;
const MAX_RANK = 8;
const FIXED = 8;
/** The tensor format's dtype codes (docs/protocol.md, "Tensors"). */
const CODES: Record<DType, number> = { float32: 1, float16: 2, float64: 3, int64: 4, int32: 5, uint8: 6, bool: 7 };
const DTYPES: Record<number, DType> = { 1: "float32", 2: "float16", 3: "float64", 4: "int64", 5: "int32", 6: "uint8", 7: "bool" };
export const ITEMSIZE: Record<DType, number> = { float32: 4, float16: 2, float64: 8, int64: 8, int32: 4, uint8: 1, bool: 1 };

export interface Header {
  codecId: number;
  dtype: DType;
  shape: number[];
  size: number;
  /** Where the codec's parameters start. */
  offset: number;
}

export function numelOf(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

export function packHeader(codecId: number, t: Tensor, params: number): Uint8Array {
  const code = CODES[t.dtype];
  if (code === undefined) throw new CodecError(`dtype ${String(t.dtype)} has no wire code`);
  if (t.shape.length > MAX_RANK) throw new CodecError(`rank ${t.shape.length} exceeds ${MAX_RANK}`);
  if (t.data.length !== numelOf(t.shape)) throw new CodecError(`shape [${t.shape}] needs ${numelOf(t.shape)} values, got ${t.data.length}`);
  const out = new Uint8Array(FIXED + 8 * t.shape.length + params);
  const dv = new DataView(out.buffer);
  out.set([0x45, 0x43, FORMAT, codecId, code, t.shape.length, 0, 0]);
  t.shape.forEach((d, i) => dv.setBigUint64(FIXED + 8 * i, BigInt(d), true));
  return out;
}

export function parseHeader(record: Uint8Array, maxBytes = MAX_BYTES): Header {
  if (record.length < FIXED) throw new CodecError(`a record needs at least ${FIXED} bytes, got ${record.length}`);
  const dv = view(record);
  if (record[0] !== 0x45 || record[1] !== 0x43 || record[2] !== FORMAT || dv.getUint16(6, true) !== 0) {
    throw new CodecError(`not a codec record of format ${FORMAT}`);
  }
  const dtype = DTYPES[record[4]!];
  const rank = record[5]!;
  if (dtype === undefined) throw new CodecError(`unknown dtype code ${record[4]}`);
  if (rank > MAX_RANK) throw new CodecError(`rank ${rank} exceeds ${MAX_RANK}`);
  const offset = FIXED + 8 * rank;
  if (record.length < offset) throw new CodecError("record is truncated in its shape");
  const shape: number[] = [];
  let bytes = BigInt(ITEMSIZE[dtype]);
  for (let i = 0; i < rank; i++) {
    const d = dv.getBigUint64(FIXED + 8 * i, true);
    bytes *= d;
    shape.push(Number(d));
  }
  if (bytes > BigInt(maxBytes)) throw new CodecError(`a tensor of shape [${shape}] (${dtype}) exceeds ${maxBytes} bytes`);
  return { codecId: record[3]!, dtype, shape, size: numelOf(shape), offset };
}

export function view(bytes: Uint8Array): DataView {
  return new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/** `length` bytes at `offset`, or a CodecError naming `what` when the record is shorter. */
export function take(record: Uint8Array, offset: number, length: number, what: string): Uint8Array {
  if (length < 0 || offset + length > record.length) throw new CodecError(`record is truncated in its ${what}`);
  return record.subarray(offset, offset + length);
}

export function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
}

/** The tensor's bytes, little-endian C order (a view: no copy). */
export function rawBytes(t: Tensor): Uint8Array {
  return new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
}

/** A new typed array of `dtype` holding a copy of `bytes`. */
export function typed(dtype: DType, bytes: Uint8Array): TypedData {
  const copy = bytes.slice().buffer;
  switch (dtype) {
    case "float32": return new Float32Array(copy);
    case "float64": return new Float64Array(copy);
    case "int64": return new BigInt64Array(copy);
    case "int32": return new Int32Array(copy);
    case "float16": return new Uint16Array(copy);
    case "uint8": case "bool": return new Uint8Array(copy);
  }
}

/** `t` as float32 data; lossy codecs refuse other dtypes and NaN/infinity. */
export function float32Input(t: Tensor, name: string): Float32Array {
  if (t.dtype !== "float32" || !(t.data instanceof Float32Array)) throw new CodecError(`${name} encodes float32 tensors, got ${t.dtype}`);
  if (t.data.length !== numelOf(t.shape)) throw new CodecError(`shape [${t.shape}] needs ${numelOf(t.shape)} values, got ${t.data.length}`);
  for (let i = 0; i < t.data.length; i++) {
    if (!Number.isFinite(t.data[i]!)) throw new CodecError(`${name}: the tensor holds NaN or infinity`);
  }
  return t.data;
}

export function checkFinite(data: Float32Array, what: string): void {
  for (let i = 0; i < data.length; i++) {
    if (!Number.isFinite(data[i]!)) throw new CodecError(`${what} decodes to NaN or infinity`);
  }
}
