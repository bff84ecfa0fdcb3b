/**
 * Shamir shares of 32-byte secrets, as edge_sdk/secagg/shamir.py, with `shamir-secret-sharing`
 * 0.0.4 (GF(2^8) after HashiCorp Vault; the same field and share layout as Python's `pyshamir`
 * 1.1.0: the secret's bytes evaluated, then the x-coordinate, 33 bytes a share). Given more than
 * `threshold` shares, `combineShares` checks that each extra share gives the same secret with the
 * first threshold - 1 (two polynomials of degree < t that agree on t points are one), so a single
 * altered share is refused rather than combined into a wrong seed.
 */
import { combine, split } from "shamir-secret-sharing";

import { KEY_BYTES } from "./keys.js";
import { SecAggError, checkBytes } from "./labels.js";

export const SHARE_BYTES = KEY_BYTES + 1;
export const MAX_SHARES = 255;

/** `shares` shares of a 32-byte `secret`, any `threshold` of which rebuild it (2 <= t <= n <= 255). */
export async function splitSecret(secret: Uint8Array, shares: number, threshold: number): Promise<Uint8Array[]> {
  checkBytes("secret", secret, KEY_BYTES);
  if (!(Number.isInteger(shares) && Number.isInteger(threshold) && 2 <= threshold && threshold <= shares
    && shares <= MAX_SHARES)) {
    throw new SecAggError(`Shamir needs 2 <= threshold <= shares <= ${MAX_SHARES}, got t=${threshold}, n=${shares}`);
  }
  return split(new Uint8Array(secret), shares, threshold); // the library takes plain Uint8Arrays only, not Buffers
}

function equal(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

/** The 32-byte secret of at least `threshold` shares; every share past the first `threshold` must agree. */
export async function combineShares(shares: Uint8Array[], threshold: number): Promise<Uint8Array> {
  if (!(Number.isInteger(threshold) && 2 <= threshold && threshold <= MAX_SHARES)) {
    throw new SecAggError(`threshold must be in [2, ${MAX_SHARES}], got ${threshold}`);
  }
  if (shares.length < threshold || shares.length > MAX_SHARES) {
    throw new SecAggError(`combining needs between ${threshold} and ${MAX_SHARES} shares, got ${shares.length}`);
  }
  const xs = new Set<number>();
  for (const share of shares) {
    const x = checkBytes("share", share, SHARE_BYTES)[KEY_BYTES]!;
    if (x === 0) throw new SecAggError("a share has x-coordinate 0");
    if (xs.has(x)) throw new SecAggError("two shares have the same x-coordinate");
    xs.add(x);
  }
  const plain = shares.map((share) => new Uint8Array(share));
  const secret = await combine(plain.slice(0, threshold));
  for (const extra of plain.slice(threshold)) {
    if (!equal(await combine([...plain.slice(0, threshold - 1), extra]), secret)) {
      throw new SecAggError(`the share with x-coordinate ${extra[KEY_BYTES]} is not on the polynomial of the others`);
    }
  }
  return secret;
}
