// Distributed DP in a JavaScript device's secure round (edge_sdk/secagg/round.py's twin): with the
// peers message's noise fields the device adds N_Z(0, sigma_b^2 / n_min_b) to each value word of
// each trained block before masking, leaves the weight word alone, and refuses a ring with no room.
// Two rounds with the same secrets and server messages differ only by the noise, so the masked
// words' difference (mod 2^b, centered) is the device's noise share.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { decode } from "../dist/index.js";
import * as sa from "../dist/secagg/index.js";
import { REPO } from "./cases.mjs";

const V = JSON.parse(readFileSync(join(REPO, "tests", "vectors", "secagg_round.json"), "utf8"));
const SCOPE = sa.scope(V.scope.session, V.scope.round);
const h = (hex) => Uint8Array.from(Buffer.from(hex, "hex"));
const secrets = { cipherPrivate: h(V.secrets.cipher_private), maskPrivate: h(V.secrets.mask_private), seeds: V.secrets.seeds.map(h) };
const SIZE = 4000, SIGMA = 2 ** 18, N_MIN = 2;

async function masked(noise, ringBits = 32) {
  const rnd = await sa.DeviceRound.start(V.device, V.secret, SCOPE, V.split, V.blocks.length, { secrets, backend: sa.nobleBackend });
  await rnd.advertise();
  await rnd.share({ ...decode(h(V.secagg_peers)), ring_bits: ringBits, ...noise });
  await rnd.receive(decode(h(V.secagg_inbox)).sealed);
  const blocks = V.blocks.slice(V.split).map(() => new Float64Array(SIZE));
  return rnd.mask(blocks, V.num_samples);
}

const noiseFor = (blocks) => ({
  noise_sigma: Object.fromEntries(blocks.map((b) => [String(b), SIGMA])),
  noise_survivors: Object.fromEntries(blocks.map((b) => [String(b), N_MIN])),
});
const trained = V.blocks.map((_, b) => b).filter((b) => b >= V.split);

test("the masked value words carry a discrete Gaussian share of spread sigma_b / sqrt(n_min_b); the weight word none", async () => {
  const [bare, noised] = [await masked({}), await masked(noiseFor(trained))];
  for (let i = 0; i < bare.length; i++) {
    const diff = Array.from(noised[i], (w, j) => { const d = (w - bare[i][j] + 2 ** 32) % 2 ** 32; return d >= 2 ** 31 ? d - 2 ** 32 : d; });
    assert.equal(diff[SIZE], 0);  // the weight coordinate is the count, not noised
    const values = diff.slice(0, SIZE);
    const mean = values.reduce((a, b) => a + b, 0) / SIZE;
    const std = Math.sqrt(values.reduce((a, b) => a + (b - mean) ** 2, 0) / SIZE);
    const expected = SIGMA / Math.sqrt(N_MIN);
    assert.ok(Math.abs(std / expected - 1) < 0.06, `spread ${std}, expected ${expected}`);
    assert.ok(Math.abs(mean) < 4 * expected / Math.sqrt(SIZE), `mean ${mean}`);
  }
});

test("a ring with no room for the summed noise, or noise that leaves a trained block bare, is refused", async () => {
  const peers = decode(h(V.secagg_peers));
  const bare = sa.ringBitsFor(peers.cohort, peers.clip, peers.frac_bits);  // room for the values, none for the noise
  assert.ok(bare < sa.ringBitsFor(peers.cohort, peers.clip, peers.frac_bits, SIGMA * Math.sqrt(peers.cohort / N_MIN) / 2 ** peers.frac_bits));
  await assert.rejects(masked(noiseFor(trained), bare), /need a ring/);
  await assert.rejects(masked(noiseFor(trained.slice(1))), /not every block/);
});

test("the ring sizing holds ten standard deviations of the summed noise (fixedpoint.py's rule)", () => {
  assert.equal(sa.ringBitsFor(6, 2, 16, 3 * Math.SQRT2), 23);  // edge_sdk.secagg.fixedpoint.ring_bits_for gives 23 and 21
  assert.equal(sa.ringBitsFor(6, 2, 16), 21);
});
