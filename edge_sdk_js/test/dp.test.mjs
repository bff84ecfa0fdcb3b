// Device-side differential privacy (src/dp.ts): the clip is the Python device's rule (compared on
// the same inputs), the noise shares have the discrete Gaussian's moments and probabilities, and
// every random bit comes from crypto.getRandomValues.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { test } from "node:test";
import { addInRing, clipBlocks, discreteGaussian, noiseShare, secureUniform, shareSigma } from "../dist/index.js";
import { python, pythonEnv } from "./cases.mjs";

/** The discrete Gaussian's probabilities on [-k, k] (normalised over a range holding all the mass) and variance. */
function exact(sigma) {
  const k = Math.ceil(40 * sigma) + 10;
  let total = 0;
  let second = 0;
  const pmf = new Map();
  for (let x = -k; x <= k; x++) {
    const w = Math.exp(-(x * x) / (2 * sigma * sigma));
    pmf.set(x, w);
    total += w;
    second += w * x * x;
  }
  for (const [x, w] of pmf) pmf.set(x, w / total);
  return { pmf, variance: second / total };
}

function moments(xs) {
  let mean = 0;
  for (const x of xs) mean += x;
  mean /= xs.length;
  let variance = 0;
  for (const x of xs) variance += (x - mean) ** 2;
  return { mean, variance: variance / (xs.length - 1) };
}

test("dp: discrete Gaussian samples have mean 0 and the discrete Gaussian's variance", () => {
  const n = 200_000;
  for (const sigma of [0.5, 2, 30, 5000]) {
    const xs = discreteGaussian(sigma, n);
    assert.ok(xs.every(Number.isInteger));
    const { mean, variance } = moments(xs);
    const target = sigma < 1000 ? exact(sigma).variance : sigma * sigma; // beyond, they agree to 1e-300
    // Five standard errors: of the mean sqrt(var / n), of the variance var sqrt(2 / n) (near-Gaussian tails).
    assert.ok(Math.abs(mean) < 5 * Math.sqrt(target / n), `sigma ${sigma}: mean ${mean}`);
    assert.ok(Math.abs(variance - target) < 5 * target * Math.sqrt(2 / n), `sigma ${sigma}: variance ${variance} vs ${target}`);
  }
});

test("dp: discrete Gaussian frequencies match its probabilities (chi-square)", () => {
  const sigma = 1.5;
  const n = 200_000;
  const { pmf } = exact(sigma);
  const counts = new Map();
  for (const x of discreteGaussian(sigma, n)) counts.set(x, (counts.get(x) ?? 0) + 1);
  let chi2 = 0;
  let tail = 0;
  let tailExpected = 0;
  for (const [x, p] of pmf) {
    if (Math.abs(x) <= 5) chi2 += ((counts.get(x) ?? 0) - n * p) ** 2 / (n * p);
    else {
      tail += counts.get(x) ?? 0;
      tailExpected += n * p;
    }
  }
  chi2 += (tail - tailExpected) ** 2 / tailExpected;
  // 11 + 1 cells, 11 degrees of freedom: P(chi2 > 40) < 1e-4.
  assert.ok(chi2 < 40, `chi-square ${chi2}`);
});

test("dp: any nMin survivors' noise shares add up to the target variance", () => {
  const sigma = 600;
  const nMin = 8;
  const n = 100_000;
  const total = new Float64Array(n);
  for (let d = 0; d < nMin; d++) noiseShare(n, sigma, nMin).forEach((v, i) => { total[i] += v; });
  const { variance } = moments(total);
  assert.ok(Math.abs(variance / (sigma * sigma) - 1) < 5 * Math.sqrt(2 / n), `variance ${variance}`);
  assert.equal(shareSigma(1.2, 0.5, 1000, 4), 300);
});

test("dp: noise added in the ring wraps around and survives the modular sum", () => {
  const bits = 20;
  const m = 2 ** bits;
  const values = Uint32Array.from([0, 1, m - 1, 12345]);
  const noise = Float64Array.from([-1, -5, 3, 7 * m + 2]);
  assert.deepEqual([...addInRing(values, noise, bits)], [m - 1, m - 4, 2, 12347]);
  const shares = [noiseShare(4, 1000, 2), noiseShare(4, 1000, 2)];
  const noised = shares.map((s) => addInRing(values, s, bits));
  for (let i = 0; i < 4; i++) {
    const sum = (noised[0][i] + noised[1][i]) % m;
    const expected = (((2 * values[i] + shares[0][i] + shares[1][i]) % m) + m) % m;
    assert.equal(sum, expected);
  }
});

test("dp: uniforms come from crypto.getRandomValues and lie in (0, 1]", () => {
  const original = globalThis.crypto.getRandomValues;
  let calls = 0;
  globalThis.crypto.getRandomValues = function (array) {
    calls++;
    return original.call(globalThis.crypto, array);
  };
  try {
    const u = secureUniform(50_000);
    assert.ok(calls >= 1);
    assert.ok(u.every((x) => x > 0 && x <= 1));
    assert.ok(Math.abs(moments(u).mean - 0.5) < 5 * Math.sqrt(1 / 12 / u.length));
    calls = 0;
    discreteGaussian(3, 10);
    assert.ok(calls >= 1);
  } finally {
    globalThis.crypto.getRandomValues = original;
  }
});

test("dp: the clip never raises a norm, keeps small blocks as they are, and is the Python device's rule", () => {
  const rand = (n, scale) => Float32Array.from({ length: n }, (_, i) => Math.sin(i * 12.9898 + n) * scale);
  const tensors = { "a.w": rand(300, 2), "a.b": rand(7, 1), "b.w": rand(50, 0.001), "c.w": rand(1000, 0.5) };
  const blockOf = { "a.w": "a", "a.b": "a", "b.w": "b", "c.w": "c" };
  const clips = { a: 1.5, b: 1.0, c: 3.0 };
  const out = clipBlocks(tensors, blockOf, clips);
  for (const [block, clip] of Object.entries(clips)) {
    const names = Object.keys(blockOf).filter((n) => blockOf[n] === block);
    const norm = Math.sqrt(names.reduce((s, n) => s + out.tensors[n].reduce((t, v) => t + v * v, 0), 0));
    assert.ok(norm <= Math.min(clip, out.norms[block]), `block ${block}: ${norm} over ${clip}`);
    if (out.norms[block] <= clip) names.forEach((n) => assert.equal(out.tensors[n], tensors[n]));
  }
  assert.equal(out.factors.b, 1);
  assert.ok(out.factors.a < 1);

  const script = `
import json, sys
import numpy as np
from edge_sdk.dp import clip_blocks
case = json.load(sys.stdin)
tensors = {k: np.array(v, dtype=np.float32) for k, v in case["tensors"].items()}
out = clip_blocks(tensors, case["blockOf"], case["clips"])
print(json.dumps({"factors": out.factors, "norms": out.norms,
                  "tensors": {k: [float(x) for x in v] for k, v in out.tensors.items()}}))
`;
  const input = JSON.stringify({ tensors: Object.fromEntries(Object.entries(tensors).map(([k, v]) => [k, [...v]])), blockOf, clips });
  const py = JSON.parse(execFileSync(python(), ["-c", script], { input, env: pythonEnv() }).toString());
  for (const block of Object.keys(clips)) {
    assert.ok(Math.abs(py.factors[block] - out.factors[block]) <= 1e-12 * out.factors[block], `factor of ${block}`);
    assert.ok(Math.abs(py.norms[block] - out.norms[block]) <= 1e-12 * out.norms[block], `norm of ${block}`);
  }
  for (const [name, values] of Object.entries(out.tensors)) {
    values.forEach((v, i) => assert.ok(Math.abs(v - py.tensors[name][i]) <= Math.abs(v) * 2 ** -23, `${name}[${i}]`));
  }
});
