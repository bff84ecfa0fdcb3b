/**
 * Fixed point, as edge_sdk/secagg/fixedpoint.py (its docstring derives the ring size and the error
 * bound): clip the block to L2 norm C, scale by the weight w in [0, 1] and by 2^f, append the
 * weight coordinate (w * C) * 2^f, round stochastically with uniforms from an AES-256-CTR stream
 * keyed by 32 fresh random bytes, reduce modulo 2^b with b = bit_length(n * ceil(C * 2^f)) + 1 <= 32.
 * The operations and their order are Python's, so both SDKs give the same words for the same
 * inputs and rounding seed (the L2 norm is summed in order here; numpy may sum in another order,
 * which changes it by rounding only). A device encodes a block a slice at a time (`BlockEncoder`,
 * after `l2Norm`'s pass), which gives the words `encode` gives for the whole block.
 *
 * A compressed round (`Compression`, fixedpoint.py's docstring): each coordinate is bounded by
 * B = k C / sqrt(d) rounded up to M 2^-f and rounded to an integer of [-M, M], M = 2^(q-1) - 1, in
 * a ring of b = bit_length(n M) + 1 bits; the words travel packed at b bits (`packWords`).
 */
import { type CryptoBackend, randomBytes } from "./backend.js";
import { KEY_BYTES } from "./keys.js";
import { SecAggError } from "./labels.js";
import { KeyStream, MAX_RING_BITS, MAX_WORDS, ringMask } from "./masks.js";

export const MAX_FRAC_BITS = 60;
export const MAX_COHORT = 2 ** 20;

/** Standard deviations of the summed distributed noise the ring holds beside the values (fixedpoint.py). */
export const NOISE_TAIL = 10;
/** Coordinates a device encodes and masks at once. */
export const SLICE_WORDS = 1 << 16;
/** A compressed round's per-coordinate bound in standard deviations of an evenly spread block (k). */
export const SPREAD = 4;
/** The most bits a compressed round's devices quantise a coordinate to (q). */
export const MAX_VALUE_BITS = 24;

/** The bytes of `count` words packed at `bits` bits each. */
export function packedBytes(count: number, bits: number): number {
  return Math.ceil((count * bits) / 8);
}

/** `words` (each below 2^bits) as a little-endian bit stream: word i holds stream bits [i b, (i + 1) b),
 * stream bit j is bit j mod 8 of byte j / 8; the last byte's high bits are zero (fixedpoint.py's pack_words). */
export function packWords(words: ArrayLike<number>, bits: number): Uint8Array {
  ringMask(bits);
  const out = new Uint8Array(packedBytes(words.length, bits));
  let pos = 0;
  for (let i = 0; i < words.length; i++) {
    let v = words[i]!, left = bits;
    while (left > 0) {
      const at = pos >>> 3, off = pos & 7, take = Math.min(8 - off, left);
      out[at]! |= (v & ((1 << take) - 1)) << off;
      v = Math.floor(v / 2 ** take);
      pos += take;
      left -= take;
    }
  }
  return out;
}

/** The `count` words of `packWords`'s stream `data`; refused unless it is exactly `packedBytes` long
 * with its padding bits zero. */
export function unpackWords(data: Uint8Array, count: number, bits: number): Uint32Array {
  ringMask(bits);
  if (data.length !== packedBytes(count, bits)) {
    throw new SecAggError(`${count} words packed at ${bits} bits are ${packedBytes(count, bits)} bytes, got ${data.length}`);
  }
  const tail = (count * bits) % 8;
  if (tail && data[data.length - 1]! >> tail) throw new SecAggError("the packed words' padding bits are not zero");
  const out = new Uint32Array(count);
  let pos = 0;
  for (let i = 0; i < count; i++) {
    let v = 0, got = 0;
    while (got < bits) {
      const at = pos >>> 3, off = pos & 7, take = Math.min(8 - off, bits - got);
      v += ((data[at]! >> off) & ((1 << take) - 1)) * 2 ** got;
      pos += take;
      got += take;
    }
    out[i] = v;
  }
  return out;
}

/** The concatenation of `parts`, in views of at most `size` values (subarrays of typed arrays; no copy). */
export function* slices(parts: readonly ArrayLike<number>[], size = SLICE_WORDS): Generator<ArrayLike<number>> {
  for (const part of parts) {
    for (let at = 0; at < part.length; at += size) {
      yield ArrayBuffer.isView(part) ? (part as unknown as Float64Array).subarray(at, at + size)
        : Array.prototype.slice.call(part, at, at + size) as number[];
    }
  }
}

/** The L2 norm of the concatenation of `parts`, summed in order (refused with NaN or infinite values). */
export function l2Norm(parts: Iterable<ArrayLike<number>>): number {
  let squares = 0;
  for (const piece of parts) {
    for (let i = 0; i < piece.length; i++) {
      const v = piece[i]!;
      if (!Number.isFinite(v)) throw new SecAggError("the update has NaN or infinite values");
      squares += v * v;
    }
  }
  return Math.sqrt(squares);
}

/** The smallest b such that the sum of `cohort` encoded values, plus noise of standard deviation `noise`
 * (update units) up to NOISE_TAIL deviations, cannot wrap in Z_{2^b}. */
export function ringBitsFor(cohort: number, clip: number, fracBits: number, noise = 0): number {
  const room = BigInt(Math.ceil(NOISE_TAIL * noise * 2 ** fracBits));
  const bound = BigInt(cohort) * BigInt(Math.ceil(clip * 2 ** fracBits)) + room;
  return (bound === 0n ? 0 : bound.toString(2).length) + 1;
}

/** A block's decoded sum: the sum of w_i x'_i and the sum of the weights. */
export interface Decoded {
  readonly values: Float64Array;
  readonly weight: number;
}

/** A compressed round: q-bit values (`valueBits`), M = 2^(q-1) - 1 levels a side, within the bound
 * B = k C / sqrt(d) rounded up to M 2^-f (`spread` k), in a ring of bit_length(n M) + 1 bits. */
export class Compression {
  constructor(readonly valueBits: number, readonly spread = SPREAD) {
    if (!(Number.isInteger(valueBits) && valueBits >= 2 && valueBits <= MAX_VALUE_BITS)) {
      throw new SecAggError(`value bits must be an integer in [2, ${MAX_VALUE_BITS}], got ${valueBits}`);
    }
    if (!(Number.isFinite(spread) && spread > 0)) throw new SecAggError(`the spread must be finite and > 0, got ${spread}`);
  }

  /** M: a device's coordinate is an integer of [-M, M]. */
  get levels(): number {
    return 2 ** (this.valueBits - 1) - 1;
  }

  /** b: the sum of `cohort` devices' values cannot wrap in Z_{2^b}. */
  ringBits(cohort: number): number {
    return (cohort * this.levels).toString(2).length + 1;
  }

  /** The fixed point of a block of `dimension` coordinates: the largest f with M 2^-f >= k C / sqrt(d), B = min(C, M 2^-f). */
  fixed(cohort: number, clip: number, dimension: number): FixedPoint {
    if (!(Number.isInteger(dimension) && dimension >= 1)) throw new SecAggError(`a block has at least one coordinate, got ${dimension}`);
    const target = (this.spread * clip) / Math.sqrt(dimension);
    let f = 0;
    while (f < MAX_FRAC_BITS && this.levels * 2 ** -(f + 1) >= target) f++;
    return new FixedPoint(clip, f, this.ringBits(cohort), cohort, 0, Math.min(clip, this.levels * 2 ** -f));
  }
}

/** The round's encoding: L2 bound `clip` (C), `fracBits` (f), `ringBits` (b), at most `cohort` (n) devices summed,
 * `noise`: the standard deviation (update units) of the distributed noise summed over the cohort; `bound`: a
 * compressed round's per-coordinate bound B (0: C). */
export class FixedPoint {
  constructor(readonly clip: number, readonly fracBits: number, readonly ringBits: number, readonly cohort: number,
    readonly noise = 0, readonly bound = 0) {
    if (!(Number.isFinite(clip) && clip > 0)) throw new SecAggError(`clip must be finite and > 0, got ${clip}`);
    if (!(Number.isInteger(fracBits) && fracBits >= 0 && fracBits <= MAX_FRAC_BITS)) {
      throw new SecAggError(`frac_bits must be an integer in [0, ${MAX_FRAC_BITS}], got ${fracBits}`);
    }
    if (!(Number.isInteger(cohort) && cohort >= 1 && cohort <= MAX_COHORT)) {
      throw new SecAggError(`cohort must be an integer in [1, ${MAX_COHORT}], got ${cohort}`);
    }
    if (!(Number.isFinite(noise) && noise >= 0)) throw new SecAggError(`noise must be finite and >= 0, got ${noise}`);
    if (!(Number.isFinite(bound) && bound >= 0 && bound <= clip)) throw new SecAggError(`a coordinate bound must be in [0, clip], got ${bound}`);
    if (bound && noise) throw new SecAggError("distributed noise needs the float ring: a compressed round's ring has no room for the noise's tail");
    const needed = ringBitsFor(cohort, this.limit, fracBits, noise);
    if (needed > MAX_RING_BITS) {
      throw new SecAggError(`${cohort} devices at clip ${clip} and 2^${fracBits} need a ring of ${needed} bits, `
        + `more than ${MAX_RING_BITS}: lower frac_bits`);
    }
    ringMask(ringBits);
    if (ringBits < needed) {
      throw new SecAggError(`${cohort} devices at clip ${clip} and 2^${fracBits} need a ring of ${needed} bits, `
        + `not ${ringBits}: the sum could wrap`);
    }
  }

  /** The smallest ring for `fracBits`, or (undefined) the largest f whose ring fits 32 bits. */
  static plan(cohort: number, clip: number, fracBits?: number, noise = 0): FixedPoint {
    let f = fracBits;
    if (f === undefined) {
      for (let g = MAX_FRAC_BITS; g >= 0 && f === undefined; g--) if (ringBitsFor(cohort, clip, g, noise) <= MAX_RING_BITS) f = g;
      if (f === undefined) throw new SecAggError(`${cohort} devices at clip ${clip} do not fit a 32-bit ring even at 2^0`);
    }
    return new FixedPoint(clip, f, ringBitsFor(cohort, clip, f, noise), cohort, noise);
  }

  /** The bound of every coordinate: B (a compressed round's) or C. */
  get limit(): number {
    return this.bound || this.clip;
  }

  /** Whether the words travel packed at b bits (a compressed round's) or as int32 words. */
  get packed(): boolean {
    return this.bound > 0;
  }

  /** The most a decoded coordinate of a sum of `cohort` blocks differs from the float sum. */
  get errorBound(): number {
    return this.cohort * (2 ** -this.fracBits + this.clip * 2 ** -50);
  }

  /** The most the decoded weight sum differs from the sum of the weights. */
  get weightErrorBound(): number {
    return this.errorBound / this.limit;
  }

  /** One block's words (values in [0, 2^b)): clipped, weighted, scaled, rounded, then the weight coordinate. */
  async encode(update: ArrayLike<number>, weight: number, roundingSeed?: Uint8Array,
    backend?: CryptoBackend): Promise<Uint32Array> {
    const d = update.length;
    if (d + 1 > MAX_WORDS) throw new SecAggError(`a block has at most ${MAX_WORDS - 1} coordinates`);
    const encoder = new BlockEncoder(this, l2Norm([update]), weight, roundingSeed, backend);
    const out = new Uint32Array(d + 1);
    out.set(await encoder.values(update));
    out.set(await encoder.weightWord(), d);
    return out;
  }

  /** The unmasked sum of encoded blocks (words mod 2^b) back to floats, by the centered lift. */
  decode(total: Uint32Array): Decoded {
    if (total.length < 1) throw new SecAggError("a sum to decode is a non-empty array of words");
    const mask = ringMask(this.ringBits);
    const half = 2 ** (this.ringBits - 1);
    const scale = 2 ** -this.fracBits;
    const lift = (w: number) => {
      const v = this.ringBits === MAX_RING_BITS ? w : w & mask;
      return v >= half ? v - 2 ** this.ringBits : v;
    };
    const values = new Float64Array(total.length - 1);
    for (let i = 0; i < values.length; i++) values[i] = lift(total[i]!) * scale;
    return { values, weight: (lift(total[total.length - 1]!) * scale) / this.limit };
  }
}

/**
 * One block's encoding under `fixed`, a slice at a time: `values` for consecutive slices of the
 * block's vector, whose L2 norm is `norm`, then `weightWord` once: the words `FixedPoint.encode`
 * gives for the whole vector (the rounding stream read in the same order).
 */
export class BlockEncoder {
  private readonly s: number;
  private readonly scale: number;
  private readonly limit: number;
  private readonly stream: KeyStream;
  private readonly ring: number;
  private done = false;

  constructor(private readonly fixed: FixedPoint, norm: number, private readonly weight: number, roundingSeed?: Uint8Array,
    backend?: CryptoBackend) {
    if (!(weight >= 0 && weight <= 1)) throw new SecAggError(`the weight must be in [0, 1], got ${weight}`);
    if (!(Number.isFinite(norm) && norm >= 0)) throw new SecAggError(`the update's norm must be finite, got ${norm}`);
    const factor = norm <= fixed.clip ? 1 : fixed.clip / norm;
    this.s = factor * weight;
    this.scale = 2 ** fixed.fracBits;
    this.limit = fixed.limit * this.scale;
    this.ring = ringMask(fixed.ringBits);
    this.stream = new KeyStream(roundingSeed ?? randomBytes(KEY_BYTES), backend);
  }

  /** The words of the next `piece` of the block's vector. */
  async values(piece: ArrayLike<number>): Promise<Uint32Array> {
    if (this.done) throw new SecAggError("a block's values come before its weight word");
    const uniforms = await this.stream.read(piece.length);
    const out = new Uint32Array(piece.length);
    for (let i = 0; i < piece.length; i++) {
      const v = piece[i]!;
      if (!Number.isFinite(v)) throw new SecAggError("the update has NaN or infinite values");
      out[i] = this.round(v * this.s * this.scale, uniforms[i]!);
    }
    return out;
  }

  /** The weight coordinate's word, last. */
  async weightWord(): Promise<Uint32Array> {
    if (this.done) throw new SecAggError("a block has one weight word");
    const uniforms = await this.stream.read(1);
    this.done = true;
    return Uint32Array.of(this.round(this.weight * this.fixed.limit * this.scale, uniforms[0]!));
  }

  private round(raw: number, uniform: number): number {
    const y = Math.min(this.limit, Math.max(-this.limit, raw));
    const low = Math.floor(y);
    const q = low + (uniform * 2 ** -32 < y - low ? 1 : 0);
    return this.fixed.ringBits === MAX_RING_BITS ? q : q & this.ring;
  }
}
