// A JavaScript device's secure round reproduces tests/vectors/secagg_round.json (written by Python's
// edge_sdk.secagg.round.DeviceRound; tests/test_secagg_round_vectors.py reads it too): the server's
// messages decode, the advertisement is the same bytes, the masked words and the reveal of the
// neighbours' shares are the same, and the shares the device seals open for their neighbours and
// rebuild its secrets. The codec refuses malformed secure messages, the session steps out of turn.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { DeviceSession, ProtocolError, decode, encode } from "../dist/index.js";
import * as sa from "../dist/secagg/index.js";
import { REPO } from "./cases.mjs";

const V = JSON.parse(readFileSync(join(REPO, "tests", "vectors", "secagg_round.json"), "utf8"));
const SCOPE = sa.scope(V.scope.session, V.scope.round);
const h = (hex) => Uint8Array.from(Buffer.from(hex, "hex"));
const hex = (bytes) => Buffer.from(bytes).toString("hex");
const message = (name) => decode(h(V[name]));
const update = () => Object.fromEntries(Object.entries(V.update).map(([n, t]) => [n,
  { dtype: "float32", shape: t.shape, data: Float32Array.from(t.values) }]));
const hexMap = (m) => Object.fromEntries(Object.entries(m).map(([k, v]) => [k, hex(v)]));
const secrets = { cipherPrivate: h(V.secrets.cipher_private), maskPrivate: h(V.secrets.mask_private), seeds: V.secrets.seeds.map(h) };

async function deviceRound(backend) {
  return sa.DeviceRound.start(V.device, V.secret, SCOPE, V.split, V.blocks.length, { secrets, backend });
}

test("the server's secure messages from Python decode; the advertisement encodes to Python's bytes", () => {
  for (const name of ["secagg_peers", "secagg_inbox", "secagg_unmask", "secagg_keys"]) assert.equal(message(name).t, name);
  const keys = message("secagg_keys");
  assert.equal(hex(encode(keys)), V.secagg_keys);
  const peers = message("secagg_peers");
  assert.deepEqual(peers.members.length, 5);
  assert.equal(peers.min_survivors, 3);
  assert.deepEqual(Object.keys(peers.splits).sort(), [...V.neighbours].sort());
});

for (const backend of [sa.webCryptoBackend(globalThis.crypto.subtle), sa.nobleBackend]) {
  test(`${backend.name}: a JavaScript device round reproduces the Python round`, async () => {
    const rnd = await deviceRound(backend);
    const [cipher, mask, signature, commitments] = await rnd.advertise();
    assert.equal(hex(encode({ t: "secagg_keys", round: SCOPE.round, cipher_public: cipher, mask_public: mask, signature,
      commitments })), V.secagg_keys);
    const peers = message("secagg_peers");
    const sealed = await rnd.share(peers);
    assert.deepEqual([...rnd.neighbours], V.neighbours);
    assert.deepEqual(Object.keys(sealed).sort(), [...V.neighbours].sort());
    await rnd.receive(message("secagg_inbox").sealed);
    for (const [block, partners] of Object.entries(V.partners)) assert.deepEqual(rnd.partners(Number(block)), partners);
    const words = await rnd.mask(sa.blockVectors(update(), V.blocks, V.split), V.num_samples);
    assert.deepEqual(Object.fromEntries(words.map((w, i) => [String(V.split + i), [...w]])), V.masked);
    const sign = message("secagg_unmask_sign");
    const consent = await rnd.consent(sign.survivor_set);
    assert.equal(hex(encode({ t: "secagg_reveal", round: SCOPE.round, seed_shares: {}, key_shares: {}, consent })), V.consent);
    const unmask = message("secagg_unmask");
    const [seeds, keys] = rnd.reveal(unmask.survivors, unmask.dropped, unmask.blocks, unmask.survivor_set, unmask.signatures);
    assert.deepEqual(hexMap(keys), V.reveal.key_shares);
    const { [V.device]: own, ...others } = seeds;
    assert.deepEqual(hexMap(others), V.reveal.seed_shares);
    // The random shares: each neighbour opens its own; the device's share and theirs rebuild each b_u^k and s_u^SK.
    const opened = [];
    const trained = V.blocks.length - V.split;
    for (const [v, key] of Object.entries(V.neighbour_cipher_private)) {
      const k = await sa.shareKey(await sa.agree(h(key), cipher, backend), SCOPE, v, V.device, backend);
      opened.push(await sa.openShares(k, SCOPE, V.device, v, sealed[v], trained, backend));
    }
    const t = peers.threshold;
    for (const [i, seed] of V.secrets.seeds.entries()) {
      assert.equal(hex(await sa.combineShares(opened.map((o) => o[0][i]).slice(0, t), t)), seed);
    }
    assert.equal(hex(await sa.combineShares([own, ...opened.map((o) => o[0][1])].slice(0, t), t)), V.secrets.seeds[1]);
    assert.equal(hex(await sa.combineShares(opened.map((o) => o[1]).slice(0, t), t)), V.secrets.mask_private);
    assert.throws(() => rnd.reveal(unmask.survivors, unmask.dropped, unmask.blocks, unmask.survivor_set, unmask.signatures),
      /secure round is at 'done'/);
  });
}

test("a round refuses what the server may not relay (a forged signature, both secrets of one device, a block below t) and keeps a peer's tampered box from stopping it", async () => {
  const peers = message("secagg_peers");
  const forged = await deviceRound();
  await forged.advertise();
  const v = V.neighbours[0];
  const signatures = { ...peers.signatures, [v]: Uint8Array.from(peers.signatures[v], (b, i) => (i === 0 ? b ^ 1 : b)) };
  await assert.rejects(forged.share({ ...peers, signatures }), /not signed by its identity key/);
  const extra = await deviceRound();
  await extra.advertise();
  await assert.rejects(extra.share({ ...peers, splits: { ...peers.splits, stranger: 0 } }), /splits are not exactly/);
  const rnd = await deviceRound();
  await rnd.advertise();
  await rnd.share(peers);
  const inbox = message("secagg_inbox").sealed;
  const sender = Object.keys(inbox)[0];
  const tampered = { ...inbox, [sender]: Uint8Array.from(inbox[sender], (b, i) => (i === 20 ? b ^ 1 : b)) };
  await rnd.receive(tampered);  // noted, and the device stays in the round (it masks with that peer still)
  assert.match(rnd.unopened.get(sender), /do not open/);
  assert.ok(rnd.partners(2).includes(sender));
  const low = await deviceRound();
  await low.advertise();
  await assert.rejects(low.share({ ...peers, min_survivors: 2 }), /fewer than this device's 3/);
  const ok = await deviceRound();
  await ok.advertise();
  await ok.share(peers);
  await ok.receive(inbox);
  await ok.mask(sa.blockVectors(update(), V.blocks, V.split), V.num_samples);
  const unmask = message("secagg_unmask");
  await ok.consent(unmask.survivor_set);
  assert.throws(() => ok.reveal([V.device, sender], [sender], [2], unmask.survivor_set, unmask.signatures), /not the signed survivor set's/);
  const again = await deviceRound();
  await again.advertise();
  await again.share(peers);
  await again.receive(inbox);
  await again.mask(sa.blockVectors(update(), V.blocks, V.split), V.num_samples);
  await again.consent(unmask.survivor_set);
  assert.throws(() => again.reveal(unmask.survivors, unmask.dropped, [1, 2], unmask.survivor_set, unmask.signatures),
    /block 1 would be unmasked with 2 survivors/);
});

test("the server's weight in secagg_peers is the weight the device masks with, as in Python", async () => {
  // tests/test_secagg_round_vectors.py: the same round with the server's weight, whatever count the device holds.
  const peers = message("secagg_peers");
  const weight = sa.weightOf(V.num_samples, peers.weight_scale);
  const rnd = await deviceRound();
  await rnd.advertise();
  await rnd.share(decode(encode({ ...peers, weight })));
  await rnd.receive(message("secagg_inbox").sealed);
  const words = await rnd.mask(sa.blockVectors(update(), V.blocks, V.split), 10 ** 6);
  assert.deepEqual(Object.fromEntries(words.map((w, i) => [String(V.split + i), [...w]])), V.masked);
  assert.throws(() => encode({ ...peers, weight: 1.5 }), /weight is outside/);
  assert.equal(decode(encode(peers)).weight, -1);
});

test("the codec refuses malformed secure messages", () => {
  const keys = message("secagg_keys");
  assert.throws(() => encode({ ...keys, signature: new Uint8Array(63) }), /signature is not 64 bytes/);
  const none = { blocks: [], survivor_set: [], signatures: {} };
  assert.throws(() => encode({ t: "secagg_unmask", round: 1, survivors: ["a"], dropped: ["a"], ...none }), /survivor and dropped/);
  assert.throws(() => encode({ t: "secagg_reveal", round: 1, seed_shares: { a: new Uint8Array(33) }, key_shares: {},
    consent: new Uint8Array(64) }), /shares with its consent/);
  assert.throws(() => encode({ t: "secagg_shares", round: 1, sealed: { a: new Uint8Array(93) } }), /not 94 \+ 33 m/);
  assert.throws(() => encode({ t: "secagg_shares", round: 1, sealed: { a: new Uint8Array(95) } }), /not 94 \+ 33 m/);
  encode({ t: "secagg_shares", round: 1, sealed: { a: new Uint8Array(94 + 66) } });  // a sender of three blocks
  assert.throws(() => encode({ ...keys, commitments: new Uint8Array(33) }), /32 bytes per block/);
  assert.throws(() => encode({ t: "secagg_unmask", round: 1, survivors: ["a"], dropped: [], ...none, blocks: [1, 1] }), /set of block indices/);
  const share = new Uint8Array(33);
  assert.throws(() => encode({ t: "secagg_reveal", round: 1, seed_shares: { a: share }, key_shares: { a: share }, consent: new Uint8Array(0) }), /both shares/);
  const peers = message("secagg_peers");
  assert.throws(() => encode({ ...peers, splits: { ...peers.splits, [V.neighbours[0]]: 1.5 } }), /non-index/);
  assert.throws(() => encode({ ...peers, threshold: 1 }), /below 2/);
});

function secureSession(config = { secagg_session: V.scope.session }) {
  const s = new DeviceSession();
  s.send({ t: "hello", device_id: V.device, token: "", budget_bytes: 1, cores: 1, runtimes: [], num_samples: 1, device_class: "",
    labels: {}, resume_round: -1, rows: {}, ext: {} });
  s.receive({ t: "welcome", device_id: V.device, role: "r", split: 1, num_blocks: 3, chunks: [], model: "m", model_version: 0,
    batch_size: 1, local_steps: 1, config: {} });
  s.receive({ t: "instruction", round: SCOPE.round, phase: "train", model_version: 0, split: 1, chunk_ids: [], model_id: "m",
    selection: "tail", broadcast_id: "", local_steps: 1, lr: 0.1, deadline_s: 0, config });
  return s;
}

test("the session takes a secure round's steps in order, one at a time, and refuses them out of turn", () => {
  const keys = message("secagg_keys");
  const shares = { t: "secagg_shares", round: SCOPE.round, sealed: {} };
  const report = { t: "report", round: SCOPE.round, phase: "train", num_samples: 1, trained: [1, 3], transfer_id: "x", metrics: {} };
  assert.throws(() => secureSession({}).send(keys), /not a secure round's training/);
  const s = secureSession();
  assert.throws(() => s.send(shares), /next step is secagg_keys/);
  s.send(keys);
  assert.throws(() => s.send(report), /secagg_peers is awaited first/);
  assert.throws(() => s.receive(message("secagg_inbox")), ProtocolError);
  s.receive(message("secagg_peers"));
  assert.throws(() => s.send(keys), /next step is secagg_shares/);
  s.send(shares);
  s.receive(message("secagg_inbox"));
  assert.throws(() => s.send(keys), /next step is the report/);
  s.send(report);
  s.send({ t: "transfer_begin", transfer_id: "x", kind: "update", total_size: 1, sha256: "", frame_size: 1, offset: 0, meta: {} });
  s.send({ t: "transfer_frame", transfer_id: "x", offset: 0, data: new Uint8Array(1) });
  s.send({ t: "transfer_end", transfer_id: "x", sha256: "0".repeat(64) });
  s.receive({ t: "ack", round: SCOPE.round, accepted: true, reason: "", phase: "train" });
  const reveal = { t: "secagg_reveal", round: SCOPE.round, seed_shares: {}, key_shares: {}, consent: new Uint8Array(0) };
  assert.throws(() => s.send(reveal), /no unmasking request/);
  s.receive(message("secagg_unmask"));
  s.send(reveal);
  assert.throws(() => s.send(reveal), /no unmasking request/);
});

test("ack(accepted=false) turns the device away from a secure round's step; ack(accepted=true) does not", () => {
  const s = secureSession();
  s.send(message("secagg_keys"));
  assert.throws(() => s.receive({ t: "ack", round: SCOPE.round, accepted: true, reason: "", phase: "train" }), /only ack\(accepted=false\)/);
  s.receive({ t: "ack", round: SCOPE.round, accepted: false, reason: "late", phase: "" });
  assert.equal(s.state, "IDLE");
});

test("a device without a credential is refused a secure round before it sends anything", async () => {
  const { startRound } = await import("../dist/secagg/exchange.js");
  const ins = { t: "instruction", round: 2, phase: "train", model_version: 0, split: 1, chunk_ids: [], model_id: "m",
    selection: "tail", broadcast_id: "", local_steps: 1, lr: 0.1, deadline_s: 0, config: { secagg_session: "s" } };
  await assert.rejects(startRound("dev", "", ins, 3), (e) => e instanceof ProtocolError && e.code === "refused" && /credential/.test(e.message));
  const rnd = await startRound("dev", "secret", ins, 3);
  assert.deepEqual([rnd.scope.session, rnd.scope.round, rnd.split, rnd.numBlocks], ["s", 2, 1, 3]);
  await assert.rejects(startRound("dev", "secret", { ...ins, split: 3 }, 3), (e) => e.code === "malformed" && /trains some block/.test(e.message));
});

test("a server that gives two devices different survivor sets gets no reveal (ConsistencyCheck)", async () => {
  // The device signs the set it was told; signatures on another set, or on its own set by too few, are refused.
  const peers = message("secagg_peers");
  const unmask = message("secagg_unmask");
  const round = async () => {
    const rnd = await deviceRound();
    await rnd.advertise();
    await rnd.share(peers);
    await rnd.receive(message("secagg_inbox").sealed);
    await rnd.mask(sa.blockVectors(update(), V.blocks, V.split), V.num_samples);
    return rnd;
  };
  const told = unmask.survivor_set.filter((v) => v !== "n-alpha"); // this device is told n-alpha did not upload
  const a = await round();
  await a.consent(told);
  assert.throws(() => a.reveal(unmask.survivors, unmask.dropped, unmask.blocks, unmask.survivor_set, unmask.signatures),
    /did not sign/);
  const b = await round();
  await b.consent(told);
  assert.throws(() => b.reveal(told, unmask.dropped, unmask.blocks, told, unmask.signatures), /did not sign this survivor set|not a surviving neighbour/);
  const c = await round();
  await c.consent(unmask.survivor_set);
  const [one] = Object.keys(unmask.signatures);
  assert.throws(() => c.reveal(unmask.survivors, unmask.dropped, unmask.blocks, unmask.survivor_set, { [one]: unmask.signatures[one] }),
    /2 devices signed the survivor set, fewer than t = 3/);
});
