/**
 * Memory sizes as people write them (`512MiB`, `1.5GiB`, `300MB`), for a device's `budget`; the
 * same units and words as the Python device's edge_sdk/units.py. Binary suffixes (KiB, MiB, GiB,
 * TiB) are powers of 1024, decimal ones (kB, MB, GB, TB) powers of 1000; a bare K/M/G/T is binary.
 */
import { pyRepr } from "./pyformat.js";

const UNITS: Record<string, number> = { "": 1, b: 1, k: 1024, kib: 1024, kb: 1000, m: 1024 ** 2, mib: 1024 ** 2, mb: 1000 ** 2,
  g: 1024 ** 3, gib: 1024 ** 3, gb: 1000 ** 3, t: 1024 ** 4, tib: 1024 ** 4, tb: 1000 ** 4 };

const SIZE = /^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$/;

/** Bytes in a size such as `512MiB`, `1.5GiB`, `300MB` or `4096`; an Error naming the accepted units otherwise. */
export function parseSize(text: string): number {
  const m = SIZE.exec(text);
  if (m === null) {
    throw new Error(`not a memory size: ${pyRepr(text)}; write a number with an optional unit, `
      + "e.g. 512MiB, 1.5GiB, 300MB or 4096 (bytes)");
  }
  const unit = m[2]!.toLowerCase();
  if (!(unit in UNITS)) {
    throw new Error(`unknown unit ${pyRepr(m[2])} in ${pyRepr(text)}; use one of B, KiB, MiB, GiB, TiB `
      + "(1024-based), kB, MB, GB, TB (1000-based), K, M, G, T (1024-based)");
  }
  return roundHalfEven(Number(m[1]) * UNITS[unit]!);
}

/** `x` rounded to the nearest integer, halves to the even one (Python's `round`). */
function roundHalfEven(x: number): number {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}
