/**
 * Differential privacy on the device: per-block clipping and distributed discrete Gaussian noise
 * shares, the same rule as the Python device (edge_sdk/dp.py; docs/security.md, "Differential
 * privacy: accounting and noise").
 *
 * Clipping (McMahan et al., 2018, per-layer clipping): each block's float tensors are scaled by
 * min(1, C_b / ||g||_2), the norm taken in float64; a block over its clip is scaled by that factor
 * times 1 - 8 eps of its dtype (float32: ~1e-6) so that rounding never leaves its norm above C_b; a
 * block within its clip is returned unchanged.
 *
 * Noise shares (Kairouz, Liu, Steinke, 2021): under secure aggregation each device adds integer
 * noise N_Z(0, sigma^2 / nMin) to its quantised update in the ring, so that any nMin survivors'
 * shares together have variance at least sigma^2. The discrete Gaussian is sampled with Canonne,
 * Kamath, Steinke (2020), Algorithm 3: a discrete Laplace proposal of scale t = floor(sigma) + 1
 * (the difference of two geometric draws floor(t E), E ~ Exp(1)), kept with probability
 * exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2)), in float64 as the Python device does.
 *
 * Every random bit comes from crypto.getRandomValues (WebCrypto, in Node >= 20 and in browsers),
 * never from Math.random.
 */

/** Float tensors a device clips; integer tensors (counters) pass through. */
export type FloatData = Float32Array | Float64Array;

const UNIT = 2 ** -53;
const MAX_RANDOM_BYTES = 65536; // getRandomValues' limit per call

/** n uniforms on (0, 1] with 53 random bits each from the CSPRNG: ((a >>> 5) 2^26 + (b >>> 6) + 1) 2^-53. */
export function secureUniform(n: number): Float64Array {
  const out = new Float64Array(n);
  const words = new Uint32Array(Math.min(2 * n, MAX_RANDOM_BYTES / 4) || 2);
  for (let i = 0; i < n; ) {
    globalThis.crypto.getRandomValues(words);
    for (let j = 0; j + 1 < words.length && i < n; j += 2, i++) {
      out[i] = ((words[j] >>> 5) * 67108864 + (words[j + 1] >>> 6) + 1) * UNIT;
    }
  }
  return out;
}

function machineEpsilon(data: FloatData): number {
  return data instanceof Float32Array ? 2 ** -23 : 2 ** -52;
}

/** The factor a block of L2 norm `norm` is multiplied by to clip it to `clip` (see the module comment). */
export function clipFactor(norm: number, clip: number, eps: number = 2 ** -23): number {
  if (!(clip > 0) || !Number.isFinite(clip)) throw new RangeError(`a clip must be a finite number > 0, got ${clip}`);
  if (!Number.isFinite(norm)) throw new RangeError(`cannot clip an update whose norm is ${norm}`);
  return norm <= clip ? 1 : (clip / norm) * (1 - 8 * eps);
}

export interface Clipped {
  tensors: Record<string, FloatData>;
  /** Each block's norm before clipping. */
  norms: Record<string, number>;
  /** The factor each block was multiplied by (1: within its clip, unchanged). */
  factors: Record<string, number>;
}

/** Clip each block of `tensors` (`blockOf`: tensor name -> block) to its L2 bound `clips[block]`. */
export function clipBlocks(tensors: Record<string, FloatData>, blockOf: Record<string, string>,
  clips: Record<string, number>): Clipped {
  const groups = new Map<string, string[]>();
  for (const name of Object.keys(tensors)) {
    const block = blockOf[name];
    if (block === undefined) throw new RangeError(`tensor ${name} belongs to no block`);
    groups.set(block, [...(groups.get(block) ?? []), name]);
  }
  const out: Clipped = { tensors: { ...tensors }, norms: {}, factors: {} };
  for (const [block, names] of groups) {
    const clip = clips[block];
    if (clip === undefined) throw new RangeError(`no clip for block ${block}`);
    let squares = 0;
    let eps = 0;
    for (const n of names) {
      for (const v of tensors[n]) squares += v * v;
      eps = Math.max(eps, machineEpsilon(tensors[n]));
    }
    const norm = Math.sqrt(squares);
    const factor = clipFactor(norm, clip, eps);
    out.norms[block] = norm;
    out.factors[block] = factor;
    if (factor < 1) {
      for (const n of names) out.tensors[n] = tensors[n].map((v) => v * factor) as FloatData;
    }
  }
  return out;
}

/** n samples of the discrete Gaussian N_Z(0, sigma^2), integers held in a Float64Array (exact to 2^53). */
export function discreteGaussian(sigma: number, n: number): Float64Array {
  if (!(sigma >= 0) || !Number.isFinite(sigma)) throw new RangeError(`sigma must be a finite number >= 0, got ${sigma}`);
  const out = new Float64Array(n);
  if (sigma === 0) return out;
  const t = Math.floor(sigma) + 1;
  const shift = (sigma * sigma) / t;
  const scale = 2 * sigma * sigma;
  let filled = 0;
  while (filled < n) {
    const draw = Math.ceil((n - filled) * 1.8) + 64;
    const u = secureUniform(3 * draw);
    for (let i = 0; i < draw && filled < n; i++) {
      const y = Math.floor(-t * Math.log(u[i])) - Math.floor(-t * Math.log(u[draw + i]));
      const d = Math.abs(y) - shift;
      if (u[2 * draw + i] <= Math.exp(-(d * d) / scale)) out[filled++] = y;
    }
  }
  return out;
}

/** One device's share's standard deviation in ring units: z C scale / sqrt(minSurvivors). */
export function shareSigma(noiseMultiplier: number, clip: number, scale: number, minSurvivors: number): number {
  if (!(minSurvivors >= 1)) throw new RangeError(`minSurvivors must be >= 1, got ${minSurvivors}`);
  if (!(noiseMultiplier >= 0 && clip > 0 && scale > 0)) throw new RangeError("noiseMultiplier must be >= 0 and clip and scale > 0");
  return (noiseMultiplier * clip * scale) / Math.sqrt(minSurvivors);
}

/** One device's integer noise share: N_Z(0, sigma^2 / minSurvivors) per coordinate. */
export function noiseShare(n: number, sigma: number, minSurvivors: number): Float64Array {
  if (!(minSurvivors >= 1)) throw new RangeError(`minSurvivors must be >= 1, got ${minSurvivors}`);
  return discreteGaussian(sigma / Math.sqrt(minSurvivors), n);
}

/** (values + noise) mod 2^bits for quantised values in [0, 2^bits), bits <= 32. */
export function addInRing(values: Uint32Array, noise: Float64Array, bits: number): Uint32Array {
  if (!(bits >= 1 && bits <= 32)) throw new RangeError(`a ring of 2^${bits} is not supported here (1 to 32 bits)`);
  if (values.length !== noise.length) throw new RangeError("values and noise differ in length");
  const m = 2 ** bits;
  const out = new Uint32Array(values.length);
  for (let i = 0; i < values.length; i++) {
    const r = (values[i] + (noise[i] % m)) % m;
    out[i] = r < 0 ? r + m : r;
  }
  return out;
}
