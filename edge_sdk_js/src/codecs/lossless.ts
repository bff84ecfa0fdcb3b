/**
 * Lossless codecs (edge_sdk/codecs/lossless.py): `none`, `zlib` (RFC 1950: fflate's zlibSync and
 * unzlibSync), `shuffle` (byte planes, then zlib). fflate writes other deflate bytes than Python's
 * zlib; each SDK decodes the other's. fflate does not check the Adler-32 trailer: this module does,
 * which also refuses bytes after the stream.
 */
import { unzlibSync, zlibSync } from "fflate";
import type { Tensor } from "../tensors.js";
import type { Codec } from "./base.js";
import { CodecError, ITEMSIZE, type Header, concat, packHeader, rawBytes, take, typed } from "./record.js";

export const DEFAULT_LEVEL = 6;
type Level = 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9;

function adler32(data: Uint8Array): number {
  let a = 1, b = 0;
  for (let i = 0; i < data.length;) {
    const end = Math.min(data.length, i + 5552);
    for (; i < end; i++) { a += data[i]!; b += a; }
    a %= 65521; b %= 65521;
  }
  return ((b << 16) | a) >>> 0;
}

/** Inflate a zlib stream that must give exactly `expected` bytes. */
export function inflate(data: Uint8Array, expected: number): Uint8Array {
  let out: Uint8Array;
  try {
    out = unzlibSync(data, { out: new Uint8Array(expected + 1) });
  } catch (exc) {
    throw new CodecError(`deflate body does not inflate: ${(exc as Error).message}`);
  }
  if (out.length !== expected || data.length < 6) throw new CodecError(`deflate body inflates to ${out.length} bytes, the record's shape needs ${expected}`);
  const tail = data.length - 4;
  const stored = ((data[tail]! << 24) | (data[tail + 1]! << 16) | (data[tail + 2]! << 8) | data[tail + 3]!) >>> 0;
  if (stored !== adler32(out)) throw new CodecError("deflate body fails its Adler-32 check or has trailing bytes");
  return out;
}

function toTensor(header: Header, raw: Uint8Array): Tensor {
  const nbytes = header.size * ITEMSIZE[header.dtype];
  if (raw.length !== nbytes) throw new CodecError(`record holds ${raw.length} bytes of data, its shape needs ${nbytes}`);
  const data = typed(header.dtype, raw);
  if (header.dtype === "bool" && (data as Uint8Array).some((b) => b > 1)) throw new CodecError("a bool record holds bytes other than 0 and 1");
  return { dtype: header.dtype, shape: header.shape, data };
}

export class NoneCodec implements Codec {
  readonly name: string = "none";
  readonly codecId: number = 1;
  readonly lossless = true;
  readonly unbiased = true;
  readonly linear = false;

  encode(t: Tensor): Uint8Array {
    return concat([packHeader(this.codecId, t, 0), rawBytes(t)]);
  }

  decodeBody(header: Header, record: Uint8Array): Tensor {
    return toTensor(header, record.subarray(header.offset));
  }
}

export class ZlibCodec extends NoneCodec {
  override readonly name: string = "zlib";
  override readonly codecId: number = 2;
  constructor(readonly level: Level = DEFAULT_LEVEL) { super(); }

  override encode(t: Tensor): Uint8Array {
    return concat([packHeader(this.codecId, t, 0), zlibSync(rawBytes(t), { level: this.level })]);
  }

  override decodeBody(header: Header, record: Uint8Array): Tensor {
    return toTensor(header, inflate(record.subarray(header.offset), header.size * ITEMSIZE[header.dtype]));
  }
}

/** Byte k of every whole element of `stride` bytes, for each k, then the remainder. */
export function shuffle(raw: Uint8Array, stride: number): Uint8Array {
  const count = Math.floor(raw.length / stride), out = new Uint8Array(raw.length);
  for (let k = 0; k < stride; k++) for (let i = 0; i < count; i++) out[k * count + i] = raw[i * stride + k]!;
  out.set(raw.subarray(count * stride), count * stride);
  return out;
}

export function unshuffle(planes: Uint8Array, stride: number): Uint8Array {
  const count = Math.floor(planes.length / stride), out = new Uint8Array(planes.length);
  for (let k = 0; k < stride; k++) for (let i = 0; i < count; i++) out[i * stride + k] = planes[k * count + i]!;
  out.set(planes.subarray(count * stride), count * stride);
  return out;
}

export class ShuffleCodec extends ZlibCodec {
  override readonly name: string = "shuffle";
  override readonly codecId: number = 3;
  constructor(level: Level = DEFAULT_LEVEL, readonly stride?: number) { super(level); }

  override encode(t: Tensor): Uint8Array {
    const item = ITEMSIZE[t.dtype];
    const stride = this.stride ?? (item > 1 ? item : 4);
    const head = packHeader(this.codecId, t, 4);
    head[head.length - 4] = stride;
    return concat([head, zlibSync(shuffle(rawBytes(t), stride), { level: this.level })]);
  }

  override decodeBody(header: Header, record: Uint8Array): Tensor {
    const stride = take(record, header.offset, 4, "shuffle parameters")[0]!;
    if (stride < 1) throw new CodecError("shuffle stride 0");
    const planes = inflate(record.subarray(header.offset + 4), header.size * ITEMSIZE[header.dtype]);
    return toTensor(header, unshuffle(planes, stride));
  }
}
