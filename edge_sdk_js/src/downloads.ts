/**
 * Downloads (docs/protocol.md, "Transfers" and "Resume"; the Python twin is edge_sdk/downloads.py):
 * one payload at a time, its sha256 checked as the frames land. A download cut by a dropped
 * connection continues after the reconnect from the bytes already received, kept in the round's
 * partial transfers; a payload whose bytes changed meanwhile is drained and fetched again from 0.
 * A payload the device's store holds by the sha256 its instruction names is fetched with
 * `Fetch.held`, and the server sends none of its bytes (docs/protocol.md, "Held payloads"). Where the
 * server delta-codes downloads, a changed chunk or tail is fetched with the digest of the version the
 * store holds of the same slot (`downloadSlot`) and rebuilt from the quantized difference
 * (docs/protocol.md, "Delta downloads").
 */
import { ErrorCode, ProtocolError, RoundAborted } from "./errors.js";
import type { Instruction, Limits, TransferBegin } from "./messages.js";
import type { PayloadStore } from "./payload-store.js";
import { nextReply, ServerBye } from "./replies.js";
import { IncomingTransfer } from "./transfer.js";
import type { Channel } from "./transport.js";
import { sha256Hex } from "./transfer.js";
import { applyDelta, CODEC_META, DELTA_BASE_META, DELTA_CODEC, decodePayload, RECON_META } from "./wire-codecs.js";

/** Which payload of earlier rounds `payloadId` replaces: the i-th chunk or the model, at the split and
 * selection; "" for others. The server checks that a base fits, so a wrong guess costs nothing. */
export function downloadSlot(ins: Instruction, payloadId: string): string {
  const i = ins.chunk_ids.indexOf(payloadId);
  if (i >= 0) return `${ins.split}:chunk:${i}`;
  return payloadId === ins.model_id ? `${ins.split}:model:${ins.selection}` : "";
}

export interface DownloadOptions {
  limits: Limits;
  /** Partial downloads by payload id: what survives a reconnect within the round. */
  partial: Map<string, IncomingTransfer>;
  /** Told when a download continues from a partial one (the `download_resumed` event). */
  onResumed?: (resumed: { round: number; payload: string; offset: number; total: number }) => void;
  /** The sha256 the instruction names for the payload (`Instruction.digests`), or "". */
  digest?: string;
  /** Payloads kept by sha256 across rounds and reconnects; downloads are added to it. */
  store?: PayloadStore;
  /** Told when a payload came from the store (the `from_store` event). */
  onHeld?: (held: { round: number; payload: string; kind: string; bytes: number }) => void;
  /** The payload's slot (`downloadSlot`): what a delta download is based on. */
  slot?: string;
  /** Told when a delta download was rebuilt (the `delta_applied` event). */
  onDelta?: (applied: { round: number; kind: string; bytes: number; rebuilt: number; base: boolean }) => void;
}

/** Download one payload of the current instruction; `RoundAborted` when the server closed the round. */
export async function fetchPayload(ch: Channel, round: number, payloadId: string, opts: DownloadOptions): Promise<Uint8Array> {
  let incoming = opts.partial.get(payloadId);
  const digest = opts.digest ?? "";
  let stored = incoming === undefined && digest && opts.store ? await opts.store.get(digest) : undefined;
  const base = stored === undefined && incoming === undefined && opts.slot && opts.store ? await opts.store.slot(opts.slot) : "";
  const held = stored ? digest : base;
  for (;;) {
    await ch.send({ t: "fetch", round, payload_id: payloadId, offset: incoming?.offset ?? 0, ...(held ? { held } : {}) });
    const begin = await nextReply(ch);
    if (begin.t === "ack" && !begin.accepted) throw new RoundAborted(begin.reason);
    if (begin.t !== "transfer_begin") throw new ProtocolError(ErrorCode.UNEXPECTED, `expected a transfer, got ${begin.t}`);
    if (stored !== undefined) {
      if (begin.offset === begin.total_size && (begin.sha256 === digest || begin.meta[RECON_META] === digest)) {
        opts.onHeld?.({ round, payload: payloadId, kind: begin.kind, bytes: stored.byteLength });
        return RECON_META in begin.meta ? stored : decodePayload(stored, begin.meta, begin.kind, opts.limits);
      }
      stored = undefined; // the server's bytes differ: it sends them from 0
    }
    if (incoming === undefined) { incoming = new IncomingTransfer(begin, opts.limits); break; }
    if (incoming.begin.sha256 === begin.sha256 && begin.offset === incoming.offset) {
      incoming.resume(begin);
      opts.onResumed?.({ round, payload: payloadId, offset: begin.offset, total: begin.total_size });
      break;
    }
    await drain(ch, begin); // the payload changed since the partial download: start again from 0
    incoming = undefined;
  }
  opts.partial.set(payloadId, incoming);
  while (!incoming.finished) {
    const msg = await ch.recv();
    if (msg.t === "transfer_frame") incoming.feed(msg);
    else if (msg.t === "transfer_end") incoming.finish(msg);
    else if (msg.t === "error") throw new ProtocolError(msg.code, msg.message, true);
    else if (msg.t === "bye") throw new ServerBye(msg.reason); // the run ended mid-download: not a malformed transfer
    else throw new ProtocolError(ErrorCode.UNEXPECTED, `${msg.t} during transfer ${incoming.begin.transfer_id.slice(0, 64)}`);
  }
  const data = incoming.result();
  opts.partial.delete(payloadId);
  if (incoming.begin.meta[CODEC_META] === DELTA_CODEC) return rebuilt(data, incoming.begin, round, opts);
  if (opts.store && incoming.begin.sha256) await opts.store.put(incoming.begin.sha256, data);
  return decodePayload(data, incoming.begin.meta, incoming.begin.kind, opts.limits); // the store keeps what travelled
}

/** A delta download rebuilt on the base it names (from the store), checked against the server's digest
 * of the same bytes, and kept for the next round's delta. */
async function rebuilt(data: Uint8Array, begin: TransferBegin, round: number, opts: DownloadOptions): Promise<Uint8Array> {
  const baseDigest = String(begin.meta[DELTA_BASE_META] ?? ""), digest = String(begin.meta[RECON_META] ?? "");
  const base = baseDigest && opts.store ? await opts.store.get(baseDigest) : undefined;
  if (baseDigest && base === undefined) throw new ProtocolError(ErrorCode.MALFORMED, `a delta on ${baseDigest.slice(0, 16)}, which this device does not hold`);
  // A base read afresh from the store is this download's own: rebuilt in place, one chunk held, not two.
  const out = applyDelta(data, base, opts.limits, opts.store?.fresh === true);
  if (sha256Hex(out) !== digest) throw new ProtocolError(ErrorCode.MALFORMED, `a ${begin.kind} delta rebuilds other bytes than the server's`);
  opts.onDelta?.({ round, kind: begin.kind, bytes: begin.total_size, rebuilt: out.length, base: baseDigest !== "" });
  if (opts.store) {
    await opts.store.put(digest, out);
    if (opts.slot) await opts.store.setSlot(opts.slot, digest);
  }
  return out;
}

/** Read and discard the frames of a transfer this device no longer wants. */
export async function drain(ch: Channel, begin: TransferBegin): Promise<void> {
  let received = begin.offset;
  while (received < begin.total_size) {
    const frame = await ch.recv();
    if (frame.t !== "transfer_frame") throw new ProtocolError(ErrorCode.UNEXPECTED, `expected a frame, got ${frame.t}`);
    received += frame.data.byteLength;
  }
  if (!begin.sha256) {
    const end = await ch.recv();
    if (end.t !== "transfer_end") throw new ProtocolError(ErrorCode.UNEXPECTED, `expected transfer_end, got ${end.t}`);
  }
}
