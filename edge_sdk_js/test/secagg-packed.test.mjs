// Compressed secure uploads in JavaScript (edge_sdk/secagg/fixedpoint.py's Compression and pack_words):
// the packed encoding reproduces tests/vectors/secagg_packed.json (written by Python), round-trips bit
// for bit, refuses a wrong length or padding, and a device's compressed round masks with the same mask
// streams reduced to b bits and sends its words packed at b bits.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { decode } from "../dist/index.js";
import * as sa from "../dist/secagg/index.js";
import { wireWords } from "../dist/secagg/exchange.js";
import { REPO } from "./cases.mjs";

const P = JSON.parse(readFileSync(join(REPO, "tests", "vectors", "secagg_packed.json"), "utf8"));
const V = JSON.parse(readFileSync(join(REPO, "tests", "vectors", "secagg_round.json"), "utf8"));
const h = (hex) => Uint8Array.from(Buffer.from(hex, "hex"));
const hex = (bytes) => Buffer.from(bytes).toString("hex");

test("packing matches the vectors", () => {
  for (const c of P.packing) {
    const packed = sa.packWords(Uint32Array.from(c.words), c.bits);
    assert.equal(hex(packed), c.packed);
    assert.equal(packed.length, sa.packedBytes(c.words.length, c.bits));
    assert.deepEqual([...sa.unpackWords(h(c.packed), c.words.length, c.bits)], c.words);
  }
});

for (const b of [sa.webCryptoBackend(globalThis.crypto.subtle), sa.nobleBackend]) {
  test(`${b.name}: compressed plans and encodings match the vectors`, async () => {
    for (const c of P.plans) {
      const fp = new sa.Compression(c.value_bits, c.spread).fixed(c.cohort, c.clip, c.dimension);
      assert.deepEqual([fp.fracBits, fp.ringBits, fp.bound], [c.frac_bits, c.ring_bits, c.bound]);
    }
    for (const c of P.encodings) {
      const fp = new sa.Compression(c.value_bits).fixed(c.cohort, c.clip, c.update.length);
      assert.deepEqual([fp.fracBits, fp.ringBits, fp.bound], [c.frac_bits, c.ring_bits, c.bound]);
      const words = await fp.encode(c.update, c.weight, h(c.rounding_seed), b);
      assert.deepEqual([...words], c.words);
      assert.equal(hex(sa.packWords(words, fp.ringBits)), c.packed);
    }
  });
}

test("packing round-trips bit for bit and refuses a wrong length or padding", () => {
  let state = 7;
  const next = () => (state = (Math.imul(state, 1103515245) + 12345) >>> 0);
  for (const bits of [1, 5, 9, 10, 13, 16, 24, 31, 32]) {
    for (const count of [0, 1, 7, 1000, 4097]) {
      const words = Uint32Array.from({ length: count }, () => (bits === 32 ? next() : next() % 2 ** bits));
      const packed = sa.packWords(words, bits);
      assert.equal(packed.length, Math.ceil((count * bits) / 8));
      assert.deepEqual(sa.unpackWords(packed, count, bits), words);
    }
  }
  const packed = sa.packWords(Uint32Array.from({ length: 11 }, (_, i) => i), 9);  // 99 bits: 13 bytes
  assert.throws(() => sa.unpackWords(packed.subarray(0, 12), 11, 9), /13 bytes/);
  const bad = packed.slice();
  bad[12] |= 0x80;
  assert.throws(() => sa.unpackWords(bad, 11, 9), /padding/);
  assert.equal(new sa.Compression(8).ringBits(256), 16);
  assert.throws(() => new sa.FixedPoint(1, 8, 12, 4, 0.1, 0.5), /noise/);
});

const secrets = { cipherPrivate: h(V.secrets.cipher_private), maskPrivate: h(V.secrets.mask_private), seeds: V.secrets.seeds.map(h) };
const SIZE = 3000;

async function round(fields) {
  const rnd = await sa.DeviceRound.start(V.device, V.secret, sa.scope(V.scope.session, V.scope.round), V.split, V.blocks.length,
    { secrets, backend: sa.nobleBackend });
  await rnd.advertise();
  await rnd.share({ ...decode(h(V.secagg_peers)), ...fields });
  await rnd.receive(decode(h(V.secagg_inbox)).sealed);
  const blocks = V.blocks.slice(V.split).map(() => new Float64Array(SIZE));  // zeros: the words are the masks
  return [rnd, await rnd.mask(blocks, V.num_samples)];
}

test("a compressed round masks with the 32-bit round's mask streams reduced to b bits, and packs its words", async () => {
  const peers = decode(h(V.secagg_peers));
  const ring = new sa.Compression(7).ringBits(peers.cohort);
  const [, plain] = await round({ ring_bits: 32 });
  const [rnd, packed] = await round({ ring_bits: ring, value_bits: 7, value_spread: 4 });
  assert.equal(rnd.fixedFor(SIZE).ringBits, ring);
  for (let i = 0; i < plain.length; i++) {
    for (let j = 0; j < SIZE; j++) assert.equal(packed[i][j], plain[i][j] % 2 ** ring);
    const wire = wireWords(rnd, packed[i]);
    assert.equal(wire.dtype, "uint8");
    assert.equal(wire.data.length, sa.packedBytes(SIZE + 1, ring));
    assert.deepEqual(sa.unpackWords(wire.data, SIZE + 1, ring), packed[i]);
  }
  await assert.rejects(round({ ring_bits: ring - 1, value_bits: 7, value_spread: 4 }), /which need/);
  const trained = V.blocks.map((_, b) => String(b)).slice(V.split);
  await assert.rejects(round({ ring_bits: ring, value_bits: 7, value_spread: 4,
    noise_sigma: Object.fromEntries(trained.map((b) => [b, 4])), noise_survivors: Object.fromEntries(trained.map((b) => [b, 2])) }),
  /a compressed round with distributed noise/);
});
