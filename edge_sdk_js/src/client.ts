/**
 * The device's connection (docs/protocol.md; the Python twin is edge_sdk/client.py): connect, say
 * hello, take the server's instructions one at a time, upload each report and resume an upload
 * cut by a drop, reconnect with backoff until the server says goodbye. What an instruction asks
 * for is the round's work (src/roundwork.ts): its phase from the device's registry
 * (src/phases.ts, src/algorithms/), its tail from the device's training backend (src/backends/).
 * Reports are kept until acknowledged, across a restart too, given a `pending` store.
 * `stop()` and `pause()` leave with a goodbye between instructions (docs/js-device.md, "Stop and pause").
 */
import { DEFAULT_REGISTRY } from "./algorithms/index.js";
import type { TrainingBackend } from "./backends/backend.js";
import { DEFAULT_BACKEND, makeBackend } from "./backends/index.js";
import { measureProbe } from "./backends/probe.js";
import { authorizationHeader, makeProof, withTicket } from "./credentials.js";
import { backoffDelay } from "./backoff.js";
import { gather, type DataSource, type DeviceData } from "./data.js";
import { ErrorCode, ProtocolError, RoundAborted } from "./errors.js";
import { DEFAULT_LIMITS, type Instruction, type Limits, type Message, type Report, type Scalar, type Welcome } from "./messages.js";
import type { PayloadStore } from "./payload-store.js";
import { UpdateEncoder } from "./wire-codecs.js";
import type { PendingStore } from "./pending.js";
import type { DeviceRegistry } from "./phases.js";
import { ServerBye, nextReply } from "./replies.js";
import { RoundProgress, phaseReport, revealRound, type EventSink, type WorkingDevice } from "./roundwork.js";
import type { Runtime } from "./runtime.js";
import { FOREVER, settingDefault } from "./settings.js";
import { DEFAULT_FRAME_SIZE, frames } from "./transfer.js";
import { Channel, ConnectionLost, type WebSocketFactory } from "./transport.js";

export interface DeviceOptions {
  server: string;
  deviceId: string;
  budgetBytes: number;
  /** The ONNX Runtime the frozen chunks run in (and the default backend trains in). */
  runtime: Runtime;
  webSocket: WebSocketFactory;
  data: DataSource;
  /** CPU cores declared in the hello, for the server's planner (default 1); a setting apart from `threads`. */
  cores?: number;
  deviceClass?: string;
  /** The server's shared token (a lab setting), or: */
  token?: string;
  /** This device's enrolled credential: each hello carries a fresh proof of it, not the secret. */
  secret?: string;
  /** In secure rounds, the fewest devices whose sum of a block this device lets be unmasked (default 3). */
  secureMinSurvivors?: number;
  /** Where the upgrade request cannot carry the `Authorization` header (a browser page): a fresh single-use
   * ticket for each connection (`fetchTicket`), carried as `?ticket=`; null where the server asks for none. */
  upgradeTicket?: () => Promise<string | null>;
  labels?: Record<string, string>;
  /** Extension fields sent in the hello as they are (`Hello.ext`: `namespace.name` -> value), for a
   * strategy that declares them (docs/protocol.md, "Extension fields"). */
  helloExt?: Record<string, unknown>;
  /** Threads of ONNX Runtime (the frozen chunks and the training backend). */
  threads?: number;
  /** Batch of the multi-step forward pass; 0: the planned batch size. */
  forwardBatch?: number;
  reconnect?: boolean;
  /** Reconnect attempts in a row before `run()` gives up; -1 (`FOREVER`, the default): never (a service). */
  maxRetries?: number;
  /** The longest wait between two attempts, in seconds (default 30: the key table's `reconnect-max-delay`). */
  maxBackoffS?: number;
  frameSize?: number;
  limits?: Limits;
  /** Where an unacknowledged update is kept, so that a device closed mid-upload and started again
   * finishes that round (`indexedDbStore` in a page, `fileStore` in Node); without one, uploads
   * resume only within one run. */
  pending?: PendingStore;
  /** Where downloaded payloads are kept by sha256, so that none the device holds is downloaded again
   * (docs/protocol.md, "Held payloads"): `folderPayloadStore` in Node, `memoryPayloadStore` in a
   * page; without one, every payload is downloaded each time it is named. */
  payloadStore?: PayloadStore;
  /** The phases, report hooks and selection kinds this device knows (src/phases.ts); default
   * `DEFAULT_REGISTRY`: the built-in phases and every algorithm's of src/algorithms/. */
  registry?: DeviceRegistry;
  /** What trains the tail (src/backends/); default `makeBackend("onnxruntime", runtime, threads)`:
   * the server's training graphs in `runtime`. Its runtimes are what the hello declares. */
  backend?: TrainingBackend;
  onEvent?: EventSink;
  /** The data's label count, declared in the hello (`num_classes`) beside the samples' shape, so a
   * server whose model takes other data refuses it before sending any of the model. */
  numClasses?: number;
}

/** How the device leaves: `now` cuts the instruction at hand (it is not reported), otherwise the
 * device finishes it (trained, reported, acknowledged) and leaves before the next. */
export interface LeaveOptions { now?: boolean }

export interface RoundReport {
  round: number;
  role: string;
  phase: string;
  trained: [number, number];
  accepted: boolean;
  metrics: Record<string, Scalar>;
}

export class DeviceClient {
  readonly reports: RoundReport[] = [];
  welcome: Welcome | null = null;
  readonly registry: DeviceRegistry;
  readonly backend: TrainingBackend;
  /** The hello's probe step, measured before the first hello (its pace's seed on the server). */
  private probeStepS: number | undefined;
  private data: DeviceData | null = null;
  private progress: RoundProgress | null = null;
  private readonly limits: Limits;
  private readonly emit: EventSink;
  private readonly updates = new UpdateEncoder();
  /** What the device was asked to do between instructions: leave for good, or for a while. */
  private leaving: "stop" | "pause" | null = null;
  /** Ends a wait (for an instruction, or a reconnect's backoff) when the device is asked to leave. */
  private wake: (() => void) | null = null;
  private resumed: (() => void) | null = null;
  private channel: Channel | null = null;

  constructor(readonly options: DeviceOptions) {
    this.limits = options.limits ?? DEFAULT_LIMITS;
    this.emit = options.onEvent ?? (() => undefined);
    this.registry = options.registry ?? DEFAULT_REGISTRY;
    this.backend = options.backend ?? makeBackend(DEFAULT_BACKEND, options.runtime, options.threads ?? 1);
  }

  /** Stop for good: the device says goodbye (now, or once the instruction at hand is acknowledged) and
   * `run()` resolves with the reports made. The server sees a device that left between rounds. */
  stop(options: LeaveOptions = {}): void {
    this.leave("stop", options);
  }

  /** Leave for a while: as `stop()`, but `run()` waits, disconnected, until `resume()`, then says
   * hello again (the same id: the server plans it again and may select it in the next round). */
  pause(options: LeaveOptions = {}): void {
    if (this.leaving !== "stop") this.leave("pause", options);
  }

  /** Come back after `pause()` (or take back a pause not yet carried out). */
  resume(): void {
    if (this.leaving !== "pause") return;
    this.leaving = null;
    this.resumed?.();
  }

  /** Whether the device is paused or on its way to pausing. */
  get paused(): boolean {
    return this.leaving === "pause";
  }

  private leave(how: "stop" | "pause", options: LeaveOptions): void {
    this.leaving = how;
    this.emit(how === "stop" ? "stopping" : "pausing", { device: this.options.deviceId, now: options.now === true });
    this.wake?.();
    if (how === "stop") this.resumed?.();
    if (options.now) this.channel?.close(); // the instruction at hand fails with ConnectionLost: not reported
  }

  /** Connect (and reconnect with exponential backoff) until the server says goodbye or `stop()`. */
  async run(): Promise<RoundReport[]> {
    const o = this.options;
    this.data = await gather(o.data);
    if (this.data.x.shape[0] !== this.data.y.shape[0] || this.data.x.shape[0] === 0) {
      throw new Error("a device needs a non-empty local dataset with one label per sample");
    }
    await this.restorePending();
    let attempt = 0;
    for (;;) {
      if (this.leaving === "pause") await this.pausedUntilResumed();
      if (this.leaving === "stop") return this.stopped();
      let ch: Channel | null = null;
      try {
        const url = o.upgradeTicket ? withTicket(o.server, await o.upgradeTicket()) : o.server;
        ch = this.channel = await Channel.open(o.webSocket, url, this.limits, authorizationHeader(o.deviceId, o.secret, o.token));
        attempt = 0;
        if (await this.session(ch)) { ch.close(); return this.reports; }
        continue; // left between instructions (stop or pause)
      } catch (exc) {
        if (this.leaving !== null && exc instanceof ConnectionLost) { ch?.close(); continue; } // cut by stop/pause({ now })
        // The server said goodbye while the device was busy, then closed: training is over, not a drop to retry.
        if (exc instanceof ConnectionLost && ch?.farewell != null) { ch.close(); return this.reports; }
        if (exc instanceof ProtocolError && !exc.remote) {
          ch?.sendError(exc); // a bad frame from the server, or an instruction this device cannot carry out: say so and close
          this.emit("error", { device: o.deviceId, code: exc.code, message: exc.message });
          throw exc;
        }
        if (!(exc instanceof ConnectionLost)) { ch?.close(); throw exc; }
        const retries = o.maxRetries ?? settingDefault("reconnect-retries") as number;
        if (o.reconnect === false || (retries !== FOREVER && attempt >= retries)) {
          throw new ConnectionLost(`${o.deviceId}: lost the server ${o.server} after ${attempt} retries: ${exc.message}`);
        }
        const delay = backoffDelay(attempt, o.maxBackoffS ?? settingDefault("reconnect-max-delay") as number);
        attempt += 1;
        this.emit("reconnect", { device: o.deviceId, server: o.server, attempt, delay_s: Math.round(delay * 100) / 100, error: exc.message });
        await this.backoff(delay * 1000);
      }
    }
  }

  private stopped(): RoundReport[] {
    this.emit("stopped", { device: this.options.deviceId, reports: this.reports.length });
    return this.reports;
  }

  private async pausedUntilResumed(): Promise<void> {
    this.emit("paused", { device: this.options.deviceId });
    await new Promise<void>((resolve) => { this.resumed = resolve; });
    this.resumed = null;
    this.emit("resumed", { device: this.options.deviceId });
  }

  /** Wait for the server's next instruction, unless the device is asked to leave first (then null). */
  private async nextOrLeave(ch: Channel): Promise<Message | null> {
    if (this.leaving !== null) return null;
    const asked = new Promise<null>((resolve) => { this.wake = () => resolve(null); });
    try {
      return await Promise.race([nextReply(ch, true), asked]);
    } finally {
      this.wake = null;
    }
  }

  /** Wait `ms`, or less if the device is asked to leave meanwhile. */
  private async backoff(ms: number): Promise<void> {
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, ms);
      this.wake = () => { clearTimeout(timer); resolve(); };
    });
    this.wake = null;
  }

  /** A report a previous run left unacknowledged: held as this round's, so the server's `resume` finds it. */
  private async restorePending(): Promise<void> {
    const saved = await this.options.pending?.load();
    if (!saved) return;
    this.progress = new RoundProgress(saved.round);
    this.progress.reports.set(saved.report.phase, [saved.report, saved.payload]);
    this.emit("pending_restored", { device: this.options.deviceId, round: saved.round, phase: saved.report.phase,
      bytes: saved.payload?.byteLength ?? 0 });
  }

  /** One connection's life; true when the server said goodbye. */
  private async session(ch: Channel): Promise<boolean> {
    const o = this.options;
    this.probeStepS ??= await measureProbe(this.backend);
    await ch.send({
      t: "hello", device_id: o.deviceId, token: o.secret ? makeProof(o.deviceId, o.secret) : (o.token ?? ""),
      budget_bytes: o.budgetBytes, cores: o.cores ?? 1, runtimes: [...this.backend.runtimes], num_samples: this.data!.x.shape[0]!,
      device_class: o.deviceClass ?? "", labels: { ...(o.labels ?? {}) }, resume_round: this.progress?.round ?? -1,
      rows: {}, ext: { ...(o.helloExt ?? {}) }, input_shape: this.data!.x.shape.slice(1), num_classes: o.numClasses ?? -1,
      probe_step_s: this.probeStepS,
    });
    try {
      const welcome = await nextReply(ch);
      if (welcome.t !== "welcome") throw new ProtocolError(ErrorCode.UNEXPECTED, `expected welcome, got ${welcome.t}`);
      this.welcome = welcome;
      this.emit("welcome", { device: o.deviceId, role: welcome.role, split: welcome.split, chunks: welcome.chunks, runtime: o.runtime.name });
      for (;;) {
        const msg = await this.nextOrLeave(ch);
        if (msg === null) {
          await ch.send({ t: "bye", reason: this.leaving === "stop" ? "device stopped" : "device paused" });
          ch.close();
          return false;
        }
        if (msg.t === "secagg_unmask") { // a secure round's last step, after its report's ack
          const refused = await revealRound(ch, this.progress, msg);
          const answered = Object.keys(msg.signatures).length > 0; // else it signed the survivor set
          if (refused || answered) {
            this.emit(refused ? "secagg_refused" : "secure_reveal", { device: this.options.deviceId, round: msg.round,
              survivors: msg.survivors.length, dropped: msg.dropped.length, ...(refused ? { reason: refused } : {}) });
          }
          continue;
        }
        let ins: Instruction | null;
        if (msg.t === "resume") {
          await this.resumeUpload(ch, msg.transfer_id, msg.offset);
          ins = ch.session.nextInstruction();
        } else if (msg.t === "instruction") {
          ins = msg;
        } else {
          throw new ProtocolError(ErrorCode.UNEXPECTED, `did not expect ${msg.t} while idle`);
        }
        while (ins !== null) {
          try {
            await this.carryOut(ch, ins, welcome);
          } catch (exc) {
            if (!(exc instanceof RoundAborted)) throw exc;
            this.emit("aborted", { device: o.deviceId, round: ins.round });
            this.progress = null;
          }
          ins = this.leaving === null ? ch.session.nextInstruction() : null; // asked to leave: not the rest
        }
      }
    } catch (exc) {
      if (exc instanceof ServerBye) return true;
      throw exc;
    }
  }

  /** The device as its round's work sees it, under the plan of this connection's welcome. */
  private working(welcome: Welcome): WorkingDevice {
    const o = this.options;
    return { deviceId: o.deviceId, data: this.data!, welcome, runtime: o.runtime, backend: this.backend, registry: this.registry,
      threads: o.threads ?? 1, forwardBatch: o.forwardBatch ?? 0, limits: this.limits, emit: this.emit, updates: this.updates,
      ...(o.payloadStore ? { payloadStore: o.payloadStore } : {}), ...(o.secret ? { secret: o.secret } : {}),
      ...(o.secureMinSurvivors ? { secureMinSurvivors: o.secureMinSurvivors } : {}) };
  }

  /** Do the instruction's phase and report; a report already made (before a reconnect) is sent again. */
  private async carryOut(ch: Channel, ins: Instruction, welcome: Welcome): Promise<void> {
    if (this.progress === null || this.progress.round !== ins.round) this.progress = new RoundProgress(ins.round);
    const prog = this.progress;
    if (!prog.reports.has(ins.phase)) {
      const made = await phaseReport(this.working(welcome), ch, ins, prog);
      prog.reports.set(ins.phase, made);
      if (made[1] !== null) await this.options.pending?.save({ round: ins.round, report: made[0], payload: made[1] });
    }
    const [report, payload] = prog.reports.get(ins.phase)!;
    await ch.send(report);
    await this.upload(ch, prog, report, payload, 0);
  }

  private async resumeUpload(ch: Channel, transferId: string, offset: number): Promise<void> {
    const prog = this.progress;
    const held = prog === null ? undefined : [...prog.reports.values()].find(([r]) => r.transfer_id === transferId);
    if (prog === null || held === undefined || held[1] === null) {
      throw new ProtocolError(ErrorCode.UNEXPECTED, `resume of transfer ${transferId.slice(0, 64)}, which this device is not sending`);
    }
    const [report, payload] = held;
    if (offset > payload!.byteLength) throw new ProtocolError(ErrorCode.MALFORMED, `resume at offset ${offset}, past the update's ${payload!.byteLength} bytes`);
    this.emit("upload_resumed", { device: this.options.deviceId, round: report.round, offset, total: payload!.byteLength });
    await this.upload(ch, prog, report, payload, offset);
  }

  /** Stream the report's tensors from `offset` (if it has any) and wait for the server's ack. */
  private async upload(ch: Channel, prog: RoundProgress, report: Report, payload: Uint8Array | null, offset: number): Promise<void> {
    const started = performance.now();
    if (payload !== null) {
      for (const msg of frames(payload, { transferId: report.transfer_id, kind: "update", meta: { round: report.round },
        frameSize: this.options.frameSize ?? DEFAULT_FRAME_SIZE, offset })) await ch.send(msg);
    }
    const ack = await nextReply(ch);
    if (ack.t !== "ack") throw new ProtocolError(ErrorCode.UNEXPECTED, `expected ack, got ${ack.t}`);
    prog.timings["upload_s"]! += (performance.now() - started) / 1000;
    prog.reports.delete(report.phase);
    if (payload !== null) await this.options.pending?.clear();
    const role = this.welcome?.role ?? "";
    this.reports.push({ round: report.round, role, phase: report.phase, trained: report.trained, accepted: ack.accepted, metrics: report.metrics });
    this.emit("round_done", { device: this.options.deviceId, round: report.round, phase: report.phase, accepted: ack.accepted,
      reason: ack.reason, role, trained: report.trained, runtime: this.options.runtime.name,
      ...(report.metrics["backend"] === undefined ? {} : { backend: report.metrics["backend"] }),
      ...lossOf(report.metrics), ...prog.timings });
  }
}

/** The loss before and after the local steps, where the report carries them (what a person watches a round for). */
function lossOf(metrics: Record<string, unknown>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const k of ["loss_before", "loss_after"]) if (typeof metrics[k] === "number") out[k] = metrics[k];
  return out;
}
