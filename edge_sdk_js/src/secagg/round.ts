/**
 * One device's side of one secure round, sans-I/O: the twin of edge_sdk/secagg/round.py
 * (docs/protocol.md, "Secure aggregation"). The steps follow SecAgg+ (Bell et al. 2020,
 * Algorithm 2, which runs Bonawitz et al. 2017's rounds on a neighbour graph), one method each,
 * checking what the server relayed before using it; src/secagg/exchange.ts carries the messages:
 *
 * 0. `advertise` (AdvertiseKeys): two fresh X25519 key pairs, c_u (share encryption) and s_u
 *    (pairwise masks), a fresh seed b_u^k per trained block with its commitment, all signed with
 *    the split by the identity key of the device's credential.
 * 1. `share` (ShareKeys): rebuild the neighbour graph from the cohort's public seed, verify each
 *    neighbour's signature (keys, split, commitments), refuse a round whose t is below the
 *    device's own, split each b_u^k and s_u^SK into deg + 1 Shamir shares (t rebuild them; the
 *    device keeps one) and seal one set for each neighbour.
 * 2. `receive` then `mask` (MaskedInputCollection): open the neighbours' shares (those who sent
 *    none are out; a box that does not open is noted in `unopened`, never a reason to leave), then
 *    per trained block k: clip, weight, quantize, add the self mask of block k and the pairwise mask
 *    with each neighbour that trained block k and sent shares.
 * 3. `consent` then `reveal` (ConsistencyCheck, then Unmasking): sign the survivor set the server
 *    names, and answer only a request with that same set signed by at least t devices (itself
 *    included, each signature verified). Then shares of b_v^k for the survivors and the blocks asked, of s_v^SK for
 *    the dropped, never both for one device, once per round (Bonawitz et al. 2017, Round 4), and
 *    only for blocks whose survivors, counted from the signed splits, reach t.
 *
 * A server that breaks the protocol gets a `SecAggError`: the device follows it no further.
 */
import { addInRing, noiseShare } from "../dp.js";
import type { SecAggPeers } from "../messages.js";
import { randomBytes, type CryptoBackend } from "./backend.js";
import { signAdvertisement, signSurvivors, verifyAdvertisement, verifySurvivors } from "./binding.js";
import { BlockEncoder, Compression, FixedPoint, l2Norm, slices } from "./fixedpoint.js";
import { neighbourGraph } from "./graph.js";
import { KEY_BYTES, agree, generateKeyPair, pairMaskSeed, publicKey, seedCommitment, selfMaskSeed, shareKey, type KeyPair } from "./keys.js";
import { SecAggError, concat, type Scope } from "./labels.js";
import { MAX_WORDS, MaskStream, ringMask } from "./masks.js";
import { openShares, sealShares } from "./sealing.js";
import { splitSecret } from "./shamir.js";

/** A device's aggregation weight: its sample count over the round's public scale, at most 1. */
export function weightOf(numSamples: number, weightScale: number): number {
  return Math.min(1, Math.max(0, numSamples) / weightScale);
}

/** The round's secrets, drawn fresh unless given (test vectors only). */
export interface RoundSecrets {
  cipherPrivate: Uint8Array;
  maskPrivate: Uint8Array;
  /** b_u^k, the self-mask seed of each trained block, in block order. */
  seeds: Uint8Array[];
}

/** The fewest devices whose sum of a block a device lets be revealed unless its settings say more
 * (a sum of two tells each of them the other's update); as edge_sdk/secagg/round.py. */
export const DEFAULT_MIN_SURVIVORS = 3;

const PEER_FIELDS = ["cipher_keys", "mask_keys", "signatures", "identities", "splits", "commitments"] as const;

/** Device `deviceId`'s state in one secure round of `scope`; it trained blocks [split, numBlocks). */
export class DeviceRound {
  step: "advertise" | "share" | "receive" | "mask" | "reveal" | "done" = "advertise";
  neighbours: readonly string[] = [];
  readonly splits = new Map<string, number>();
  fixed: FixedPoint | null = null;
  /** A compressed round's quantisation (fixedpoint.ts `Compression`), or null. */
  compression: Compression | null = null;
  weightScale = 1;
  weight = -1;
  /** Distributed DP: block -> [sigma_b in ring units, n_min_b] (edge_sdk/secagg/round.py). */
  noise = new Map<number, [number, number]>();
  threshold = 2;
  /** The device's own t until the round's (at least as high) is known. */
  minSurvivors = DEFAULT_MIN_SURVIVORS;
  /** Neighbour -> why its sealed shares did not open. */
  readonly unopened = new Map<string, string>();
  private readonly sent = new Set<string>();
  private members = new Set<string>();
  private readonly identities = new Map<string, Uint8Array>();
  private signed: string[] | null = null;
  private readonly shareKeys = new Map<string, Uint8Array>();
  private readonly pairSecrets = new Map<string, Uint8Array>();
  private own: [Uint8Array[], Uint8Array] | null = null;
  private readonly held = new Map<string, [Uint8Array[], Uint8Array]>();

  private constructor(readonly deviceId: string, private readonly secret: string, readonly scope: Scope, readonly split: number,
    readonly numBlocks: number, private readonly cipherPair: KeyPair, private readonly maskPair: KeyPair,
    private readonly seeds: Uint8Array[], private readonly backend?: CryptoBackend) {}

  /** A round with fresh keys and seeds (or `secrets`, for test vectors); `minSurvivors`: the device's own t. */
  static async start(deviceId: string, secret: string, scope: Scope, split: number, numBlocks: number,
    options: { secrets?: RoundSecrets; backend?: CryptoBackend; minSurvivors?: number } = {}): Promise<DeviceRound> {
    if (!(Number.isInteger(split) && split >= 0 && split < numBlocks)) {
      throw new SecAggError(`a secure round's device trains some block: split ${split} of ${numBlocks}`);
    }
    const b = options.backend;
    const given = options.secrets;
    const pair = async (key: Uint8Array | undefined) => (key === undefined ? generateKeyPair(b)
      : { privateKey: key, publicKey: await publicKey(key, b) });
    const seeds = given?.seeds ?? Array.from({ length: numBlocks - split }, () => randomBytes(KEY_BYTES));
    if (seeds.length !== numBlocks - split) throw new SecAggError(`${seeds.length} seeds for ${numBlocks - split} trained blocks`);
    const round = new DeviceRound(deviceId, secret, scope, split, numBlocks, await pair(given?.cipherPrivate),
      await pair(given?.maskPrivate), seeds, b);
    round.minSurvivors = options.minSurvivors ?? DEFAULT_MIN_SURVIVORS;
    return round;
  }

  /** The commitment to each trained block's seed, in block order (32 bytes each). */
  async commitments(): Promise<Uint8Array> {
    const out = new Uint8Array(KEY_BYTES * this.seeds.length);
    for (const [i, seed] of this.seeds.entries()) {
      out.set(await seedCommitment(seed, this.scope, this.split + i, this.deviceId, this.backend), i * KEY_BYTES);
    }
    return out;
  }

  private expect(step: DeviceRound["step"], then: DeviceRound["step"]): void {
    if (this.step !== step) throw new SecAggError(`${this.deviceId}: the secure round is at '${this.step}', not '${step}'`);
    this.step = then;
  }

  /** 0: [c_u^PK, s_u^PK, signature, commitments] for `secagg_keys`. */
  async advertise(): Promise<[Uint8Array, Uint8Array, Uint8Array, Uint8Array]> {
    this.expect("advertise", "share");
    const commitments = await this.commitments();
    const signature = await signAdvertisement(this.secret, this.deviceId, this.scope, this.cipherPair.publicKey,
      this.maskPair.publicKey, this.split, commitments, this.backend);
    return [this.cipherPair.publicKey, this.maskPair.publicKey, signature, commitments];
  }

  /** 1: check the cohort the server relayed and seal this device's shares for each neighbour. */
  async share(peers: SecAggPeers): Promise<Record<string, Uint8Array>> {
    this.expect("share", "receive");
    const me = this.deviceId;
    if (!peers.members.includes(me)) throw new SecAggError(`${me}: the cohort relayed does not hold this device`);
    const graph = await neighbourGraph(peers.graph_seed, this.scope, 0, peers.members, peers.degree, this.backend);
    this.neighbours = graph.neighbours.get(me)!;
    const named = new Set(this.neighbours);
    for (const field of PEER_FIELDS) {
      const keys = Object.keys(peers[field]);
      if (keys.length !== named.size || !keys.every((k) => named.has(k))) {
        throw new SecAggError(`${me}: the server's ${field} are not exactly this device's neighbours`);
      }
    }
    if (peers.threshold !== graph.threshold.get(me) || peers.cohort < peers.members.length) {
      throw new SecAggError(`${me}: threshold ${peers.threshold} or cohort ${peers.cohort} is not the graph's`);
    }
    if (peers.min_survivors < this.minSurvivors) {
      throw new SecAggError(`${me}: the round reveals sums of ${peers.min_survivors} devices, fewer than this device's ${this.minSurvivors}`);
    }
    this.threshold = peers.threshold;
    this.minSurvivors = peers.min_survivors;
    this.members = new Set(peers.members);
    for (const [v, key] of Object.entries(peers.identities)) this.identities.set(v, key);
    this.noise = this.noiseOf(peers);
    let summed = 0;
    for (const [sigma, n] of this.noise.values()) summed = Math.max(summed, sigma * Math.sqrt(peers.cohort / n));
    this.compression = this.compressionOf(peers);
    // refuses a ring with no room for the noise
    this.fixed = this.compression === null
      ? new FixedPoint(peers.clip, peers.frac_bits, peers.ring_bits, peers.cohort, summed * 2 ** -peers.frac_bits)
      : this.compression.fixed(peers.cohort, peers.clip, 1);
    this.weightScale = peers.weight_scale;
    this.weight = peers.weight ?? -1; // the server's w for this device (-1: a server that predates it)
    for (const v of this.neighbours) await this.meet(v, peers);
    const count = this.neighbours.length + 1;
    const seeds: Uint8Array[][] = [];
    for (const seed of this.seeds) seeds.push(await splitSecret(seed, count, peers.threshold));
    const keys = await splitSecret(this.maskPair.privateKey, count, peers.threshold);
    this.own = [seeds.map((block) => block[0]!), keys[0]!];
    const out: Record<string, Uint8Array> = {};
    for (const [i, v] of this.neighbours.entries()) {
      out[v] = await sealShares(this.shareKeys.get(v)!, this.scope, me, v, seeds.map((block) => block[i + 1]!), keys[i + 1]!,
        this.backend === undefined ? {} : { backend: this.backend });
    }
    return out;
  }

  /** A compressed round's quantisation (value_bits > 0), refused with distributed noise or a ring its cohort does not need. */
  private compressionOf(peers: SecAggPeers): Compression | null {
    if (!peers.value_bits) return null;
    const compression = new Compression(peers.value_bits, peers.value_spread);
    if (this.noise.size > 0) throw new SecAggError(`${this.deviceId}: a compressed round with distributed noise (its ring has no room for the noise)`);
    if (peers.ring_bits !== compression.ringBits(peers.cohort)) {
      throw new SecAggError(`${this.deviceId}: a ring of ${peers.ring_bits} bits for ${peers.cohort} devices' ${peers.value_bits}-bit values, `
        + `which need ${compression.ringBits(peers.cohort)}`);
    }
    return compression;
  }

  /** The fixed point of a block of `count` coordinates: the round's, or a compressed round's for that size. */
  fixedFor(count: number): FixedPoint {
    const fixed = this.fixed!;
    return this.compression === null ? fixed : this.compression.fixed(fixed.cohort, fixed.clip, count);
  }

  /** Each trained block's [sigma_b, n_min_b] (distributed DP): every trained block or none is noised. */
  private noiseOf(peers: SecAggPeers): Map<number, [number, number]> {
    const noise = new Map<number, [number, number]>();
    for (const [b, sigma] of Object.entries(peers.noise_sigma)) noise.set(Number(b), [Number(sigma), Number(peers.noise_survivors[b])]);
    for (let b = this.split; noise.size > 0 && b < this.numBlocks; b++) {
      if (!noise.has(b)) throw new SecAggError(`${this.deviceId}: distributed noise for blocks ${[...noise.keys()]}, not every block it trained`);
    }
    for (const [, n] of noise.values()) {
      if (n > peers.cohort) throw new SecAggError(`${this.deviceId}: noise sized for more survivors than the cohort ${peers.cohort}`);
    }
    return noise;
  }

  /** Verify neighbour `v`'s advertisement and derive the pair's share key and mask secret. */
  private async meet(v: string, peers: SecAggPeers): Promise<void> {
    const [cipher, mask] = [peers.cipher_keys[v]!, peers.mask_keys[v]!];
    const split = peers.splits[v];
    const commitments = peers.commitments[v]!;
    if (typeof split !== "number" || !Number.isInteger(split) || split < 0 || split >= this.numBlocks
      || commitments.byteLength !== KEY_BYTES * (this.numBlocks - split)) {
      throw new SecAggError(`${this.deviceId}: neighbour ${JSON.stringify(v)} has split ${String(split)} or commitments for other blocks`);
    }
    verifyAdvertisement(peers.identities[v]!, v, this.scope, cipher, mask, split, commitments, peers.signatures[v]!);
    this.splits.set(v, split);
    this.shareKeys.set(v, await shareKey(await agree(this.cipherPair.privateKey, cipher, this.backend), this.scope, this.deviceId, v, this.backend));
    this.pairSecrets.set(v, await agree(this.maskPair.privateKey, mask, this.backend));
  }

  /** 2a: open the shares the neighbours sent (sender -> sealed); those who sent none are out. Shares that
   * do not open are the sender's doing: noted in `unopened`, and the device still masks with that sender. */
  async receive(sealed: Record<string, Uint8Array>): Promise<void> {
    this.expect("receive", "mask");
    for (const [v, box] of Object.entries(sealed)) {
      const key = this.shareKeys.get(v);
      if (key === undefined) throw new SecAggError(`${this.deviceId}: shares from ${JSON.stringify(v)}, who is not a neighbour`);
      this.sent.add(v);
      try {
        this.held.set(v, await openShares(key, this.scope, v, this.deviceId, box, this.numBlocks - this.splits.get(v)!, this.backend));
      } catch (exc) {
        if (!(exc instanceof SecAggError)) throw exc;
        this.unopened.set(v, exc.message);
      }
    }
  }

  /** The neighbours this device masks block `block` with: they trained it and sent shares. */
  partners(block: number): string[] {
    return this.neighbours.filter((v) => this.sent.has(v) && this.splits.get(v)! <= block);
  }

  /**
   * 2b: the masked words of each trained block (`blocks[i]`: block split + i, one array or the
   * arrays its vector concatenates, `blockParts`), the weight coordinate last. Each block is
   * encoded, noised and masked a slice at a time (SLICE_WORDS coordinates) into its masked words,
   * so the round holds the update, its masked words and one slice, as round.py does.
   */
  async mask(blocks: readonly (ArrayLike<number> | readonly ArrayLike<number>[])[], numSamples: number,
    roundingSeed?: Uint8Array): Promise<Uint32Array[]> {
    this.expect("mask", "reveal");
    if (blocks.length !== this.numBlocks - this.split) {
      throw new SecAggError(`${this.deviceId}: ${blocks.length} blocks to mask, trained ${this.numBlocks - this.split}`);
    }
    // The server's weight, fixed from the samples registered for this device (docs/security.md, "Secure groups");
    // the device's own count only for a server that sends none.
    const weight = this.weight >= 0 ? this.weight : weightOf(numSamples, this.weightScale);
    const out: Uint32Array[] = [];
    for (const [i, values] of blocks.entries()) {
      const parts = isParts(values) ? values : [values];
      out.push(await this.maskBlock(this.split + i, parts, weight, roundingSeed));
    }
    return out;
  }

  private async maskBlock(block: number, parts: readonly ArrayLike<number>[], weight: number,
    roundingSeed?: Uint8Array): Promise<Uint32Array> {
    const partners = this.partners(block);
    if (partners.length === 0) throw new SecAggError(`${this.deviceId}: no neighbour of block ${block}'s cohort sent shares`);
    const count = parts.reduce((n, part) => n + part.length, 0);
    if (count + 1 > MAX_WORDS || (this.compression !== null && count < 1)) {
      throw new SecAggError(`a block has at most ${MAX_WORDS - 1} coordinates (and some, in a compressed round)`);
    }
    const fixed = this.fixedFor(count);
    const encoder = new BlockEncoder(fixed, l2Norm(slices(parts)), weight, roundingSeed, this.backend);
    const pairSeeds = new Map<string, Uint8Array>();
    for (const v of partners) pairSeeds.set(v, await pairMaskSeed(this.pairSecrets.get(v)!, this.scope, block, this.deviceId, v, this.backend));
    const selfSeed = await selfMaskSeed(this.seeds[block - this.split]!, this.scope, block, this.deviceId, this.backend);
    const masks = new MaskStream(fixed.ringBits, this.deviceId, { selfSeed, pairSeeds }, this.backend);
    const noise = this.noise.get(block);
    const ring = ringMask(fixed.ringBits);
    const out = new Uint32Array(count + 1);
    let at = 0;
    const add = async (words: Uint32Array) => {
      const mask = await masks.read(words.length);
      for (let j = 0; j < words.length; j++) out[at + j] = (words[j]! + mask[j]!) & ring;
      at += words.length;
    };
    for (const piece of slices(parts)) {
      const words = await encoder.values(piece);
      // The device's share N_Z(0, sigma_b^2 / n_min_b) on the value words, not the weight.
      await add(noise === undefined ? words : addInRing(words, noiseShare(words.length, noise[0], noise[1]), fixed.ringBits));
    }
    await add(await encoder.weightWord());
    return out;
  }

  /** 3a (ConsistencyCheck): the device's signature on the survivor set, once; the set must hold this
   * device and only devices of the key cohort. */
  async consent(survivorSet: readonly string[]): Promise<Uint8Array> {
    const me = this.deviceId;
    if (this.step !== "reveal" || this.signed !== null) throw new SecAggError(`${me}: a survivor set to sign at step '${this.step}', or a second one`);
    if (!survivorSet.includes(me) || !survivorSet.every((v) => this.members.has(v)) || new Set(survivorSet).size !== survivorSet.length) {
      throw new SecAggError(`${me}: a survivor set without this device, or with devices outside the cohort`);
    }
    this.signed = [...survivorSet];
    return signSurvivors(this.secret, me, this.scope, survivorSet, this.backend);
  }

  /** The request is about the set this device signed, at least t devices signed it (each verified),
   * and its survivors and dropped are that set's as this device sees it. */
  private consistent(survivors: readonly string[], dropped: readonly string[], survivorSet: readonly string[],
    signatures: Record<string, Uint8Array>): void {
    const me = this.deviceId;
    const signed = new Set(this.signed ?? []);
    if (this.signed === null || survivorSet.length !== signed.size || !survivorSet.every((v) => signed.has(v))) {
      throw new SecAggError(`${me}: an unmasking request for a survivor set this device did not sign`);
    }
    const signers = new Set([me]);
    for (const [v, signature] of Object.entries(signatures)) {
      if (v === me) continue;
      const key = this.identities.get(v);
      if (key === undefined || !signed.has(v)) throw new SecAggError(`${me}: a signature of ${JSON.stringify(v)}, not a surviving neighbour`);
      verifySurvivors(key, v, this.scope, this.signed, signature);
      signers.add(v);
    }
    if (signers.size < this.minSurvivors) {
      throw new SecAggError(`${me}: ${signers.size} devices signed the survivor set, fewer than t = ${this.minSurvivors}`);
    }
    const seen = [...signed].filter((v) => v === me || this.sent.has(v));
    const alive = new Set(survivors);
    if (alive.size !== seen.length || !seen.every((v) => alive.has(v)) || dropped.some((v) => signed.has(v))) {
      throw new SecAggError(`${me}: survivors or dropped that are not the signed survivor set's`);
    }
  }

  /** 3b: [seed shares of the survivors, key shares of the dropped], once, after `consent`: `survivorSet`
   * must be the set the device signed and `signatures` those of at least t devices on it. The survivors
   * name this device; every other id must be a neighbour that sent it shares; `blocks`: those the server
   * unmasks, each of which must have at least t survivors by the signed splits; a survivor's answer is its
   * shares of the seeds of those blocks it trained (33 bytes each, block order); no device's two secrets
   * are ever revealed together; a peer whose shares did not open is left out. */
  reveal(survivors: readonly string[], dropped: readonly string[], blocks: readonly number[],
    survivorSet: readonly string[] = [], signatures: Record<string, Uint8Array> = {}):
    [Record<string, Uint8Array>, Record<string, Uint8Array>] {
    this.expect("reveal", "done");
    this.consistent(survivors, dropped, survivorSet, signatures);
    const me = this.deviceId;
    const alive = new Set(survivors);
    const gone = new Set(dropped);
    const both = [...alive].filter((v) => gone.has(v)).sort();
    if (both.length > 0) throw new SecAggError(`${me}: asked to reveal both secrets of ${JSON.stringify(both.slice(0, 3))}`);
    if (!alive.has(me) || gone.has(me)) throw new SecAggError(`${me}: an unmasking request that does not count this device alive`);
    const unknown = [...alive, ...gone].filter((v) => v !== me && !this.sent.has(v)).sort();
    if (unknown.length > 0) throw new SecAggError(`${me}: asked for shares of ${JSON.stringify(unknown.slice(0, 3))}, which it was not given`);
    const splits = new Map([...this.splits, [me, this.split] as [string, number]]);
    for (const b of blocks) {
      const count = [...alive].filter((v) => splits.get(v)! <= b).length;
      if (!(Number.isInteger(b) && b >= 0 && b < this.numBlocks) || count < this.minSurvivors) {
        throw new SecAggError(`${me}: block ${b} would be unmasked with ${count} survivors, fewer than t = ${this.minSurvivors}`);
      }
    }
    const held = new Map([...this.held, [me, this.own!] as [string, [Uint8Array[], Uint8Array]]]);
    const order = [...blocks].sort((a, b) => a - b);
    const seeds: Record<string, Uint8Array> = {};
    for (const v of [...alive].sort()) {
      const got = held.get(v);
      const parts = got === undefined ? [] : order.filter((b) => b >= splits.get(v)!).map((b) => got[0][b - splits.get(v)!]!);
      if (parts.length > 0) seeds[v] = concat(parts);
    }
    const keys = Object.fromEntries([...gone].sort().filter((v) => held.has(v)).map((v) => [v, held.get(v)![1]]));
    return [seeds, keys];
  }
}

/** Whether a block is given as the arrays its vector concatenates (not one array of numbers). */
function isParts(values: ArrayLike<number> | readonly ArrayLike<number>[]): values is readonly ArrayLike<number>[] {
  return Array.isArray(values) && values.length > 0 && typeof values[0] !== "number";
}
