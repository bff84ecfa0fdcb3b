/** The codecs by name and the one decoder (edge_sdk/codecs/registry.py). */
import type { Tensor } from "../tensors.js";
import type { Codec } from "./base.js";
import { BlockwiseCodec, DEFAULT_BLOCK, GRID_CODEC_ID, gridReader, linearCodes as gridCodes } from "./blockwise.js";
import { DEFAULT_SEGMENT, EdenCodec } from "./eden.js";
import { Float16Codec } from "./half.js";
import { DEFAULT_LEVEL, NoneCodec, ShuffleCodec, ZlibCodec } from "./lossless.js";
import { CodecError, MAX_BYTES, parseHeader } from "./record.js";

export interface CodecParams {
  level?: number;
  stride?: number;
  block?: number;
  scale?: number;
  segment?: number;
}

type Level = 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9;

function level(p: CodecParams): Level {
  const l = p.level ?? DEFAULT_LEVEL;
  if (!Number.isInteger(l) || l < 0 || l > 9) throw new RangeError(`zlib level is 0-9, got ${l}`);
  return l as Level;
}

const BUILD: Record<string, (p: CodecParams) => Codec> = {
  none: () => new NoneCodec(),
  zlib: (p) => new ZlibCodec(level(p)),
  shuffle: (p) => new ShuffleCodec(level(p), p.stride),
  float16: () => new Float16Codec(),
  int8: (p) => new BlockwiseCodec(8, false, p.block ?? DEFAULT_BLOCK, p.scale),
  ...Object.fromEntries([1, 2, 4, 8].map((b) => [`sr${b}`, (p: CodecParams) => new BlockwiseCodec(b, true, p.block ?? DEFAULT_BLOCK, p.scale)])),
  ...Object.fromEntries([1, 2, 3, 4].map((b) => [`eden${b}`, (p: CodecParams) => new EdenCodec(b, p.segment ?? DEFAULT_SEGMENT)])),
};

/** Every codec in its default setting, by name. */
export const CODECS: Readonly<Record<string, Codec>> = Object.fromEntries(Object.entries(BUILD).map(([n, b]) => [n, b({})]));
const BY_ID = new Map(Object.values(CODECS).map((c) => [c.codecId, c]));

/** The codec `name` with `params`; throws RangeError for an unknown name or setting. */
export function codec(name: string, params: CodecParams = {}): Codec {
  const build = BUILD[name];
  if (build === undefined) throw new RangeError(`unknown codec ${name}; known: ${Object.keys(BUILD).join(", ")}`);
  return Object.keys(params).length ? build(params) : CODECS[name]!;
}

/** The tensor of any codec's record; throws CodecError for a malformed record or one above `maxBytes`. */
export function decode(record: Uint8Array, maxBytes = MAX_BYTES): Tensor {
  const header = parseHeader(record, maxBytes);
  const reader = BY_ID.get(header.codecId);
  if (reader === undefined) throw new CodecError(`unknown codec id ${header.codecId}`);
  return reader.decodeBody(header, record);
}

/**
 * A float32 record's values by index: read from the record one at a time where its codec can
 * (`gridReader`: a per-block grid), else decoded whole. The same values as `decode`'s.
 */
export function float32Values(record: Uint8Array, maxBytes = MAX_BYTES): { length: number; at: (i: number) => number } {
  const header = parseHeader(record, maxBytes);
  const streamed = header.codecId === GRID_CODEC_ID ? gridReader(header, record) : null;
  if (streamed !== null) return streamed;
  const t = decode(record, maxBytes);
  if (t.dtype !== "float32") throw new CodecError(`a record of float32 values holds ${t.dtype}`);
  const data = t.data as Float32Array;
  return { length: data.length, at: (i) => data[i]! };
}

/** A byte payload (an ONNX chunk, a training graph, a tensor payload) through a lossless codec. */
export function encodeBytes(name: string, data: Uint8Array, params: CodecParams = {}): Uint8Array {
  const chosen = codec(name, params);
  if (!chosen.lossless) throw new RangeError(`codec ${name} is lossy: byte payloads take none, zlib or shuffle`);
  return chosen.encode({ dtype: "uint8", shape: [data.length], data });
}

export function decodeBytes(record: Uint8Array, maxBytes = MAX_BYTES): Uint8Array {
  const t = decode(record, maxBytes);
  if (t.dtype !== "uint8" || t.shape.length !== 1) throw new CodecError(`a byte record holds a uint8 vector, got ${t.dtype} [${t.shape}]`);
  return t.data as Uint8Array;
}

/** Signed integer codes and the shared scale of a shared-grid (linear) record. */
export function linearCodes(record: Uint8Array): { codes: Int32Array; scale: number } {
  return gridCodes(parseHeader(record), record);
}
