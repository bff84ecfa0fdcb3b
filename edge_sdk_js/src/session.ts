/**
 * The device's view of one connection as a state machine (docs/protocol.md, "Session"): `send(msg)`
 * just before sending, `receive(msg)` right after decoding; each checks that the message is
 * allowed now and advances, or throws `ProtocolError` and changes nothing. Instructions that come
 * while another is worked on wait in `pending`; `nextInstruction()` takes the oldest when idle.
 */
import { ErrorCode, ProtocolError } from "./errors.js";
import { PHASES, SECAGG_KEY, TENSOR_PHASES, TRAIN_GRAPH_KEY, type Fetch, type Hello, type Instruction, type Message, type Report, type TransferBegin,
  type SecAggInbox, type SecAggKeys, type SecAggPeers, type SecAggReveal, type SecAggShares, type SecAggUnmask, type TransferEnd,
  type TransferFrame } from "./messages.js";

export type SessionState = "HELLO" | "WELCOMING" | "IDLE" | "WORKING" | "UPLOADING" | "AWAITING_ACK" | "CLOSED";

const PLAIN_PHASES: ReadonlySet<string> = new Set(PHASES.filter((phase) => !TENSOR_PHASES.has(phase)));
const AFTER_WELCOME: readonly SessionState[] = ["IDLE", "WORKING", "UPLOADING", "AWAITING_ACK"];

/** The payload ids a device may fetch for an instruction, with the transfer kinds that answer each. */
export function payloadKinds(ins: Instruction): Map<string, Set<string>> {
  const kinds = new Map<string, Set<string>>();
  const add = (id: string, kind: string) => {
    if (!kinds.has(id)) kinds.set(id, new Set());
    kinds.get(id)!.add(kind);
  };
  for (const id of ins.chunk_ids) add(id, "chunk");
  add(ins.model_id, "model");
  if (ins.broadcast_id) add(ins.broadcast_id, "broadcast");
  const graph = ins.config[TRAIN_GRAPH_KEY];
  if (typeof graph === "string" && graph) add(graph, "train_graph");
  return kinds;
}

function unexpected(message: string): ProtocolError {
  return new ProtocolError(ErrorCode.UNEXPECTED, message);
}

class Flow {
  offset: number;
  endDue: boolean;
  constructor(readonly begin: TransferBegin) {
    this.offset = begin.offset;
    this.endDue = begin.sha256 === "";
  }
  get done(): boolean { return this.offset === this.begin.total_size && !this.endDue; }

  next(frame: TransferFrame): number {
    const b = this.begin;
    if (frame.transfer_id !== b.transfer_id) throw unexpected(`frame of transfer ${frame.transfer_id.slice(0, 64)} during transfer ${b.transfer_id.slice(0, 64)}`);
    if (frame.offset !== this.offset) throw new ProtocolError(ErrorCode.OUT_OF_ORDER, `frame at offset ${frame.offset}, expected ${this.offset}`);
    const size = frame.data.byteLength;
    if (size > b.frame_size) throw new ProtocolError(ErrorCode.TOO_LARGE, `frame of ${size} bytes exceeds the frame size ${b.frame_size}`);
    if (this.offset + size > b.total_size) throw new ProtocolError(ErrorCode.TOO_LARGE, `frame ends past the transfer's ${b.total_size} bytes`);
    return this.offset + size;
  }

  end(msg: TransferEnd): void {
    if (msg.transfer_id !== this.begin.transfer_id) throw unexpected(`transfer_end of ${msg.transfer_id.slice(0, 64)} during another transfer`);
    if (!this.endDue) throw unexpected("this transfer had its sha256 in transfer_begin: no transfer_end is due");
    if (this.offset !== this.begin.total_size) throw new ProtocolError(ErrorCode.OUT_OF_ORDER, `transfer_end after ${this.offset} of ${this.begin.total_size} bytes`);
  }
}

export class DeviceSession {
  state: SessionState = "HELLO";
  instruction: Instruction | null = null;
  readonly pending: Instruction[] = [];
  round = -1;
  hello: Hello | null = null;
  fetch: Fetch | null = null;
  report: Report | null = null;
  private lastRound = -1;
  private flow: Flow | null = null;
  private upload: [string, number] | null = null;
  private resumed = false;
  /** The server's answer a secure round's step awaits. */
  private secaggDue: "secagg_peers" | "secagg_inbox" | null = null;
  /** The device's next step of a secure round. */
  private secaggNext: "secagg_keys" | "secagg_shares" | null = null;
  /** The round whose `secagg_unmask` awaits the device's `secagg_reveal`. */
  private unmaskDue = -1;
  /** The device sent the close (`bye` or `error`): what the server sent before it read that is dropped. */
  private closedHere = false;

  get closed(): boolean { return this.state === "CLOSED"; }
  get transfer(): TransferBegin | null { return this.flow?.begin ?? null; }

  private notAllowed(msg: Message, why: string): ProtocolError {
    return unexpected(`device: ${msg.t} is not allowed in state ${this.state}: ${why}`);
  }

  /** Check that the device may send `msg` now and advance. */
  send(msg: Message): void {
    if (this.state === "CLOSED") throw unexpected(`device: ${msg.t} after the session was closed`);
    switch (msg.t) {
      case "hello":
        if (this.state !== "HELLO") throw this.notAllowed(msg, "a connection has one hello, its first message");
        this.hello = msg;
        this.state = "WELCOMING";
        return;
      case "fetch": return this.sendFetch(msg);
      case "report": return this.sendReport(msg);
      case "transfer_begin": return this.uploadBegin(msg);
      case "transfer_frame": return this.onFrame(msg, "UPLOADING");
      case "transfer_end": return this.onEnd(msg, "UPLOADING");
      case "secagg_keys": case "secagg_shares": return this.secaggStep(msg);
      case "secagg_reveal": return this.sendReveal(msg);
      case "error": case "bye": this.state = "CLOSED"; this.closedHere = true; return;
      default: throw unexpected(`${msg.t} does not travel from a device to the server`);
    }
  }

  /**
   * Check that the server may send `msg` now and advance. False, and nothing changes, for a message
   * that crossed the device's own `bye` or `error` on the wire: the caller drops it. After the
   * server's close, a message is refused: the server broke the protocol.
   */
  receive(msg: Message): boolean {
    if (this.state === "CLOSED") {
      if (this.closedHere) return false;
      throw unexpected(`device: ${msg.t} after the session was closed`);
    }
    this.take(msg);
    return true;
  }

  private take(msg: Message): void {
    switch (msg.t) {
      case "welcome":
        if (this.state !== "WELCOMING") throw this.notAllowed(msg, "a welcome answers the hello");
        this.state = "IDLE";
        return;
      case "instruction": return this.onInstruction(msg);
      case "resume": return this.onResume(msg);
      case "ack": return this.onAck(msg);
      case "transfer_begin": return this.downloadBegin(msg);
      case "transfer_frame": return this.onFrame(msg, "WORKING");
      case "transfer_end": return this.onEnd(msg, "WORKING");
      case "secagg_peers": case "secagg_inbox": return this.secaggAnswer(msg);
      case "secagg_unmask": return this.onUnmask(msg);
      case "error": case "bye": this.state = "CLOSED"; return;
      default: throw unexpected(`${msg.t} does not travel from the server to a device`);
    }
  }

  /** Make the oldest pending instruction current (IDLE -> WORKING) and return it, or null. */
  nextInstruction(): Instruction | null {
    if (this.state === "WORKING" || this.state === "UPLOADING" || this.state === "AWAITING_ACK") {
      throw unexpected(`device: nextInstruction() in state ${this.state}: the current instruction is not finished`);
    }
    if (this.state !== "IDLE" || this.pending.length === 0) return null;
    const ins = this.pending.shift()!;
    this.start(ins);
    return ins;
  }

  private sendFetch(msg: Fetch): void {
    if (this.state !== "WORKING") throw this.notAllowed(msg, "a fetch belongs to an instruction being worked on");
    if (this.flow !== null || this.fetch !== null) throw this.notAllowed(msg, "one fetch or transfer at a time");
    const ins = this.instruction!;
    if (!payloadKinds(ins).has(msg.payload_id)) throw unexpected(`fetch of payload ${msg.payload_id.slice(0, 64)}, which the current instruction does not name`);
    if (msg.round !== ins.round) throw unexpected(`fetch for round ${msg.round} while the current instruction is of round ${ins.round}`);
    this.fetch = msg;
  }

  private sendReport(msg: Report): void {
    if (this.state !== "WORKING") throw this.notAllowed(msg, "a report answers an instruction being worked on");
    if (this.flow !== null || this.fetch !== null) throw this.notAllowed(msg, "a fetch or transfer is outstanding");
    if (this.secaggDue !== null) throw this.notAllowed(msg, `the secure round's ${this.secaggDue} is awaited first`);
    const ins = this.instruction!;
    if (msg.round !== ins.round || msg.phase !== ins.phase) throw unexpected(`report of round ${msg.round}, phase ${msg.phase} answers no instruction`);
    if (TENSOR_PHASES.has(msg.phase) && !msg.transfer_id) throw unexpected(`a report of phase ${msg.phase} carries tensors`);
    if (PLAIN_PHASES.has(msg.phase) && msg.transfer_id) throw unexpected(`a report of phase ${msg.phase} carries no tensors`);
    this.report = msg;
    if (msg.transfer_id) {
      this.upload = [msg.transfer_id, 0];
      this.state = "UPLOADING";
    } else {
      this.state = "AWAITING_ACK";
    }
  }

  private onInstruction(msg: Instruction): void {
    if (!AFTER_WELCOME.includes(this.state)) throw this.notAllowed(msg, "instructions come after the welcome");
    if (this.state === "WORKING" && this.flow !== null) throw this.notAllowed(msg, "inside a transfer only its frames may come");
    if (msg.round < this.lastRound) throw unexpected(`instruction for round ${msg.round} after one for round ${this.lastRound}`);
    this.lastRound = msg.round;
    if (this.state === "IDLE" && this.pending.length === 0) this.start(msg);
    else this.pending.push(msg);
  }

  private onResume(msg: Message & { t: "resume" }): void {
    if (this.state !== "IDLE" || this.pending.length > 0) throw this.notAllowed(msg, "a resume comes right after the welcome");
    if (this.hello === null || this.hello.resume_round < 0) throw unexpected("resume, but the hello resumed no round");
    if (this.resumed || this.lastRound >= 0) throw this.notAllowed(msg, "a resume comes once, before any instruction");
    this.resumed = true;
    this.round = this.lastRound = this.hello.resume_round;
    this.upload = [msg.transfer_id, msg.offset];
    this.state = "UPLOADING";
  }

  private onAck(msg: Message & { t: "ack" }): void {
    if (this.state === "WORKING" && this.secaggDue !== null) {
      // The server turns the device away from a secure round's cohort (late, or presumed dropped).
      if (msg.accepted || msg.round !== this.round) throw this.notAllowed(msg, "only ack(accepted=false) of the round answers a secure round's step");
      this.secaggDue = null;
      this.finishInstruction();
      return;
    }
    if (this.state === "WORKING" && this.fetch !== null) {
      if (msg.accepted) throw this.notAllowed(msg, "only ack(accepted=false) answers a fetch");
      if (msg.round !== this.fetch.round) throw unexpected(`ack of round ${msg.round} answers the fetch of round ${this.fetch.round}`);
      if (msg.phase !== "" && msg.phase !== this.instruction!.phase) throw unexpected(`ack of phase ${msg.phase} answers a fetch for another phase`);
      this.fetch = null;
      this.finishInstruction();
      return;
    }
    if (this.state !== "AWAITING_ACK") throw this.notAllowed(msg, "an ack answers a complete report or an outstanding fetch");
    if (msg.round !== this.round) throw unexpected(`ack of round ${msg.round} answers the report of round ${this.round}`);
    if (this.report !== null && msg.phase !== this.report.phase) throw unexpected(`ack of phase ${msg.phase} answers the report of phase ${this.report.phase}`);
    this.report = null;
    this.finishInstruction();
  }

  /** A secure round's key advertisement or shares: within a secure train instruction, one step at a time. */
  private secaggStep(msg: SecAggKeys | SecAggShares): void {
    if (this.state !== "WORKING" || this.flow !== null || this.fetch !== null) {
      throw this.notAllowed(msg, "a secure round's step belongs to a train instruction between transfers");
    }
    const ins = this.instruction!;
    if (ins.phase !== "train" || !ins.config[SECAGG_KEY]) throw this.notAllowed(msg, "the current instruction is not a secure round's training");
    if (msg.round !== ins.round) throw unexpected(`${msg.t} of round ${msg.round} during the instruction of round ${ins.round}`);
    if (this.secaggDue !== null) throw this.notAllowed(msg, `the server's ${this.secaggDue} is awaited first`);
    if (msg.t !== this.secaggNext) throw this.notAllowed(msg, `the secure round's next step is ${this.secaggNext ?? "the report"}`);
    this.secaggDue = msg.t === "secagg_keys" ? "secagg_peers" : "secagg_inbox";
    this.secaggNext = null;
  }

  private secaggAnswer(msg: SecAggPeers | SecAggInbox): void {
    if (this.state !== "WORKING" || this.secaggDue !== msg.t || msg.round !== this.round) {
      throw this.notAllowed(msg, "it answers the device's step of the current secure round");
    }
    this.secaggDue = null;
    this.secaggNext = msg.t === "secagg_peers" ? "secagg_shares" : null;
  }

  private onUnmask(msg: SecAggUnmask): void {
    if (!AFTER_WELCOME.includes(this.state) || this.flow !== null) {
      throw this.notAllowed(msg, "an unmasking request comes after the welcome, between transfers");
    }
    this.unmaskDue = msg.round;
  }

  private sendReveal(msg: SecAggReveal): void {
    if (this.unmaskDue !== msg.round || (this.state === "UPLOADING" && this.flow !== null)) {
      throw this.notAllowed(msg, `no unmasking request of round ${msg.round} is open`);
    }
    this.unmaskDue = -1;
  }

  private downloadBegin(msg: TransferBegin): void {
    if (this.state !== "WORKING" || this.fetch === null || this.flow !== null) throw this.notAllowed(msg, "a download answers an outstanding fetch");
    const kinds = payloadKinds(this.instruction!).get(this.fetch.payload_id)!;
    if (!kinds.has(msg.kind)) throw unexpected(`transfer of kind ${msg.kind} answers the fetch of a payload of kind ${[...kinds].join("/")}`);
    // A held payload (Fetch.held) is answered at its end, no frame following; a delta-coded one is
    // held by the digest of its rebuilt bytes (meta "recon", RECON_META in wire-codecs.ts).
    const held = !!this.fetch.held && msg.offset === msg.total_size
      && (msg.sha256 === this.fetch.held || msg.meta["recon"] === this.fetch.held);
    if (msg.offset !== 0 && msg.offset !== this.fetch.offset && !held) {
      throw new ProtocolError(ErrorCode.OUT_OF_ORDER, `transfer starts at offset ${msg.offset}, but the fetch asked for ${this.fetch.offset}`);
    }
    this.fetch = null;
    const flow = new Flow(msg);
    this.flow = flow.done ? null : flow;
  }

  private uploadBegin(msg: TransferBegin): void {
    if (this.state !== "UPLOADING" || this.flow !== null || this.upload === null) throw this.notAllowed(msg, "an upload follows its report (or a resume)");
    const [id, offset] = this.upload;
    if (msg.transfer_id !== id) throw unexpected(`upload of transfer ${msg.transfer_id.slice(0, 64)}, but the report names ${id.slice(0, 64)}`);
    if (msg.kind !== "update") throw unexpected(`upload of kind ${msg.kind}, not update`);
    if (msg.offset !== offset) throw new ProtocolError(ErrorCode.OUT_OF_ORDER, `upload starts at offset ${msg.offset}, expected ${offset}`);
    this.upload = null;
    const flow = new Flow(msg);
    if (flow.done) this.state = "AWAITING_ACK";
    else this.flow = flow;
  }

  private onFrame(msg: TransferFrame, state: SessionState): void {
    if (this.state !== state || this.flow === null) throw this.notAllowed(msg, "no transfer is in flight this way");
    this.flow.offset = this.flow.next(msg);
    if (this.flow.done) this.flowDone();
  }

  private onEnd(msg: TransferEnd, state: SessionState): void {
    if (this.state !== state || this.flow === null) throw this.notAllowed(msg, "no transfer is in flight this way");
    this.flow.end(msg);
    this.flow.endDue = false;
    this.flowDone();
  }

  private flowDone(): void {
    this.flow = null;
    if (this.state === "UPLOADING") this.state = "AWAITING_ACK";
  }

  private start(ins: Instruction): void {
    this.instruction = ins;
    this.secaggNext = "secagg_keys"; // checked against the instruction when a step comes
    this.round = ins.round;
    this.state = "WORKING";
  }

  private finishInstruction(): void {
    this.instruction = null;
    this.round = -1;
    this.state = "IDLE";
  }
}
