/**
 * Error feedback (edge_sdk/codecs/feedback.py; Stich et al. 2018, Karimireddy et al. 2019 Algorithm 2):
 * send C(delta + e) and keep e <- delta + e - decode(C(delta + e)), one residual per tensor name.
 */
import type { Tensor } from "../tensors.js";
import type { Codec, EncodeOptions } from "./base.js";
import { decode } from "./registry.js";

export class ErrorFeedback {
  readonly residuals = new Map<string, Float32Array>();

  /** The record of `delta` plus the residual of `name`; the residual becomes what the record misses. */
  encode(name: string, delta: Tensor, codec: Codec, options: EncodeOptions = {}): Uint8Array {
    const d = delta.data as Float32Array;
    const held = this.residuals.get(name);
    const target = new Float32Array(d.length);
    for (let i = 0; i < d.length; i++) target[i] = held && held.length === d.length ? d[i]! + held[i]! : d[i]!;
    const record = codec.encode({ dtype: "float32", shape: delta.shape, data: target }, options);
    const back = decode(record).data as Float32Array;
    for (let i = 0; i < d.length; i++) target[i] = target[i]! - back[i]!;
    this.residuals.set(name, target);
    return record;
  }

  /** Forget one tensor's residual, or all of them. */
  reset(name?: string): void {
    if (name === undefined) this.residuals.clear();
    else this.residuals.delete(name);
  }
}
