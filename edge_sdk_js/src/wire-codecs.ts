/**
 * Codecs on the wire (docs/protocol.md, "Codecs on the wire"; the Python twin is
 * edge_sdk/wire_codecs.py). A payload sent encoded names its codec in `TransferBegin.meta.codec`:
 * an ONNX chunk or training graph is one lossless record of its bytes; a tail's state is a tensor
 * payload whose every dense entry is a record (a uint8 vector). An instruction names the update's
 * codec in `config.update_codec`, and `config.update_feedback` asks for error feedback (Karimireddy
 * et al. 2019, Algorithm 2) where the codec is biased.
 */
import { CodecError, ErrorFeedback, codec, decode, decodeBytes, float32Values } from "./codecs/index.js";
import { ErrorCode, ProtocolError } from "./errors.js";
import type { Limits, Scalar } from "./messages.js";
import { decodeTensors, encodeTensors, type Tensor, type TensorValue } from "./tensors.js";

export const CODEC_META = "codec";
/** Delta downloads: the codec name, and the meta keys of the rebuilt bytes' sha256 and of the base's. */
export const DELTA_CODEC = "delta";
export const RECON_META = "recon";
export const DELTA_BASE_META = "base";
export const UPDATE_CODEC_KEY = "update_codec";
export const FEEDBACK_KEY = "update_feedback";

function isRecord(t: TensorValue): t is Tensor {
  return !("rowSparse" in t) && t.dtype === "uint8" && t.shape.length === 1;
}

/** The tensors of a state payload of records (a uint8 vector entry is a record; the rest as they are). */
export function decodeState(data: Uint8Array, limits: Limits): Record<string, TensorValue> {
  const out: Record<string, TensorValue> = {};
  for (const [key, value] of Object.entries(decodeTensors(data, limits))) {
    if (!isRecord(value)) { out[key] = value; continue; }
    let t: Tensor;
    try {
      t = decode(value.data as Uint8Array, limits.maxTensorBytes);
    } catch (exc) {
      if (exc instanceof CodecError) throw new ProtocolError(ErrorCode.MALFORMED, `tensor ${key.slice(0, 64)}: ${exc.message}`);
      throw exc;
    }
    if (t.dtype === "float32" && !(t.data as Float32Array).every(Number.isFinite)) {
      throw new ProtocolError(ErrorCode.NON_FINITE, `tensor ${key.slice(0, 64)} holds NaN or infinity`);
    }
    out[key] = t;
  }
  return out;
}

/** A payload's bytes as its consumer reads them, through the codec `meta.codec` names (if any). */
export function decodePayload(data: Uint8Array, meta: Record<string, Scalar>, kind: string, limits: Limits): Uint8Array {
  const name = meta[CODEC_META];
  if (name === undefined || name === "none") return data;
  if (kind === "model") return encodeTensors(decodeState(data, limits));
  try {
    return decodeBytes(data, limits.maxTransferBytes);
  } catch (exc) {
    if (exc instanceof CodecError) throw new ProtocolError(ErrorCode.MALFORMED, `a ${kind} payload through ${String(name)}: ${exc.message}`);
    throw exc;
  }
}

function deltaEntries(payload: Uint8Array, limits: Limits): { skel: Uint8Array; regions: BigInt64Array; step: { length: number; at: (i: number) => number } } {
  const entries = decodeTensors(payload, limits);
  const keys = Object.keys(entries).sort().join(",");
  if (keys !== "regions,skeleton,weights") throw new CodecError(`a delta payload holds skeleton, regions and weights, got ${keys.slice(0, 64)}`);
  const [skelRecord, regionsT, weightsRecord] = [entries["skeleton"]!, entries["regions"]!, entries["weights"]!];
  if (!isRecord(skelRecord) || !isRecord(weightsRecord) || "rowSparse" in regionsT || regionsT.dtype !== "int64"
      || regionsT.shape.length !== 2 || regionsT.shape[1] !== 2) throw new CodecError("a delta payload's entries have the wrong types");
  const skel = decode(skelRecord.data as Uint8Array, limits.maxTransferBytes);
  if (skel.dtype !== "uint8" || skel.shape.length !== 1) throw new CodecError("a delta payload's records have the wrong types");
  // The weights' values are read from their grid record as they are added, not decoded into a chunk-sized array.
  const step = float32Values(weightsRecord.data as Uint8Array, limits.maxTransferBytes);
  return { skel: skel.data as Uint8Array, regions: regionsT.data as BigInt64Array, step };
}

/**
 * The bytes a delta download rebuilds (docs/protocol.md, "Delta downloads"; the Python twin is
 * edge_sdk/codecs/delta.py): the skeleton's pieces with each region's float32 values written back,
 * `base + decode(weights)` in float32 (`Math.fround` of the double sum is the float32 sum), or just
 * `decode(weights)` without a base. The caller checks the result against the server's sha256.
 * `inPlace`: the base is the caller's own copy, and the result is written over it (each byte is read
 * before it is written), so a chunk is held once, not twice, while it is rebuilt; a base left half
 * written by a malformed delta is the caller's to drop.
 */
export function applyDelta(payload: Uint8Array, base: Uint8Array | undefined, limits: Limits, inPlace = false): Uint8Array {
  try {
    const { skel, regions, step } = deltaEntries(payload, limits);
    let count = 0;
    for (let i = 1; i < regions.length; i += 2) count += Number(regions[i]);
    if (count !== step.length) throw new CodecError(`a delta's weights hold ${step.length} values, its regions ${count}`);
    const size = skel.length + 4 * count;
    if (base !== undefined && base.length !== size) throw new CodecError(`a delta of a ${size}-byte payload applied to a ${base.length}-byte base`);
    const out = inPlace && base !== undefined ? base : new Uint8Array(size);
    const view = new DataView(out.buffer, out.byteOffset, out.byteLength), held = base && new DataView(base.buffer, base.byteOffset, base.byteLength);
    let at = 0, used = 0, k = 0;
    for (let i = 0; i < regions.length; i += 2) {
      const offset = Number(regions[i]), n = Number(regions[i + 1]);
      if (offset < at || n < 0 || offset + 4 * n > size) throw new CodecError("delta regions overlap, go backwards or leave the payload");
      out.set(skel.subarray(used, used + offset - at), at);
      used += offset - at;
      for (let j = 0; j < n; j++, k++) {
        const o = offset + 4 * j;
        const d = step.at(k);
        view.setFloat32(o, held ? Math.fround(held.getFloat32(o, true) + d) : d, true);
      }
      at = offset + 4 * n;
    }
    out.set(skel.subarray(used), at);
    return out;
  } catch (exc) {
    if (exc instanceof CodecError || exc instanceof ProtocolError) throw new ProtocolError(ErrorCode.MALFORMED, `a delta download: ${exc.message}`);
    throw exc;
  }
}

/** A device's updates, each as its instruction asks; error-feedback residuals carry over between rounds. */
export class UpdateEncoder {
  private feedback: ErrorFeedback | undefined;

  encode(tensors: Record<string, TensorValue>, config: Record<string, Scalar>): Uint8Array {
    const name = String(config[UPDATE_CODEC_KEY] ?? "none");
    if (name === "none") return encodeTensors(tensors);
    let chosen;
    try {
      chosen = codec(name);
    } catch (exc) {
      throw new ProtocolError(ErrorCode.MALFORMED, `instruction's update codec: ${(exc as Error).message}`);
    }
    const plain = codec("none");
    const useFeedback = config[FEEDBACK_KEY] === true;
    if (useFeedback) this.feedback ??= new ErrorFeedback();
    const out: Record<string, TensorValue> = {};
    for (const [key, value] of Object.entries(tensors)) {
      if ("rowSparse" in value) { out[key] = value; continue; }
      const lossy = value.dtype === "float32" && !chosen.lossless;
      const record = lossy && useFeedback ? this.feedback!.encode(key, value, chosen)
        : (lossy || chosen.lossless ? chosen : plain).encode(value);
      out[key] = { dtype: "uint8", shape: [record.length], data: record };
    }
    return encodeTensors(out);
  }
}
