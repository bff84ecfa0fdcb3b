/**
 * Codecs on the wire (docs/protocol.md, "Codecs on the wire"; the Python twin is
 * edge_sdk/wire_codecs.py). A payload sent encoded names its codec in `TransferBegin.meta.codec`:
 * an ONNX chunk or training graph is one lossless record of its bytes; a tail's state is a tensor
 * payload whose every dense entry is a record (a uint8 vector). An instruction names the update's
 * codec in `config.update_codec`, and `config.update_feedback` asks for error feedback (Karimireddy
 * et al. 2019, Algorithm 2) where the codec is biased.
 */
import { CodecError, ErrorFeedback, codec, decode, decodeBytes } from "./codecs/index.js";
import { ErrorCode, ProtocolError } from "./errors.js";
import type { Limits, Scalar } from "./messages.js";
import { decodeTensors, encodeTensors, type Tensor, type TensorValue } from "./tensors.js";

export const CODEC_META = "codec";
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
