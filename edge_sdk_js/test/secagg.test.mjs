// Secure aggregation's building blocks in JavaScript reproduce tests/vectors/secagg.json (written by
// Python's edge_sdk.secagg), on WebCrypto and on @noble/* alike; Shamir shares cross between the
// two languages both ways; the noble path runs where `crypto.subtle` is absent (a page on plain http),
// and both run in Chromium.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import * as sa from "../dist/secagg/index.js";
import { CHROMIUM, openPage, servePage } from "./browser.mjs";
import { REPO, python, pythonEnv } from "./cases.mjs";
import { tempDir } from "./tmp.mjs";

const V = JSON.parse(readFileSync(join(REPO, "tests", "vectors", "secagg.json"), "utf8"));
const SCOPE = sa.scope(V.scope.session, V.scope.round);
const h = (hex) => Uint8Array.from(Buffer.from(hex, "hex"));
const hex = (bytes) => Buffer.from(bytes).toString("hex");
const BACKENDS = [sa.webCryptoBackend(globalThis.crypto.subtle), sa.nobleBackend];
const field = (typed) => ("hex" in typed ? h(typed.hex) : typed.text ?? typed.int);
const sha256Words = (words) => createHash("sha256").update(Buffer.from(words.buffer, words.byteOffset, words.byteLength)).digest("hex");

test("labels have the documented layout", () => {
  for (const c of V.labels) assert.equal(hex(sa.label(c.purpose, ...c.fields.map(field))), c.bytes);
});

for (const b of BACKENDS) {
  test(`${b.name}: X25519 matches RFC 7748 and the vectors, and refuses small-order points`, async () => {
    const rfc = V.x25519.rfc7748;
    assert.equal(hex(await sa.publicKey(h(rfc.alice_private), b)), rfc.alice_public);
    assert.equal(hex(await sa.agree(h(rfc.alice_private), h(rfc.bob_public), b)), rfc.shared);
    const keys = new Map(V.x25519.keys.map((k) => [k.id, k]));
    for (const k of keys.values()) assert.equal(hex(await sa.publicKey(h(k.private), b)), k.public);
    for (const p of V.x25519.agreements) {
      assert.equal(hex(await sa.agree(h(keys.get(p.b).private), h(keys.get(p.a).public), b)), p.shared);
    }
    for (const point of V.x25519.small_order) {
      await assert.rejects(sa.agree(h(V.x25519.keys[0].private), h(point), b), /small order/);
    }
    const pair = await sa.generateKeyPair(b);
    assert.equal(hex(await sa.publicKey(pair.privateKey, sa.nobleBackend)), hex(pair.publicKey));
  });

  test(`${b.name}: HKDF matches RFC 5869 and the derivations`, async () => {
    const rfc = V.hkdf.rfc5869_case3;
    assert.equal(hex(await sa.hkdf(h(rfc.ikm), h(rfc.info), rfc.length, b)), rfc.okm);
    const sk = V.hkdf.share_key;
    assert.equal(hex(await sa.shareKey(h(sk.shared), SCOPE, sk.b, sk.a, b)), sk.key);
    for (const c of V.hkdf.pair_mask_seed) {
      assert.equal(hex(await sa.pairMaskSeed(h(c.shared), SCOPE, c.block, c.a, c.b, b)), c.seed);
    }
    for (const c of V.hkdf.self_mask_seed) {
      assert.equal(hex(await sa.selfMaskSeed(h(c.seed), SCOPE, c.block, c.device, b)), c.out);
    }
    for (const c of V.hkdf.seed_commitment) {
      assert.equal(hex(await sa.seedCommitment(h(c.seed), SCOPE, c.block, c.device, b)), c.out);
    }
  });

  test(`${b.name}: masks, sealed shares, graphs and fixed point match the vectors`, async () => {
    for (const c of V.masks) {
      const words = await sa.expandMask(h(c.seed), 1000, c.bits, b);
      assert.deepEqual([...words.slice(0, 8)], c.first);
      assert.equal(sha256Words(words), c.sha256_1000);
    }
    for (const c of V.sealing) {
      const sealed = await sa.sealShares(h(c.key), SCOPE, c.sender, c.receiver, c.seed_shares.map(h), h(c.mask_key_share),
        { nonce: h(c.nonce), backend: b });
      assert.equal(hex(sealed), c.sealed);
      const [seeds, key] = await sa.openShares(h(c.key), SCOPE, c.sender, c.receiver, sealed, c.seed_shares.length, b);
      assert.deepEqual([seeds.map(hex), hex(key)], [c.seed_shares, c.mask_key_share]);
    }
    for (const c of V.graph.graphs) {
      const g = await sa.neighbourGraph(h(c.seed), SCOPE, c.block, c.members, c.degree ?? undefined, b);
      assert.deepEqual(g.order, c.order);
      assert.deepEqual(Object.fromEntries(g.neighbours), c.neighbours);
      assert.deepEqual(Object.fromEntries(g.threshold), c.threshold);
    }
    for (const c of V.fixed_point.encodings) {
      const fp = new sa.FixedPoint(c.clip, c.frac_bits, c.ring_bits, c.cohort);
      assert.deepEqual([...(await fp.encode(c.update, c.weight, h(c.rounding_seed), b))], c.words);
    }
  });

  test(`${b.name}: a round masks and unmasks over nested cohorts with a dropout, as in Python`, async () => {
    const r = V.round;
    const fp = new sa.FixedPoint(r.fixed_point.clip, r.fixed_point.frac_bits, r.fixed_point.ring_bits, r.fixed_point.cohort);
    const sk = Object.fromEntries(Object.entries(r.mask_private).map(([d, k]) => [d, h(k)]));
    const pk = Object.fromEntries(await Promise.all(Object.keys(sk).map(async (d) => [d, await sa.publicKey(sk[d], b)])));
    const pairSeed = async (u, v, block) => sa.pairMaskSeed(await sa.agree(sk[u], pk[v], b), SCOPE, block, u, v, b);
    for (const blk of r.blocks) {
      let total = new Uint32Array(blk.size + 1);
      for (const [d, up] of Object.entries(blk.uploads)) {
        const rounding = createHash("sha256").update(`edgetrain secagg vector rounding ${d} ${blk.block}`).digest();
        const encoded = await fp.encode(up.update, up.weight, new Uint8Array(rounding), b);
        assert.deepEqual([...encoded], up.encoded);
        const pairSeeds = new Map();
        for (const v of blk.cohort) if (v !== d) pairSeeds.set(v, await pairSeed(d, v, blk.block));
        const selfSeed = await sa.selfMaskSeed(h(r.self_seed[d]), SCOPE, blk.block, d, b);
        const masked = sa.addMod(encoded, await sa.combinedMask(blk.size + 1, fp.ringBits, d, { selfSeed, pairSeeds }, b), fp.ringBits);
        assert.deepEqual([...masked], up.masked);
        if (d !== r.dropped) total = sa.addMod(total, masked, fp.ringBits);
      }
      assert.deepEqual([...total], blk.masked_sum);
      const selfSeeds = new Map();
      for (const v of blk.survivors) selfSeeds.set(v, await sa.selfMaskSeed(h(r.self_seed[v]), SCOPE, blk.block, v, b));
      const dropped = new Map();
      if (blk.cohort.includes(r.dropped)) {
        const seeds = new Map();
        for (const v of blk.survivors) seeds.set(v, await pairSeed(r.dropped, v, blk.block));
        dropped.set(r.dropped, seeds);
      }
      const unmasked = await sa.removeMasks(total, fp.ringBits, selfSeeds, dropped, b);
      assert.deepEqual([...unmasked], blk.unmasked);
      const decoded = fp.decode(unmasked);
      assert.deepEqual([...decoded.values], blk.decoded.values);
      assert.equal(decoded.weight, blk.decoded.weight);
    }
  });
}

for (const b of BACKENDS) {
  test(`${b.name}: a block encoded and masked slice by slice is the whole block's words`, async () => {
    // A device reads its keystreams a slice at a time (round.ts): slices of 1 to 7 words cross the
    // keystream's 16-byte blocks at every offset, and entries' boundaries fall inside slices.
    const seed = h(V.masks[0].seed);
    const whole = await sa.expandWords(seed, 300, b);
    for (const size of [1, 2, 3, 5, 7, 64]) {
      const stream = new sa.KeyStream(seed, b);
      const read = [];
      for (let at = 0; at < 300; at += size) read.push(...(await stream.read(Math.min(size, 300 - at))));
      assert.deepEqual(read, [...whole], `slices of ${size}`);
    }
    const parts = [Float32Array.from({ length: 37 }, (_, i) => Math.sin(i) * 3), new Float32Array(0),
      Float64Array.from({ length: 20 }, (_, i) => i / 7 - 1)];
    const vector = Float64Array.from(parts.flatMap((p) => [...p]));
    const fp = sa.FixedPoint.plan(3, 2.5);
    const rounding = h(V.masks[1].seed);
    const encoder = new sa.BlockEncoder(fp, sa.l2Norm(sa.slices(parts, 6)), 0.75, rounding, b);
    const words = [];
    for (const piece of sa.slices(parts, 6)) words.push(...(await encoder.values(piece)));
    words.push(...(await encoder.weightWord()));
    assert.deepEqual(words, [...(await fp.encode(vector, 0.75, rounding, b))]);
    const seeds = { selfSeed: seed, pairSeeds: new Map([["a", h(V.masks[1].seed)], ["c", h(V.masks[2].seed)]]) };
    const masks = new sa.MaskStream(fp.ringBits, "b", seeds, b);
    const read = [];
    for (let at = 0; at < words.length; at += 6) read.push(...(await masks.read(Math.min(6, words.length - at))));
    assert.deepEqual(read, [...(await sa.combinedMask(words.length, fp.ringBits, "b", seeds, b))]);
  });
}

test("identity keys and key advertisements match Python's, and refuse another round, device or key", async () => {
  for (const c of V.identity) {
    const keys = [h(c.cipher_public), h(c.mask_public), c.split, h(c.commitments)];
    assert.equal(hex(await sa.identityPublicKey(c.secret, c.device)), c.public);
    assert.equal(hex(sa.advertisementMessage(SCOPE, c.device, ...keys)), c.message);
    assert.equal(hex(await sa.signAdvertisement(c.secret, c.device, SCOPE, ...keys)), c.signature);
    sa.verifyAdvertisement(h(c.public), c.device, SCOPE, ...keys, h(c.signature));
    assert.throws(() => sa.verifyAdvertisement(h(c.public), c.device, sa.scope(V.scope.session, V.scope.round + 1), ...keys,
      h(c.signature)), /not signed/);
    assert.throws(() => sa.verifyAdvertisement(h(c.public), `${c.device}x`, SCOPE, ...keys, h(c.signature)), /not signed/);
    assert.throws(() => sa.verifyAdvertisement(h(c.public), c.device, SCOPE, keys[1], keys[0], keys[2], keys[3], h(c.signature)), /not signed/);
    assert.throws(() => sa.verifyAdvertisement(h(c.public), c.device, SCOPE, keys[0], keys[1], keys[2] + 1, keys[3], h(c.signature)), /not signed/);
    assert.equal(hex(sa.survivorsMessage(SCOPE, c.survivors)), c.survivors_message);
    assert.equal(hex(await sa.signSurvivors(c.secret, c.device, SCOPE, c.survivors)), c.survivors_signature);
    sa.verifySurvivors(h(c.public), c.device, SCOPE, [...c.survivors].reverse(), h(c.survivors_signature));
    assert.throws(() => sa.verifySurvivors(h(c.public), c.device, SCOPE, c.survivors.slice(1), h(c.survivors_signature)), /did not sign/);
  }
  assert.equal(sa.defaultDegree(100), V.graph.default_degree["100"]);
  for (const [n, k] of Object.entries(V.graph.default_degree)) assert.equal(sa.defaultDegree(Number(n)), k);
  for (const c of V.fixed_point.plans) {
    const fp = sa.FixedPoint.plan(c.cohort, c.clip, c.frac_bits ?? undefined);
    assert.deepEqual({ clip: fp.clip, frac_bits: fp.fracBits, ring_bits: fp.ringBits, cohort: fp.cohort }, c.planned);
  }
});

function pythonCombine(shares, threshold) {
  const code = "import json, sys\nfrom edge_sdk.secagg import combine_shares\nd = json.load(sys.stdin)\n"
    + "print(combine_shares([bytes.fromhex(s) for s in d['shares']], d['t']).hex())";
  return execFileSync(python(), ["-c", code], { input: JSON.stringify({ shares, t: threshold }), env: pythonEnv(),
    encoding: "utf8" }).trim();
}

test("Shamir shares cross between the SDKs both ways, and an altered extra share is refused", async () => {
  const c = V.shamir;
  for (const origin of ["python_shares", "javascript_shares"]) {
    const shares = c[origin].map(h);
    for (const subset of [shares.slice(0, 3), shares.slice(2), shares]) {
      assert.equal(hex(await sa.combineShares(subset, c.threshold)), c.secret);
    }
  }
  const secret = globalThis.crypto.getRandomValues(new Uint8Array(32));
  const shares = await sa.splitSecret(secret, 7, 4);
  assert.equal(pythonCombine(shares.slice(3).map(hex), 4), hex(secret));
  const code = "import sys\nfrom edge_sdk.secagg import split_secret\nprint(' '.join(s.hex() for s in split_secret(bytes.fromhex(sys.argv[1]), 6, 3)))";
  const fromPython = execFileSync(python(), ["-c", code, hex(secret)], { env: pythonEnv(), encoding: "utf8" }).trim().split(" ");
  assert.equal(hex(await sa.combineShares(fromPython.slice(1, 4).map(h), 3)), hex(secret));
  const altered = Uint8Array.from(shares[5]);
  altered[3] ^= 1;
  await assert.rejects(sa.combineShares([...shares.slice(0, 4), altered], 4), /not on the polynomial/);
  await assert.rejects(sa.combineShares([shares[0], shares[0], shares[1], shares[2]], 4), /same x-coordinate/);
  await assert.rejects(sa.combineShares([shares[0].slice(1), ...shares.slice(1, 4)], 4), /33 bytes/);
});

test("sealed shares open only for their pair, session and round, at their exact size", async () => {
  const key = globalThis.crypto.getRandomValues(new Uint8Array(32));
  const [s1, s2] = [new Uint8Array(33).fill(1), new Uint8Array(33).fill(2)];
  const sealed = await sa.sealShares(key, SCOPE, "u", "v", [s1], s2);
  assert.equal(sealed.length, sa.SEALED_BYTES);
  for (const [scope, from, to] of [[sa.scope(V.scope.session, 9), "u", "v"], [SCOPE, "v", "u"], [SCOPE, "u", "w"]]) {
    for (const b of BACKENDS) await assert.rejects(sa.openShares(key, scope, from, to, sealed, 1, b), /do not open/);
  }
  await assert.rejects(sa.openShares(key, SCOPE, "u", "v", sealed.slice(1)), /94 bytes/);
  const three = await sa.sealShares(key, SCOPE, "u", "v", [s1, s2, s1], s2);
  assert.equal(three.length, sa.sealedBytes(3));
  assert.deepEqual((await sa.openShares(key, SCOPE, "u", "v", three, 3))[0], [s1, s2, s1]);
  await assert.rejects(sa.openShares(key, SCOPE, "u", "v", three, 2), /127 bytes/);
});

test("sizes, rings and inputs are checked before use", async () => {
  const fp = sa.FixedPoint.plan(9, 1.5, 10);
  assert.throws(() => new sa.FixedPoint(1.5, 10, fp.ringBits - 1, 9), /could wrap/);
  assert.throws(() => sa.FixedPoint.plan(1000, 1.0, 30), /more than 32: lower frac_bits/);
  await assert.rejects(fp.encode([Number.NaN], 0.5), /NaN/);
  for (const weight of [-0.1, 1.5, Number.NaN]) await assert.rejects(fp.encode([0, 0], weight), /weight/);
  await assert.rejects(sa.expandWords(new Uint8Array(16), 4), /32 bytes/);
  await assert.rejects(sa.expandWords(new Uint8Array(32), -1), /words/);
  await assert.rejects(sa.agree(new Uint8Array(32), new Uint8Array(31)), /32 bytes/);
  assert.throws(() => sa.pairwiseSign("a", "a"), /itself/);
  assert.throws(() => sa.scope("s", 2 ** 53), /2\*\*53/);
  assert.throws(() => sa.addMod(new Uint32Array(2), new Uint32Array(3), 32), /words/);
  const members = Array.from({ length: 60 }, (_, i) => `dev-${i}`);
  await assert.rejects(sa.neighbourGraph(new Uint8Array(32), SCOPE, 0, members, 7), /even degree/);
  await assert.rejects(sa.neighbourGraph(new Uint8Array(32), SCOPE, 0, ["a", "a"]), /2 distinct/);
  const g = await sa.neighbourGraph(new Uint8Array(32), SCOPE, 0, members);
  assert.deepEqual(new Set([...g.neighbours.values()].map((v) => v.length)), new Set([18]));
  assert.ok(members.every((u) => g.neighbours.get(u).every((v) => g.neighbours.get(v).includes(u))));
});

test("without crypto.subtle (plain http) the noble backend is chosen and works", () => {
  const script = `Object.defineProperty(globalThis, "crypto", { value: { getRandomValues: (a) => globalThis.__random(a) } });
    globalThis.__random = (await import("node:crypto")).getRandomValues;
    const sa = await import(${JSON.stringify(join(REPO, "edge_sdk_js", "dist", "secagg", "index.js"))});
    const backend = await sa.selectBackend();
    const a = await sa.generateKeyPair(), b = await sa.generateKeyPair();
    const same = Buffer.from(await sa.agree(a.privateKey, b.publicKey)).equals(await sa.agree(b.privateKey, a.publicKey));
    const words = await sa.expandWords(new Uint8Array(32), 4);
    console.log(JSON.stringify({ backend: backend.name, same, words: words.length }));`;
  const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8" });
  assert.deepEqual(JSON.parse(out.trim().split("\n").at(-1)), { backend: "noble", same: true, words: 4 });
});

// In Chromium (a secure context: 127.0.0.1) the blocks load through an import map, as a device page
// would, and both backends reproduce the vectors with the browser's own WebCrypto.
const BROWSER_PAGE = `<!doctype html><html><head><meta charset="utf-8">
<script type="importmap">{"imports": {
  "@noble/hashes/": "/node_modules/@noble/hashes/", "@noble/curves/": "/node_modules/@noble/curves/",
  "@noble/ciphers/": "/node_modules/@noble/ciphers/",
  "shamir-secret-sharing": "/node_modules/shamir-secret-sharing/esm/index.js",
  "shamir-secret-sharing/csprng": "/node_modules/shamir-secret-sharing/esm/csprng.js"
}}</script>
<script type="module">
  window.sa = await import("/dist/secagg/index.js");
  window.ready = true;
</script></head><body></body></html>`;

test("in Chromium both backends reproduce the vectors", { skip: CHROMIUM ? false : "chromium is not installed: browser test skipped",
  timeout: 120_000 }, async () => {
  const dir = tempDir("edgetrain-secagg-page-");
  writeFileSync(join(dir, "index.html"), BROWSER_PAGE);
  const site = await servePage({ page: dir, vectors: join(REPO, "tests", "vectors") });
  const { browser, page } = await openPage(`${site.url}page/index.html`);
  try {
    const seen = await page.evaluate(async () => {
      const { sa } = window;
      const V = await (await fetch("/vectors/secagg.json")).json();
      const h = (s) => Uint8Array.from(s.match(/../g).map((b) => parseInt(b, 16)));
      const hex = (b) => Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
      const scope = sa.scope(V.scope.session, V.scope.round);
      const out = { secure: window.isSecureContext, chosen: (await sa.selectBackend()).name };
      for (const b of [sa.webCryptoBackend(crypto.subtle), sa.nobleBackend]) {
        const rfc = V.x25519.rfc7748;
        const c = V.sealing[0], e = V.fixed_point.encodings[1], g = V.graph.graphs[0], m = V.masks[0];
        out[b.name] = {
          shared: hex(await sa.agree(h(rfc.alice_private), h(rfc.bob_public), b)),
          okm: hex(await sa.hkdf(h(V.hkdf.rfc5869_case3.ikm), new Uint8Array(0), 42, b)),
          mask: [...(await sa.expandMask(h(m.seed), 8, m.bits, b))],
          sealed: hex(await sa.sealShares(h(c.key), scope, c.sender, c.receiver, c.seed_shares.map(h), h(c.mask_key_share),
            { nonce: h(c.nonce), backend: b })),
          words: [...(await new sa.FixedPoint(e.clip, e.frac_bits, e.ring_bits, e.cohort).encode(e.update, e.weight,
            h(e.rounding_seed), b))],
          order: (await sa.neighbourGraph(h(g.seed), scope, g.block, g.members, undefined, b)).order,
          combined: hex(await sa.combineShares(V.shamir.python_shares.slice(0, 3).map(h), 3)),
        };
      }
      return out;
    });
    const V2 = V.fixed_point.encodings[1];
    assert.deepEqual({ secure: seen.secure, chosen: seen.chosen }, { secure: true, chosen: "webcrypto" });
    for (const name of ["webcrypto", "noble"]) {
      assert.deepEqual(seen[name], { shared: V.x25519.rfc7748.shared, okm: V.hkdf.rfc5869_case3.okm, mask: V.masks[0].first,
        sealed: V.sealing[0].sealed, words: V2.words, order: V.graph.graphs[0].order, combined: V.shamir.secret });
    }
  } finally {
    await browser.close();
    await site.close();
  }
});
