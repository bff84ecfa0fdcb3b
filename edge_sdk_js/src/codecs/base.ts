/** What every codec is (edge_sdk/codecs/base.py): a name, its properties, encode to a record. */
import type { Tensor } from "../tensors.js";
import type { Header } from "./record.js";
import type { Seed } from "./stream.js";

export interface EncodeOptions {
  /** The randomness of a randomized codec (a SHAKE128 stream both SDKs reproduce); undefined: the system's. */
  seed?: Seed;
}

export interface Codec {
  readonly name: string;
  readonly codecId: number;
  /** decode(encode(x)) is x, bit for bit. */
  readonly lossless: boolean;
  /** E[decode(encode(x))] = x over the codec's randomness. */
  readonly unbiased: boolean;
  /** Integer codes with one shared scale: sums in secure aggregation's ring decode to the sum. */
  readonly linear: boolean;
  encode(t: Tensor, options?: EncodeOptions): Uint8Array;
  decodeBody(header: Header, record: Uint8Array): Tensor;
}
