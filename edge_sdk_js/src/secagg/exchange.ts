/**
 * A secure round's steps on a device's connection: the I/O around `DeviceRound` (src/secagg/round.ts),
 * the twin of edge_sdk/secagg/exchange.py. After training, a device whose train instruction names
 * `secagg_session` advertises its keys, sends its sealed shares and uploads its masked blocks in
 * place of its update (`maskedUpdate`); once the server has the round's uploads it answers the
 * unmasking request (`reveal`). docs/protocol.md, "Secure aggregation", has the messages.
 */
import { ErrorCode, ProtocolError, RoundAborted } from "../errors.js";
import { SECAGG_KEY, type Instruction, type Message, type SecAggUnmask } from "../messages.js";
import { nextReply } from "../replies.js";
import { tensor, type Tensor, type TensorValue } from "../tensors.js";
import type { Channel } from "../transport.js";
import { packWords } from "./fixedpoint.js";
import { SecAggError, scope } from "./labels.js";
import { blockParts } from "./layout.js";
import { DeviceRound } from "./round.js";

/** Instruction config keys of a secure round (besides `SECAGG_KEY`, its scope). */
export const BLOCKS_KEY = "secagg_blocks";
export const CLIP_KEY = "secagg_clip";

/** The name of block `block`'s masked words in the upload: int32 on the wire (the ring words' bits), or
 * in a compressed round the words packed at the ring's b bits (uint8, `packWords`). */
export function uploadName(block: number): string {
  return `secagg.${block}`;
}

/** One block's masked words as they travel: packed at b bits in a compressed round, else int32. */
export function wireWords(rnd: DeviceRound, w: Uint32Array): Tensor {
  if (rnd.compression !== null) {
    const packed = packWords(w, rnd.fixed!.ringBits);
    return tensor("uint8", [packed.length], packed);
  }
  return tensor("int32", [w.length], new Int32Array(w.buffer, w.byteOffset, w.length));
}

async function answer<T extends Message["t"]>(ch: Channel, t: T): Promise<Message & { t: T }> {
  const msg = await nextReply(ch);
  if (msg.t === "ack" && !msg.accepted) throw new RoundAborted(msg.reason);
  if (msg.t !== t) throw new ProtocolError(ErrorCode.UNEXPECTED, `expected ${t}, got ${msg.t}`);
  return msg as Message & { t: T };
}

/** A server that broke the protocol: the device says so and follows it no further. */
function broken(exc: unknown): unknown {
  return exc instanceof SecAggError ? new ProtocolError(ErrorCode.MALFORMED, `secure round: ${exc.message}`) : exc;
}

/** The device's state for the secure round `ins` opens; `minSurvivors`: the device's own t (default 3). */
export async function startRound(deviceId: string, secret: string, ins: Instruction, numBlocks: number,
  minSurvivors?: number): Promise<DeviceRound> {
  if (!secret) throw new ProtocolError(ErrorCode.REFUSED, "secure aggregation needs the device's credential (its secret) to sign keys");
  try {
    return await DeviceRound.start(deviceId, secret, scope(String(ins.config[SECAGG_KEY]), ins.round), ins.split, numBlocks,
      minSurvivors === undefined ? {} : { minSurvivors });
  } catch (exc) {
    throw broken(exc);
  }
}

/** Steps 0-2 of `rnd` over `ch`: the upload that replaces the device's update `tensors`. */
export async function maskedUpdate(ch: Channel, rnd: DeviceRound, ins: Instruction, tensors: Record<string, TensorValue>,
  numSamples: number): Promise<Record<string, Tensor>> {
  try {
    const [cipher, mask, signature, commitments] = await rnd.advertise();
    await ch.send({ t: "secagg_keys", round: ins.round, cipher_public: cipher, mask_public: mask, signature, commitments });
    const peers = await answer(ch, "secagg_peers");
    await ch.send({ t: "secagg_shares", round: ins.round, sealed: await rnd.share(peers) });
    const inbox = await answer(ch, "secagg_inbox");
    await rnd.receive(inbox.sealed);
    const blocks = blockParts(tensors, String(ins.config[BLOCKS_KEY] ?? "").split(","), ins.split);
    const words = await rnd.mask(blocks, numSamples);
    return Object.fromEntries(words.map((w, i) => [uploadName(ins.split + i), wireWords(rnd, w)]));
  } catch (exc) {
    throw broken(exc);
  }
}

/** Step 3: answer the unmasking request of `msg.round` (one for a round this device has no state of
 * is refused: the server asked the wrong device, or one that left): the device's signature on the
 * survivor set, then, asked again with the signers' signatures, its shares. A request the device refuses (a block
 * short of t survivors, both secrets of one peer) gets no answer: the device stays connected for the
 * next round, and the refusal is returned ("" when it answered). */
export async function reveal(ch: Channel, rnd: DeviceRound | null, msg: SecAggUnmask): Promise<string> {
  if (rnd === null || rnd.scope.round !== msg.round) { // not answered: the device stays for the next round
    return `secure round: an unmasking request for round ${msg.round}, which this device did not mask (or left)`;
  }
  let shares: ReturnType<DeviceRound["reveal"]>;
  try {
    if (Object.keys(msg.signatures).length === 0) { // the consistency round's first request: sign the survivor set
      const consent = await rnd.consent(msg.survivor_set);
      await ch.send({ t: "secagg_reveal", round: msg.round, seed_shares: {}, key_shares: {}, consent });
      return "";
    }
    shares = rnd.reveal(msg.survivors, msg.dropped, msg.blocks, msg.survivor_set, msg.signatures);
  } catch (exc) {
    if (exc instanceof SecAggError) return `secure round: ${exc.message}`;
    throw exc;
  }
  await ch.send({ t: "secagg_reveal", round: msg.round, seed_shares: shares[0], key_shares: shares[1], consent: new Uint8Array(0) });
  return "";
}
