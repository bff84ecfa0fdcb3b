/**
 * The randomized Hadamard transform and the pairwise summation tree, bit for bit as
 * edge_sdk/codecs/hadamard.py: float32 butterflies in passes h = 1, 2, 4, ... (a Float32Array store
 * rounds each float64 sum of two float32 values once, which is float32's own correctly rounded sum),
 * then one multiplication by float32(1/sqrt(d)).
 */

/** In-place Walsh-Hadamard transform of `x[off, off + d)`, d a power of two. */
export function fwht(x: Float32Array, off: number, d: number): void {
  for (let h = 1; h < d; h *= 2) {
    for (let i = off; i < off + d; i += 2 * h) {
      for (let j = i; j < i + h; j++) {
        const a = x[j]!, b = x[j + h]!;
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

export function invSqrt(d: number): number {
  return Math.fround(1 / Math.sqrt(d));
}

/** `H (signs * x) * float32(1/sqrt(d))` for `x[off, off + d)`, in place. */
export function rotate(x: Float32Array, signs: Float32Array, off: number, d: number): void {
  for (let i = off; i < off + d; i++) x[i] = x[i]! * signs[i]!;
  fwht(x, off, d);
  const s = invSqrt(d);
  for (let i = off; i < off + d; i++) x[i] = x[i]! * s;
}

/** `H y * float32(1/sqrt(d)) * signs` for `y[off, off + d)`, in place: the inverse of rotate. */
export function unrotate(y: Float32Array, signs: Float32Array, off: number, d: number): void {
  fwht(y, off, d);
  const s = invSqrt(d);
  for (let i = off; i < off + d; i++) y[i] = Math.fround(y[i]! * s) * signs[i]!;
}

/** Pairwise sum of float64 `v` (length a power of two): v <- v[0::2] + v[1::2] until one is left. Destroys v. */
export function treeSum(v: Float64Array): number {
  for (let len = v.length; len > 1; len /= 2) {
    for (let i = 0; i < len / 2; i++) v[i] = v[2 * i]! + v[2 * i + 1]!;
  }
  return v.length ? v[0]! : 0;
}
