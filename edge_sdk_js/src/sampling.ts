/**
 * Which local samples a device uses (docs/protocol.md, "The device's training rule"): one
 * generator seeded with the instruction's seed draws the evaluation samples (the first
 * `evalSamples` of a permutation, sorted) and then each step's mini-batch (`batch` distinct
 * samples, sorted). The scheme is the Python device's; the generator is this SDK's own
 * (mulberry32), so the batches differ from a Python device's with the same seed. A plan can be
 * passed in explicitly to reproduce another device's run (the conformance tests do).
 */

export interface SamplePlan {
  evalIdx: Int32Array;
  batches: Int32Array[];
}

/** A small, fast 32-bit generator (mulberry32); `below(n)` draws uniformly without modulo bias. */
export class Rng {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  nextU32(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  }
  below(n: number): number {
    const limit = 0x100000000 - (0x100000000 % n);
    for (;;) {
      const v = this.nextU32();
      if (v < limit) return v % n;
    }
  }
}

/** The first `k` entries of a uniform random permutation of [0, n) (partial Fisher-Yates). */
function draw(rng: Rng, n: number, k: number): Int32Array {
  const idx = new Int32Array(n);
  for (let i = 0; i < n; i++) idx[i] = i;
  for (let i = 0; i < k; i++) {
    const j = i + rng.below(n - i);
    const tmp = idx[i]!;
    idx[i] = idx[j]!;
    idx[j] = tmp;
  }
  return idx.slice(0, k).sort();
}

export function samplePlan(n: number, cfg: { localSteps: number; batchSize: number; evalSamples: number; seed: number }): SamplePlan {
  const rng = new Rng(cfg.seed);
  const evalIdx = draw(rng, n, Math.min(cfg.evalSamples, n));
  const batch = Math.min(cfg.batchSize, n);
  const batches: Int32Array[] = [];
  for (let t = 0; t < cfg.localSteps; t++) batches.push(draw(rng, n, batch));
  return { evalIdx, batches };
}

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

export function crc32(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xff]! ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** The local sampling seed: differs per device and round, the same on every run (as edge_sdk.client.device_seed). */
export function deviceSeed(roundSeed: number, deviceId: string): number {
  const value = BigInt(roundSeed) * 1_000_003n + BigInt(crc32(new TextEncoder().encode(deviceId)));
  const mod = ((value % 2n ** 31n) + 2n ** 31n) % 2n ** 31n;
  return Number(mod);
}
