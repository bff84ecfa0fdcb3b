/**
 * Randomness for the codecs (edge_sdk/codecs/stream.py): SHAKE128(label || u64le(seed)) read to the
 * length needed, the same bytes as Python's hashlib; or the system's (crypto.getRandomValues) in production.
 */
import { shake128 } from "@noble/hashes/sha3.js";

export const EDEN_LABEL = "edgetrain.codecs.eden.v1";
export const SR_LABEL = "edgetrain.codecs.sr.v1";
export type Seed = bigint | number;

export function seedBig(seed: Seed): bigint {
  const s = BigInt(seed);
  if (s < 0n || s >= 1n << 64n || (typeof seed === "number" && !Number.isSafeInteger(seed))) {
    throw new RangeError(`a seed is an integer in [0, 2^64), got ${seed}`);
  }
  return s;
}

/** `n` bytes of SHAKE128(label || u64le(seed)). */
export function seededBytes(label: string, seed: Seed, n: number): Uint8Array {
  const msg = new Uint8Array(label.length + 8);
  msg.set(new TextEncoder().encode(label));
  new DataView(msg.buffer).setBigUint64(label.length, seedBig(seed), true);
  return shake128(msg, { dkLen: n });
}

/** `n` bytes from the system's cryptographic generator. */
export function systemBytes(n: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let at = 0; at < n; at += 65536) globalThis.crypto.getRandomValues(out.subarray(at, Math.min(n, at + 65536)));
  return out;
}

/** `n` uniform uint32, element i from bytes [4i, 4i + 4) little-endian; the system's when `seed` is undefined. */
export function uniformU32(n: number, seed?: Seed, label = SR_LABEL): Uint32Array {
  const bytes = seed === undefined ? systemBytes(4 * n) : seededBytes(label, seed, 4 * n);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Uint32Array(n);
  for (let i = 0; i < n; i++) out[i] = dv.getUint32(4 * i, true);
  return out;
}

/** A fresh 64-bit seed from the system's generator. */
export function newSeed(): bigint {
  const b = systemBytes(8);
  return new DataView(b.buffer).getBigUint64(0, true);
}
