/**
 * The neighbour graph, as edge_sdk/secagg/graph.py (its docstring gives the construction): the
 * cohort's ids sorted by UTF-8 bytes, shuffled by Fisher-Yates from the AES-256-CTR stream keyed by
 * HKDF(seed, label("graph", session, round, block)) with rejection sampling, placed on a ring,
 * each joined to the k/2 devices on either side (complete for at most k + 1 devices); threshold
 * floor((deg + 1) / 2) + 1 of a device's deg + 1 shares.
 */
import type { CryptoBackend } from "./backend.js";
import { KEY_BYTES, hkdf } from "./keys.js";
import { type Scope, SecAggError, checkBytes, compareIds, label } from "./labels.js";
import { expandWords } from "./masks.js";
import { MAX_SHARES } from "./shamir.js";

export const COMPLETE_UP_TO = 32;

/** k for a cohort of n: n - 1 up to 32 devices, else the smallest even k with 2^k >= n^3 (k >= 3 log2 n). */
export function defaultDegree(cohort: number): number {
  if (cohort <= COMPLETE_UP_TO) return Math.max(cohort - 1, 0);
  let k = 2;
  while (2n ** BigInt(k) < BigInt(cohort) ** 3n) k += 2;
  return Math.min(cohort - 1, k);
}

export interface Graph {
  readonly order: readonly string[];
  readonly neighbours: ReadonlyMap<string, readonly string[]>;
  readonly threshold: ReadonlyMap<string, number>;
}

/** `members` sorted by UTF-8 bytes, then shuffled by Fisher-Yates from `key`'s stream. */
export async function shuffled(key: Uint8Array, members: readonly string[], backend?: CryptoBackend): Promise<string[]> {
  const order = [...members].sort(compareIds);
  let count = 2 * order.length + 16;
  let words = await expandWords(key, count, backend);
  let position = 0;
  for (let i = order.length - 1; i > 0; i--) {
    const bound = i + 1;
    const limit = 2 ** 32 - (2 ** 32 % bound);
    let j = -1;
    while (j < 0) {
      if (position >= words.length) {
        count *= 2;
        words = await expandWords(key, count, backend); // a longer prefix of the same stream
      }
      const w = words[position++]!;
      if (w < limit) j = w % bound;
    }
    [order[i], order[j]] = [order[j]!, order[i]!];
  }
  return order;
}

/** The neighbour graph of `members` for `block` in `scope` from the public 32-byte `seed`; `degree` even, or n - 1. */
export async function neighbourGraph(seed: Uint8Array, scope: Scope, block: number, members: readonly string[],
  degree?: number, backend?: CryptoBackend): Promise<Graph> {
  const n = members.length;
  if (n < 2 || new Set(members).size !== n) throw new SecAggError(`a neighbour graph needs at least 2 distinct devices, got ${n}`);
  const k = degree ?? defaultDegree(n);
  if (!Number.isInteger(k) || k < 1 || k + 1 > MAX_SHARES) {
    throw new SecAggError(`degree must be an integer in [1, ${MAX_SHARES - 1}], got ${k}`);
  }
  if (k < n - 1 && k % 2) throw new SecAggError(`a sparse graph needs an even degree, got ${k}`);
  const key = await hkdf(checkBytes("graph seed", seed, KEY_BYTES), label("graph", scope.session, scope.round, block),
    KEY_BYTES, backend);
  const order = await shuffled(key, members, backend);
  const rank = new Map([...order].sort(compareIds).map((m, i) => [m, i])); // sort keys, encoded once
  const byId = (a: string, b: string) => rank.get(a)! - rank.get(b)!;
  const neighbours = new Map<string, string[]>();
  const threshold = new Map<string, number>();
  order.forEach((m, p) => {
    const near = k >= n - 1 ? order.filter((o) => o !== m)
      : Array.from({ length: k }, (_, i) => order[(p + (i < k / 2 ? i - k / 2 : i - k / 2 + 1) + n) % n]!);
    near.sort(byId);
    neighbours.set(m, near);
    threshold.set(m, Math.floor((near.length + 1) / 2) + 1);
  });
  return { order, neighbours, threshold };
}
