/**
 * Named tensors <-> bytes (docs/protocol.md, "Tensors"): a msgpack map of name -> extension value
 * of type 1 whose payload is
 *
 *     u8 dtype code | u8 rank | u8 pad | 5 zero bytes | rank x u64 dims (LE) | pad zero bytes | data
 *
 * with every tensor's data starting at a multiple of 64 bytes from the start of the payload.
 * Decoding checks dtype codes, ranks, dimensions, sizes, bool bytes and (unless allowed)
 * NaN/infinity, and returns views of the input where the alignment allows (else copies).
 */
import { ErrorCode, ProtocolError } from "./errors.js";
import { DEFAULT_LIMITS, type Limits } from "./messages.js";

export type DType = "float32" | "float16" | "float64" | "int64" | "int32" | "uint8" | "bool";
export type TypedData = Float32Array | Float64Array | BigInt64Array | Int32Array | Uint8Array | Uint16Array;

/** A dense tensor: C-order data and its shape. float16 data is the raw Uint16Array bits. */
export interface Tensor {
  dtype: DType;
  shape: number[];
  data: TypedData;
}

/** Rows `indices` of a table of `numRows` rows (docs/protocol.md, "Row-sparse tensors"). */
export interface RowSparse {
  rowSparse: true;
  indices: BigInt64Array;
  values: Tensor;
  numRows: number;
}

export type TensorValue = Tensor | RowSparse;

const CODES: Record<DType, number> = { float32: 1, float16: 2, float64: 3, int64: 4, int32: 5, uint8: 6, bool: 7 };
const DTYPES: Record<number, DType> = Object.fromEntries(Object.entries(CODES).map(([d, c]) => [c, d as DType]));
const ITEMSIZE: Record<DType, number> = { float32: 4, float16: 2, float64: 8, int64: 8, int32: 4, uint8: 1, bool: 1 };
const TENSOR_EXT = 1;
const ALIGN = 64;
const SPARSE_SEP = "@";
const SPARSE_PARTS = ["rows", "values", "num_rows"];

export function tensor(dtype: DType, shape: number[], data: TypedData): Tensor {
  const count = shape.reduce((a, b) => a * b, 1);
  if (data.length !== count) throw new ProtocolError(ErrorCode.BAD_SHAPE, `shape [${shape}] needs ${count} values, got ${data.length}`);
  return { dtype, shape: [...shape], data };
}

export function isRowSparse(value: TensorValue): value is RowSparse {
  return (value as RowSparse).rowSparse === true;
}

export function numel(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

function view(dtype: DType, buffer: ArrayBuffer, offset: number, count: number): TypedData {
  switch (dtype) {
    case "float32": return new Float32Array(buffer, offset, count);
    case "float64": return new Float64Array(buffer, offset, count);
    case "int64": return new BigInt64Array(buffer, offset, count);
    case "int32": return new Int32Array(buffer, offset, count);
    case "float16": return new Uint16Array(buffer, offset, count);
    case "uint8": case "bool": return new Uint8Array(buffer, offset, count);
  }
}

function utf8(text: string): Uint8Array {
  return new TextEncoder().encode(text);
}

function strHeader(length: number): number[] {
  if (length < 32) return [0xa0 | length];
  if (length < 256) return [0xd9, length];
  if (length < 65536) return [0xda, length >> 8, length & 0xff];
  return [0xdb, (length >>> 24) & 0xff, (length >>> 16) & 0xff, (length >>> 8) & 0xff, length & 0xff];
}

function expand(tensors: Record<string, TensorValue>): [string, Tensor][] {
  const flat: [string, Tensor][] = [];
  for (const [name, value] of Object.entries(tensors)) {
    if (name.includes(SPARSE_SEP)) throw new ProtocolError(ErrorCode.MALFORMED, `tensor name ${name.slice(0, 64)} contains the reserved @`);
    if (isRowSparse(value)) {
      flat.push([`${name}@rows`, tensor("int64", [value.indices.length], value.indices)]);
      flat.push([`${name}@values`, value.values]);
      flat.push([`${name}@num_rows`, tensor("int64", [], BigInt64Array.of(BigInt(value.numRows)))]);
    } else {
      flat.push([name, value]);
    }
  }
  return flat;
}

/** Encode named tensors; the data of each is copied once into the output. */
export function encodeTensors(tensors: Record<string, TensorValue>): Uint8Array {
  const flat = expand(tensors);
  const parts: Uint8Array[] = [];
  const count = flat.length;
  parts.push(Uint8Array.from(count < 16 ? [0x80 | count] : count < 65536 ? [0xde, count >> 8, count & 0xff]
    : [0xdf, (count >>> 24) & 0xff, (count >>> 16) & 0xff, (count >>> 8) & 0xff, count & 0xff]));
  let position = parts[0]!.length;
  for (const [name, t] of flat) {
    const code = CODES[t.dtype];
    if (code === undefined) throw new ProtocolError(ErrorCode.BAD_DTYPE, `tensor ${name}: dtype ${String(t.dtype)} is not on the wire`);
    if (t.data.length !== numel(t.shape)) throw new ProtocolError(ErrorCode.BAD_SHAPE, `tensor ${name}: data does not match shape [${t.shape}]`);
    const nameBytes = utf8(name);
    const key = Uint8Array.from([...strHeader(nameBytes.length), ...nameBytes]);
    const rank = t.shape.length;
    const unpadded = position + key.length + 6 + 8 + 8 * rank;
    const pad = (ALIGN - (unpadded % ALIGN)) % ALIGN;
    const nbytes = t.data.byteLength;
    const size = 8 + 8 * rank + pad + nbytes;
    const head = new Uint8Array(6 + 8 + 8 * rank + pad);
    const dv = new DataView(head.buffer);
    head[0] = 0xc9;
    dv.setUint32(1, size, false);
    dv.setInt8(5, TENSOR_EXT);
    head[6] = code; head[7] = rank; head[8] = pad;
    t.shape.forEach((d, i) => dv.setBigUint64(14 + 8 * i, BigInt(d), true));
    parts.push(key, head, new Uint8Array(t.data.buffer, t.data.byteOffset, nbytes));
    position = unpadded + pad + nbytes;
  }
  const out = new Uint8Array(position);
  let at = 0;
  for (const part of parts) { out.set(part, at); at += part.length; }
  return out;
}

class Reader {
  pos = 0;
  constructor(readonly bytes: Uint8Array, readonly dv: DataView) {}

  need(n: number): number {
    if (this.pos + n > this.bytes.length) throw new ProtocolError(ErrorCode.MALFORMED, "tensor payload is truncated");
    const at = this.pos;
    this.pos += n;
    return at;
  }
  u8(): number { return this.dv.getUint8(this.need(1)); }
  u16(): number { return this.dv.getUint16(this.need(2), false); }
  u32(): number { return this.dv.getUint32(this.need(4), false); }

  mapHeader(): number {
    const lead = this.u8();
    if (lead >= 0x80 && lead <= 0x8f) return lead & 0x0f;
    if (lead === 0xde) return this.u16();
    if (lead === 0xdf) return this.u32();
    throw new ProtocolError(ErrorCode.MALFORMED, `a tensor payload must be a msgpack map (first byte 0x${lead.toString(16)})`);
  }

  text(limits: Limits): string {
    const lead = this.u8();
    let length: number;
    if (lead >= 0xa0 && lead <= 0xbf) length = lead & 0x1f;
    else if (lead === 0xd9) length = this.u8();
    else if (lead === 0xda) length = this.u16();
    else if (lead === 0xdb) length = this.u32();
    else throw new ProtocolError(ErrorCode.MALFORMED, `tensor names must be msgpack str (byte 0x${lead.toString(16)})`);
    if (length > 4 * limits.maxStrLen) throw new ProtocolError(ErrorCode.TOO_LARGE, `tensor name of ${length} bytes exceeds the limit`);
    const at = this.need(length);
    try {
      return new TextDecoder("utf-8", { fatal: true }).decode(this.bytes.subarray(at, at + length));
    } catch {
      throw new ProtocolError(ErrorCode.MALFORMED, "tensor name is not UTF-8");
    }
  }

  ext(name: string): [number, number, number] {
    const lead = this.u8();
    const fixext: Record<number, number> = { 0xd4: 1, 0xd5: 2, 0xd6: 4, 0xd7: 8, 0xd8: 16 };
    let length: number;
    if (lead in fixext) length = fixext[lead]!;
    else if (lead === 0xc7) length = this.u8();
    else if (lead === 0xc8) length = this.u16();
    else if (lead === 0xc9) length = this.u32();
    else throw new ProtocolError(ErrorCode.MALFORMED, `tensor ${name.slice(0, 64)}: expected a tensor extension value`);
    const code = this.dv.getInt8(this.need(1));
    return [code, this.need(length), length];
  }
}

function readTensor(r: Reader, start: number, length: number, limits: Limits, name: string, allowNonFinite: boolean): Tensor {
  const where = `tensor ${name.slice(0, 64)}`;
  if (length < 8) throw new ProtocolError(ErrorCode.MALFORMED, `${where}: header is truncated`);
  const dtype = DTYPES[r.dv.getUint8(start)];
  const rank = r.dv.getUint8(start + 1);
  const pad = r.dv.getUint8(start + 2);
  if (dtype === undefined) throw new ProtocolError(ErrorCode.BAD_DTYPE, `${where}: unknown dtype code ${r.dv.getUint8(start)}`);
  if (rank > limits.maxRank) throw new ProtocolError(ErrorCode.BAD_SHAPE, `${where}: rank ${rank} exceeds ${limits.maxRank}`);
  if (pad >= ALIGN) throw new ProtocolError(ErrorCode.MALFORMED, `${where}: padding of ${pad} bytes exceeds ${ALIGN - 1}`);
  const offset = 8 + 8 * rank + pad;
  if (length < offset) throw new ProtocolError(ErrorCode.MALFORMED, `${where}: shape is truncated`);
  const shape: number[] = [];
  let count = 1;
  for (let i = 0; i < rank; i++) {
    const dim = r.dv.getBigUint64(start + 8 + 8 * i, true);
    if (dim > BigInt(limits.maxDim)) throw new ProtocolError(ErrorCode.BAD_SHAPE, `${where}: dimension ${dim} exceeds ${limits.maxDim}`);
    shape.push(Number(dim));
    count *= Number(dim);
  }
  const nbytes = count * ITEMSIZE[dtype];
  if (nbytes > limits.maxTensorBytes) throw new ProtocolError(ErrorCode.TOO_LARGE, `${where}: ${nbytes} bytes exceed ${limits.maxTensorBytes}`);
  if (length - offset !== nbytes) {
    throw new ProtocolError(ErrorCode.BAD_SHAPE, `${where}: shape [${shape}] needs ${nbytes} bytes of ${dtype}, got ${length - offset}`);
  }
  const at = r.bytes.byteOffset + start + offset;
  const buffer = r.bytes.buffer as ArrayBuffer;
  const data = at % ITEMSIZE[dtype] === 0
    ? view(dtype, buffer, at, count)
    : view(dtype, r.bytes.slice(start + offset, start + offset + nbytes).buffer as ArrayBuffer, 0, count);
  if (dtype === "bool" && (data as Uint8Array).some((b) => b > 1)) {
    throw new ProtocolError(ErrorCode.MALFORMED, `${where}: bool tensor holds bytes other than 0 and 1`);
  }
  if (!allowNonFinite && (dtype === "float32" || dtype === "float64")) {
    const values = data as Float32Array | Float64Array;
    for (let i = 0; i < values.length; i++) {
      if (!Number.isFinite(values[i]!)) throw new ProtocolError(ErrorCode.NON_FINITE, `${where} holds NaN or infinity`);
    }
  }
  return { dtype, shape, data };
}

function collapse(flat: Map<string, Tensor>, limits: Limits): Record<string, TensorValue> {
  const out: Record<string, TensorValue> = {};
  const parts = new Map<string, Map<string, Tensor>>();
  for (const [name, t] of flat) {
    const cut = name.lastIndexOf(SPARSE_SEP);
    if (cut < 0) { out[name] = t; continue; }
    const base = name.slice(0, cut);
    const part = name.slice(cut + 1);
    if (!SPARSE_PARTS.includes(part) || base === "" || base.includes(SPARSE_SEP)) {
      throw new ProtocolError(ErrorCode.MALFORMED, `tensor name ${name.slice(0, 64)}: @ is reserved for row-sparse parts`);
    }
    if (!parts.has(base)) parts.set(base, new Map());
    parts.get(base)!.set(part, t);
  }
  for (const [base, got] of parts) {
    if (base in out || got.size !== SPARSE_PARTS.length) {
      throw new ProtocolError(ErrorCode.MALFORMED, `row-sparse tensor ${base.slice(0, 64)} needs exactly the parts ${SPARSE_PARTS}`);
    }
    const rows = got.get("rows")!, values = got.get("values")!, numRows = got.get("num_rows")!;
    if (numRows.dtype !== "int64" || numRows.shape.length !== 0) throw new ProtocolError(ErrorCode.BAD_SHAPE, `row-sparse ${base}: num_rows must be an int64 scalar`);
    const n = Number((numRows.data as BigInt64Array)[0]);
    if (n < 0 || n > limits.maxDim) throw new ProtocolError(ErrorCode.BAD_SHAPE, `row-sparse ${base}: bad num_rows ${n}`);
    if (rows.dtype !== "int64" || rows.shape.length !== 1) throw new ProtocolError(ErrorCode.BAD_SHAPE, `row-sparse ${base}: indices must be 1-D int64`);
    const idx = rows.data as BigInt64Array;
    if (values.shape.length < 1 || values.shape[0] !== idx.length) throw new ProtocolError(ErrorCode.BAD_SHAPE, `row-sparse ${base}: values do not match the indices`);
    for (let i = 0; i < idx.length; i++) {
      if (idx[i]! < 0n || idx[i]! >= BigInt(n) || (i > 0 && idx[i]! <= idx[i - 1]!)) {
        throw new ProtocolError(ErrorCode.BAD_SHAPE, `row-sparse ${base}: indices must be strictly increasing rows in [0, ${n})`);
      }
    }
    out[base] = { rowSparse: true, indices: idx, values, numRows: n };
  }
  return out;
}

/** Decode named tensors, refusing unknown dtypes, bad shapes, oversize data and NaN/Inf. */
export function decodeTensors(data: Uint8Array, limits: Limits = DEFAULT_LIMITS, allowNonFinite = false): Record<string, TensorValue> {
  if (data.byteLength > limits.maxTransferBytes) {
    throw new ProtocolError(ErrorCode.TOO_LARGE, `tensor payload of ${data.byteLength} bytes exceeds ${limits.maxTransferBytes}`);
  }
  const r = new Reader(data, new DataView(data.buffer, data.byteOffset, data.byteLength));
  const count = r.mapHeader();
  if (count > limits.maxItems) throw new ProtocolError(ErrorCode.TOO_LARGE, `${count} tensors exceed ${limits.maxItems}`);
  const flat = new Map<string, Tensor>();
  for (let i = 0; i < count; i++) {
    const name = r.text(limits);
    if (flat.has(name)) throw new ProtocolError(ErrorCode.MALFORMED, `tensor ${name.slice(0, 64)} appears twice`);
    const [code, start, length] = r.ext(name);
    if (code !== TENSOR_EXT) throw new ProtocolError(ErrorCode.MALFORMED, `tensor ${name.slice(0, 64)}: unknown extension type ${code}`);
    flat.set(name, readTensor(r, start, length, limits, name, allowNonFinite));
  }
  if (r.pos !== data.byteLength) throw new ProtocolError(ErrorCode.MALFORMED, `${data.byteLength - r.pos} bytes after the tensor map`);
  return collapse(flat, limits);
}
