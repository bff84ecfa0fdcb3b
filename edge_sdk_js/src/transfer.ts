/**
 * Large payloads as a `transfer_begin`, `transfer_frame`s and (when the begin had no digest) a
 * `transfer_end` (docs/protocol.md, "Transfers"). The receiver checks every frame, writes it once
 * into a buffer of `total_size` bytes and hashes it as it lands (sha256, incremental), so a
 * payload is verified the moment its last byte (or its digest) arrives; a transfer cut by a
 * dropped connection continues from the bytes held (`resume`).
 */
import { sha256 } from "@noble/hashes/sha2.js";
import { bytesToHex } from "@noble/hashes/utils.js";
import { ErrorCode, ProtocolError } from "./errors.js";
import { DEFAULT_LIMITS, type Limits, type Scalar, type TransferBegin, type TransferEnd, type TransferFrame } from "./messages.js";

/** Data bytes per frame when the sender does not choose (as the Python SDK). */
export const DEFAULT_FRAME_SIZE = 256 << 10;

export function sha256Hex(payload: Uint8Array): string {
  return bytesToHex(sha256(payload));
}

/**
 * The messages that carry `payload[offset:]`. Without `digest`, each frame is hashed after it is
 * yielded (sent) and a `transfer_end` with the digest of the whole payload closes the transfer.
 */
export function* frames(payload: Uint8Array, opts: {
  transferId: string; kind: string; meta: Record<string, Scalar>; frameSize?: number; offset?: number; digest?: string;
}): Generator<TransferBegin | TransferFrame | TransferEnd> {
  const frameSize = opts.frameSize ?? DEFAULT_FRAME_SIZE;
  const offset = opts.offset ?? 0;
  if (offset < 0 || offset > payload.byteLength) throw new RangeError(`offset ${offset} is outside [0, ${payload.byteLength}]`);
  const running = opts.digest ? null : sha256.create().update(payload.subarray(0, offset));
  yield { t: "transfer_begin", transfer_id: opts.transferId, kind: opts.kind, total_size: payload.byteLength,
    sha256: opts.digest ?? "", frame_size: frameSize, offset, meta: { ...opts.meta } };
  for (let start = offset; start < payload.byteLength; start += frameSize) {
    const data = payload.subarray(start, Math.min(start + frameSize, payload.byteLength));
    yield { t: "transfer_frame", transfer_id: opts.transferId, offset: start, data };
    running?.update(data);
  }
  if (running !== null) yield { t: "transfer_end", transfer_id: opts.transferId, sha256: bytesToHex(running.digest()) };
}

/** The receiving side of one transfer: checks each frame, assembles and hashes the payload in place. */
export class IncomingTransfer {
  begin: TransferBegin;
  private readonly buffer: Uint8Array;
  private held = 0;
  private readonly hash = sha256.create();
  private digest: string | null;
  private verified = false;

  constructor(begin: TransferBegin, private readonly limits: Limits = DEFAULT_LIMITS) {
    if (begin.total_size > limits.maxTransferBytes) {
      throw new ProtocolError(ErrorCode.TOO_LARGE, `transfer of ${begin.total_size} bytes exceeds ${limits.maxTransferBytes}`);
    }
    if (begin.frame_size > limits.maxFrameBytes) {
      throw new ProtocolError(ErrorCode.TOO_LARGE, `frame size ${begin.frame_size} exceeds ${limits.maxFrameBytes}`);
    }
    if (begin.offset !== 0) throw new ProtocolError(ErrorCode.OUT_OF_ORDER, `a new transfer must start at offset 0, not ${begin.offset}`);
    this.begin = begin;
    try {
      this.buffer = new Uint8Array(begin.total_size);
    } catch {
      throw new ProtocolError(ErrorCode.TOO_LARGE, `cannot allocate ${begin.total_size} bytes for the transfer`);
    }
    this.digest = begin.sha256 || null;
  }

  /** Bytes held so far: where a resumed transfer continues. */
  get offset(): number { return this.held; }
  get complete(): boolean { return this.held === this.begin.total_size; }
  get finished(): boolean { return this.complete && this.digest !== null; }

  /** Take the next frame; true once every byte is held. */
  feed(frame: TransferFrame): boolean {
    if (frame.transfer_id !== this.begin.transfer_id) {
      throw new ProtocolError(ErrorCode.UNEXPECTED, `frame of transfer ${frame.transfer_id.slice(0, 64)} during transfer ${this.begin.transfer_id.slice(0, 64)}`);
    }
    if (frame.offset !== this.held) throw new ProtocolError(ErrorCode.OUT_OF_ORDER, `frame at offset ${frame.offset}, expected ${this.held}`);
    const size = frame.data.byteLength;
    if (size > this.begin.frame_size || size > this.limits.maxFrameBytes) {
      throw new ProtocolError(ErrorCode.TOO_LARGE, `frame of ${size} bytes exceeds the frame size ${this.begin.frame_size}`);
    }
    const end = this.held + size;
    if (end > this.begin.total_size) throw new ProtocolError(ErrorCode.TOO_LARGE, `frame ends at ${end}, past the payload's ${this.begin.total_size} bytes`);
    this.buffer.set(frame.data, this.held);
    this.hash.update(frame.data);
    this.held = end;
    return this.complete;
  }

  /** Take the `transfer_end` of a transfer announced without a digest, after its last byte. */
  finish(end: TransferEnd): void {
    if (end.transfer_id !== this.begin.transfer_id) throw new ProtocolError(ErrorCode.UNEXPECTED, `end of transfer ${end.transfer_id.slice(0, 64)} during another`);
    if (this.begin.sha256 || this.digest !== null) throw new ProtocolError(ErrorCode.UNEXPECTED, "this transfer has its sha256: no transfer_end is due");
    if (!this.complete) throw new ProtocolError(ErrorCode.OUT_OF_ORDER, `transfer_end after ${this.held} of ${this.begin.total_size} bytes`);
    this.digest = end.sha256;
  }

  /** Continue after a reconnect: `begin` must announce the same payload, from `offset`. */
  resume(begin: TransferBegin): void {
    const old = this.begin;
    if (begin.transfer_id !== old.transfer_id || begin.total_size !== old.total_size || begin.sha256 !== old.sha256) {
      throw new ProtocolError(ErrorCode.UNEXPECTED, `transfer_begin for ${begin.transfer_id.slice(0, 64)} does not continue transfer ${old.transfer_id.slice(0, 64)}`);
    }
    if (begin.frame_size > this.limits.maxFrameBytes) throw new ProtocolError(ErrorCode.TOO_LARGE, `frame size ${begin.frame_size} exceeds ${this.limits.maxFrameBytes}`);
    if (begin.offset !== this.held) throw new ProtocolError(ErrorCode.OUT_OF_ORDER, `resume from offset ${begin.offset}, but ${this.held} bytes are held`);
    this.begin = begin;
  }

  /** The verified payload (the receive buffer itself, no copy). */
  result(): Uint8Array {
    if (!this.verified) {
      if (!this.complete || this.digest === null) throw new ProtocolError(ErrorCode.UNEXPECTED, `transfer incomplete: ${this.held} of ${this.begin.total_size} bytes`);
      const got = bytesToHex(this.hash.digest());
      if (got !== this.digest) throw new ProtocolError(ErrorCode.CHECKSUM, `payload hashes to ${got}, expected ${this.digest}`);
      this.verified = true;
    }
    return this.buffer;
  }
}
