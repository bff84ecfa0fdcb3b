/**
 * Mask expansion, as edge_sdk/secagg/masks.py: a 32-byte seed is the AES-256-CTR key of a
 * keystream (zero counter block) read as little-endian uint32 words; a ring element of Z_{2^b}
 * (b <= 32) is a word's low b bits. A device adds its self mask and, for each neighbour, the pair
 * mask with sign +1 if its id sorts before the neighbour's (UTF-8 bytes), -1 otherwise; the server
 * removes survivors' self masks and, for each dropped device, adds what it would have added
 * (`removeMasks`). Uint32Array stores wrap modulo 2^32, and 2^b divides 2^32. A device reads its
 * masks a slice at a time (`MaskStream`): a CTR keystream read in consecutive slices is the same
 * bytes as read at once, and masking a block costs its words plus a slice.
 */
import { type CryptoBackend, selectBackend } from "./backend.js";
import { KEY_BYTES } from "./keys.js";
import { SecAggError, checkBytes, compareIds } from "./labels.js";

export const MAX_RING_BITS = 32;
export const MAX_WORDS = 2 ** 28;

const LITTLE_ENDIAN = new Uint8Array(Uint32Array.of(1).buffer)[0] === 1;

/** 2^b - 1: the bits of a word that are a ring element of Z_{2^b}. */
export function ringMask(bits: number): number {
  if (!Number.isInteger(bits) || bits < 1 || bits > MAX_RING_BITS) {
    throw new SecAggError(`ring bits must be an integer in [1, ${MAX_RING_BITS}], got ${bits}`);
  }
  return 2 ** bits - 1;
}

function checkCount(count: number): number {
  if (!Number.isInteger(count) || count < 0 || count > MAX_WORDS) {
    throw new SecAggError(`a mask has between 0 and ${MAX_WORDS} words, got ${count}`);
  }
  return count;
}

/** The little-endian uint32 words of the AES-256-CTR keystream of `seed`, read in order. */
export class KeyStream {
  private at = 0; // bytes read so far
  constructor(private readonly seed: Uint8Array, private readonly backend?: CryptoBackend) {
    if (!LITTLE_ENDIAN) throw new SecAggError("mask expansion assumes a little-endian platform");
    checkBytes("mask seed", seed, KEY_BYTES);
  }

  /** The next `count` words of the stream. */
  async read(count: number): Promise<Uint32Array> {
    const start = this.at; // claimed before any await: reads return consecutive words in call order
    this.at += 4 * checkCount(count);
    const skip = start % 16; // a multiple of 4: the words' place in their keystream block
    const bytes = Math.ceil((skip + 4 * count) / 16) * 16;
    const b = this.backend ?? (await selectBackend());
    const stream = await b.aesCtrKeystream(this.seed, bytes, (start - skip) / 16);
    const aligned = stream.byteOffset % 4 === 0 ? stream : new Uint8Array(stream);
    return new Uint32Array(aligned.buffer, aligned.byteOffset + skip, count);
  }
}

/** The first `count` little-endian uint32 words of the AES-256-CTR keystream of `seed`. */
export async function expandWords(seed: Uint8Array, count: number, backend?: CryptoBackend): Promise<Uint32Array> {
  return new KeyStream(seed, backend).read(count);
}

/** `count` elements of Z_{2^bits} expanded from `seed`. */
export async function expandMask(seed: Uint8Array, count: number, bits: number, backend?: CryptoBackend): Promise<Uint32Array> {
  const mask = ringMask(bits);
  const words = await expandWords(seed, count, backend);
  if (bits < MAX_RING_BITS) for (let i = 0; i < words.length; i++) words[i] = words[i]! & mask;
  return words;
}

/** +1 if `me` sorts before `other` (UTF-8 bytes), -1 if after: the sign of their pair mask in me's upload. */
export function pairwiseSign(me: string, other: string): 1 | -1 {
  if (me === other) throw new SecAggError(`a device has no pair mask with itself (${JSON.stringify(me)})`);
  return compareIds(me, other) < 0 ? 1 : -1;
}

function reduce(words: Uint32Array, bits: number): Uint32Array {
  const mask = ringMask(bits);
  if (bits < MAX_RING_BITS) for (let i = 0; i < words.length; i++) words[i] = words[i]! & mask;
  return words;
}

function sameLength(a: Uint32Array, b: Uint32Array): void {
  if (a.length !== b.length) throw new SecAggError(`ring vectors of ${a.length} and ${b.length} words`);
}

/** a + b in Z_{2^bits}, element-wise (a new array). */
export function addMod(a: Uint32Array, b: Uint32Array, bits: number): Uint32Array {
  sameLength(a, b);
  const out = new Uint32Array(a.length);
  for (let i = 0; i < a.length; i++) out[i] = a[i]! + b[i]!;
  return reduce(out, bits);
}

/** a - b in Z_{2^bits}, element-wise (a new array). */
export function subMod(a: Uint32Array, b: Uint32Array, bits: number): Uint32Array {
  sameLength(a, b);
  const out = new Uint32Array(a.length);
  for (let i = 0; i < a.length; i++) out[i] = a[i]! - b[i]!;
  return reduce(out, bits);
}

export interface MaskSeeds {
  /** The device's self-mask seed for this block, if its self mask is part of the total. */
  readonly selfSeed?: Uint8Array;
  /** Neighbour id -> the pair's mask seed for this block. */
  readonly pairSeeds?: ReadonlyMap<string, Uint8Array>;
}

/** The mask device `me` adds to one block, read a slice at a time: its self mask plus each
 * neighbour's signed pair mask. Slices read in order are the words of `combinedMask`. */
export class MaskStream {
  private readonly self: KeyStream | undefined;
  private readonly pairs: [boolean, KeyStream][] = [];
  constructor(private readonly bits: number, me: string, seeds: MaskSeeds, backend?: CryptoBackend) {
    ringMask(bits);
    this.self = seeds.selfSeed === undefined ? undefined : new KeyStream(seeds.selfSeed, backend);
    for (const [other, seed] of seeds.pairSeeds ?? new Map<string, Uint8Array>()) {
      this.pairs.push([pairwiseSign(me, other) > 0, new KeyStream(seed, backend)]);
    }
  }

  /** The mask's next `count` words, elements of Z_{2^bits}. */
  async read(count: number): Promise<Uint32Array> {
    const total = new Uint32Array(checkCount(count));
    if (this.self !== undefined) total.set(await this.self.read(count));
    for (const [plus, stream] of this.pairs) {
      const words = await stream.read(count);
      if (plus) for (let i = 0; i < count; i++) total[i] = total[i]! + words[i]!;
      else for (let i = 0; i < count; i++) total[i] = total[i]! - words[i]!;
    }
    return reduce(total, this.bits);
  }
}

/** The whole mask device `me` adds to one block of `count` words (`MaskStream`). */
export async function combinedMask(count: number, bits: number, me: string, seeds: MaskSeeds,
  backend?: CryptoBackend): Promise<Uint32Array> {
  return new MaskStream(bits, me, seeds, backend).read(count);
}

/**
 * The server's unmasking of one block's sum: subtract each survivor's self mask (`selfSeeds`:
 * survivor -> seed) and add, for each dropped device, its pair masks with surviving neighbours
 * (`dropped`: dropped id -> survivor id -> seed).
 */
export async function removeMasks(total: Uint32Array, bits: number, selfSeeds: ReadonlyMap<string, Uint8Array>,
  dropped: ReadonlyMap<string, ReadonlyMap<string, Uint8Array>>, backend?: CryptoBackend): Promise<Uint32Array> {
  let out = reduce(Uint32Array.from(total), bits);
  for (const [device, seed] of selfSeeds) {
    out = subMod(out, await combinedMask(out.length, bits, device, { selfSeed: seed }, backend), bits);
  }
  for (const [device, pairSeeds] of dropped) {
    out = addMod(out, await combinedMask(out.length, bits, device, { pairSeeds }, backend), bits);
  }
  return out;
}
