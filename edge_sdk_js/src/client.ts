/**
 * The device: connect, say hello, carry out the server's instructions, reconnect on drops
 * (docs/protocol.md; the Python twin is edge_sdk/client.py). One training instruction: fetch the
 * frozen chunks one at a time and run them over the local data (activations cached for the
 * round), fetch the tail's training graph and state, train tau steps, report the deltas.
 * `evaluate` reports the received model's loss, `compare` the distance between this round's
 * update and a broadcast. Reports are kept until acknowledged, downloads and uploads resume (across
 * a restart too, given a `pending` store).
 */
import { makeProof, randomHex } from "./credentials.js";
import { DeviceRefused, ErrorCode, ProtocolError, RoundAborted } from "./errors.js";
import { multiStepForward } from "./forward.js";
import { DEFAULT_LIMITS, TRAIN_GRAPH_KEY, type Instruction, type Limits, type Message, type Report, type Scalar,
  type TransferBegin, type Welcome } from "./messages.js";
import type { PendingStore } from "./pending.js";
import type { Runtime } from "./runtime.js";
import { deviceSeed } from "./sampling.js";
import { decodeTensors, encodeTensors, isRowSparse, type Tensor, type TensorValue } from "./tensors.js";
import { OrtTail, evaluateTail, parseTrainGraph, trainTail, type TrainConfig } from "./trainer.js";
import { DEFAULT_FRAME_SIZE, IncomingTransfer, frames } from "./transfer.js";
import { Channel, ConnectionLost, type WebSocketFactory } from "./transport.js";

/** The device's local data: inputs (a leading sample axis) and one label per sample. */
export interface DeviceData {
  x: Tensor;
  y: Tensor;
}

/** Data from the app: tensors, or batches (an iterable or async iterable) gathered once at start. */
export type DataSource = DeviceData | AsyncIterable<DeviceData> | Iterable<DeviceData>;

export interface DeviceOptions {
  server: string;
  deviceId: string;
  budgetBytes: number;
  runtime: Runtime;
  webSocket: WebSocketFactory;
  data: DataSource;
  cores?: number;
  deviceClass?: string;
  /** The server's shared token (a lab setting), or: */
  token?: string;
  /** This device's enrolled credential: each hello carries a fresh proof of it, not the secret. */
  secret?: string;
  labels?: Record<string, string>;
  threads?: number;
  /** Batch of the multi-step forward pass; 0: the planned batch size. */
  forwardBatch?: number;
  reconnect?: boolean;
  maxRetries?: number;
  maxBackoffS?: number;
  frameSize?: number;
  limits?: Limits;
  /** Where an unacknowledged update is kept, so that a device closed mid-upload and started again
   * finishes that round (`indexedDbStore` in a page, `fileStore` in Node); without one, uploads
   * resume only within one run. */
  pending?: PendingStore;
  onEvent?: (kind: string, data: Record<string, unknown>) => void;
}

export interface RoundReport {
  round: number;
  role: string;
  phase: string;
  trained: [number, number];
  accepted: boolean;
  metrics: Record<string, Scalar>;
}

interface Trained {
  deltas: Record<string, Tensor>;
  numSamples: number;
  trained: [number, number];
  metrics: Record<string, Scalar>;
}

/** What survives a reconnect within one round. */
class RoundProgress {
  chunksDone: string[] = [];
  activations: Tensor | null = null;
  readonly partial = new Map<string, IncomingTransfer>();
  readonly trained = new Map<string, Trained>();
  readonly reports = new Map<string, [Report, Uint8Array | null]>();
  withinEpsilon: boolean | null = null;
  readonly timings: Record<string, number> = { download_s: 0, forward_s: 0, train_s: 0, upload_s: 0 };
  constructor(readonly round: number) {}
}

/** The server said goodbye: training is over. */
class ServerBye extends Error {}

/** FedALIGN Section 3.1, the device's own check |F_k(w) - F(w)| <= epsilon (null: not asked). */
export function incentiveCheck(metrics: Record<string, Scalar>, config: Record<string, Scalar>): boolean | null {
  if (!("global_loss" in config) || !("epsilon" in config)) return null;
  const loss = Number(metrics["loss"]), g = Number(config["global_loss"]), eps = Number(config["epsilon"]);
  return Number.isFinite(loss) && Number.isFinite(g) && Math.abs(loss - g) <= eps;
}

/** Resident memory of this process at its peak, where the platform tells (Node); else 0. */
function peakRssBytes(): number {
  const proc = (globalThis as { process?: { resourceUsage?: () => { maxRSS: number } } }).process;
  return proc?.resourceUsage ? proc.resourceUsage().maxRSS * 1024 : 0;
}

async function gather(source: DataSource): Promise<DeviceData> {
  if ("x" in source && "y" in source) return source as DeviceData;
  const parts: DeviceData[] = [];
  for await (const part of source as AsyncIterable<DeviceData>) parts.push(part);
  if (parts.length === 0) throw new Error("the data source yielded no batches");
  const join = (ts: Tensor[]): Tensor => {
    const n = ts.reduce((a, t) => a + t.shape[0]!, 0);
    const Ctor = ts[0]!.data.constructor as new (k: number) => Tensor["data"];
    const out = new Ctor(ts.reduce((a, t) => a + t.data.length, 0));
    let at = 0;
    for (const t of ts) { (out as Float32Array).set(t.data as Float32Array, at); at += t.data.length; }
    return { dtype: ts[0]!.dtype, shape: [n, ...ts[0]!.shape.slice(1)], data: out };
  };
  return { x: join(parts.map((p) => p.x)), y: join(parts.map((p) => p.y)) };
}

export class DeviceClient {
  readonly reports: RoundReport[] = [];
  welcome: Welcome | null = null;
  private data: DeviceData | null = null;
  private progress: RoundProgress | null = null;
  private readonly limits: Limits;
  private readonly emit: (kind: string, data: Record<string, unknown>) => void;

  constructor(readonly options: DeviceOptions) {
    this.limits = options.limits ?? DEFAULT_LIMITS;
    this.emit = options.onEvent ?? (() => undefined);
  }

  /** Connect (and reconnect with exponential backoff) until the server says goodbye. */
  async run(): Promise<RoundReport[]> {
    const o = this.options;
    this.data = await gather(o.data);
    if (this.data.x.shape[0] !== this.data.y.shape[0] || this.data.x.shape[0] === 0) {
      throw new Error("a device needs a non-empty local dataset with one label per sample");
    }
    await this.restorePending();
    let attempt = 0;
    for (;;) {
      let ch: Channel | null = null;
      try {
        ch = await Channel.open(o.webSocket, o.server, this.limits);
        attempt = 0;
        if (await this.session(ch)) { ch.close(); return this.reports; }
      } catch (exc) {
        if (exc instanceof ProtocolError && !exc.remote) {
          ch?.sendError(exc); // a bad frame from the server: say so and close this connection
          this.emit("error", { device: o.deviceId, code: exc.code, message: exc.message });
          throw exc;
        }
        if (!(exc instanceof ConnectionLost)) { ch?.close(); throw exc; }
        if (o.reconnect === false || attempt >= (o.maxRetries ?? 30)) {
          throw new ConnectionLost(`${o.deviceId}: lost the server after ${attempt} retries: ${exc.message}`);
        }
        const delay = Math.min(o.maxBackoffS ?? 5, 0.2 * 2 ** attempt) * (0.5 + Math.random() / 2);
        attempt += 1;
        this.emit("reconnect", { device: o.deviceId, attempt, delay_s: delay });
        await new Promise((resolve) => setTimeout(resolve, delay * 1000));
      }
    }
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
    await ch.send({
      t: "hello", device_id: o.deviceId, token: o.secret ? makeProof(o.deviceId, o.secret) : (o.token ?? ""),
      budget_bytes: o.budgetBytes, cores: o.cores ?? 1, runtimes: [o.runtime.name], num_samples: this.data!.x.shape[0]!,
      device_class: o.deviceClass ?? "", labels: { ...(o.labels ?? {}) }, resume_round: this.progress?.round ?? -1,
      rows: {}, ext: {},
    });
    try {
      const welcome = await this.recvInner(ch);
      if (welcome.t !== "welcome") throw new ProtocolError(ErrorCode.UNEXPECTED, `expected welcome, got ${welcome.t}`);
      this.welcome = welcome;
      this.emit("welcome", { device: o.deviceId, role: welcome.role, split: welcome.split, chunks: welcome.chunks, runtime: o.runtime.name });
      for (;;) {
        const msg = await this.recvInner(ch, true);
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
            await this.carryOut(ch, ins);
          } catch (exc) {
            if (!(exc instanceof RoundAborted)) throw exc;
            this.emit("aborted", { device: o.deviceId, round: ins.round });
            this.progress = null;
          }
          ins = ch.session.nextInstruction();
        }
      }
    } catch (exc) {
      if (exc instanceof ServerBye) return true;
      throw exc;
    }
  }

  /** The next message that is not a queued follow-up instruction (unless `idle`: then it is the work). */
  private async recvInner(ch: Channel, idle = false): Promise<Message> {
    for (;;) {
      const msg = await ch.recv();
      if (msg.t === "instruction" && !(idle && ch.session.instruction === msg)) continue;
      if (msg.t === "error") throw new DeviceRefused(`${msg.code}: ${msg.message}`);
      if (msg.t === "bye") throw new ServerBye(msg.reason);
      return msg;
    }
  }

  private async carryOut(ch: Channel, ins: Instruction): Promise<void> {
    if (this.progress === null || this.progress.round !== ins.round) this.progress = new RoundProgress(ins.round);
    const prog = this.progress;
    if (!prog.reports.has(ins.phase)) {
      const made = await this.makeReport(ch, ins, prog);
      prog.reports.set(ins.phase, made);
      if (made[1] !== null) await this.options.pending?.save({ round: ins.round, report: made[0], payload: made[1] });
    }
    const [report, payload] = prog.reports.get(ins.phase)!;
    await ch.send(report);
    await this.upload(ch, prog, report, payload, 0);
  }

  private async makeReport(ch: Channel, ins: Instruction, prog: RoundProgress): Promise<[Report, Uint8Array | null]> {
    const n = this.data!.x.shape[0]!;
    const plain = (metrics: Record<string, Scalar>): [Report, null] =>
      [{ t: "report", round: ins.round, phase: ins.phase, num_samples: n, trained: [0, 0], transfer_id: "", metrics }, null];
    if (ins.phase === "train") {
      const trained = await this.trainedUpdate(ch, ins, prog);
      const timings = Object.fromEntries(Object.entries(prog.timings).map(([k, v]) => [k, Math.round(v * 1e6) / 1e6]));
      const metrics: Record<string, Scalar> = { ...trained.metrics, ...timings, peak_rss_bytes: peakRssBytes(), storage: "memory" };
      if (prog.withinEpsilon !== null) metrics["within_epsilon"] = prog.withinEpsilon ? 1 : 0;
      return [{ t: "report", round: ins.round, phase: ins.phase, num_samples: trained.numSamples, trained: trained.trained,
        transfer_id: randomHex(16), metrics }, encodeTensors(trained.deltas)];
    }
    if (ins.phase === "evaluate") {
      const metrics = await this.evaluate(ch, ins, prog);
      const verdict = incentiveCheck(metrics, ins.config);
      if (verdict !== null) {
        prog.withinEpsilon = verdict;
        metrics["within_epsilon"] = verdict ? 1 : 0;
      }
      return plain(metrics);
    }
    if (ins.phase === "compare") return plain(await this.compare(ch, ins, prog));
    throw new ProtocolError(ErrorCode.UNEXPECTED, `this device does not know the phase ${ins.phase}`);
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
    const ack = await this.recvInner(ch);
    if (ack.t !== "ack") throw new ProtocolError(ErrorCode.UNEXPECTED, `expected ack, got ${ack.t}`);
    prog.timings["upload_s"]! += (performance.now() - started) / 1000;
    prog.reports.delete(report.phase);
    if (payload !== null) await this.options.pending?.clear();
    const role = this.welcome?.role ?? "";
    this.reports.push({ round: report.round, role, phase: report.phase, trained: report.trained, accepted: ack.accepted, metrics: report.metrics });
    this.emit("round_done", { device: this.options.deviceId, round: report.round, phase: report.phase, accepted: ack.accepted,
      reason: ack.reason, role, trained: report.trained, runtime: this.options.runtime.name, ...prog.timings });
  }

  // -- phases -------------------------------------------------------------------------------
  /** The input of block `ins.split` for every local sample: the raw data, or the frozen chunks' output. */
  private async forward(ch: Channel, ins: Instruction, prog: RoundProgress): Promise<Tensor> {
    const done = prog.chunksDone;
    if (prog.activations === null || done.some((id, i) => ins.chunk_ids[i] !== id)) {
      prog.activations = this.data!.x;
      prog.chunksDone = [];
    }
    const batch = this.options.forwardBatch || this.welcome!.batch_size;
    for (const id of ins.chunk_ids.slice(prog.chunksDone.length)) {
      const chunk = await this.fetch(ch, ins.round, id, prog);
      const t = performance.now();
      prog.activations = await multiStepForward(this.options.runtime, [chunk], prog.activations, batch, this.options.threads ?? 1);
      prog.chunksDone = [...prog.chunksDone, id];
      prog.timings["forward_s"]! += (performance.now() - t) / 1000;
    }
    return prog.activations;
  }

  /** The tail's input, its received state and its training graph in ONNX Runtime. */
  private async graphTail(ch: Channel, ins: Instruction, prog: RoundProgress): Promise<[Tensor, Record<string, TensorValue>, OrtTail]> {
    const graphId = ins.config[TRAIN_GRAPH_KEY];
    if (typeof graphId !== "string" || !graphId) {
      throw new ProtocolError(ErrorCode.UNEXPECTED, "this device trains from training graphs only, and the instruction names none");
    }
    if (ins.selection === "channels") throw new ProtocolError(ErrorCode.UNEXPECTED, "a channel selection (width reduction) trains with torch");
    const x = await this.forward(ch, ins, prog);
    const graph = parseTrainGraph(await this.fetch(ch, ins.round, graphId, prog));
    if (graph.model !== this.welcome!.model || graph.split !== ins.split) {
      throw new ProtocolError(ErrorCode.MALFORMED, `training graph of ${graph.model} split ${graph.split}, instruction for ${this.welcome!.model} split ${ins.split}`);
    }
    const state = decodeTensors(await this.fetch(ch, ins.round, ins.model_id, prog), this.limits);
    return [x, state, new OrtTail(this.options.runtime, graph, this.options.threads ?? 1)];
  }

  private trainConfig(ins: Instruction, evaluating = false): TrainConfig {
    const w = this.welcome!;
    const num = (v: Scalar | undefined, d: number) => (v === undefined ? d : Number(v));
    return {
      localSteps: ins.local_steps, batchSize: w.batch_size, lr: ins.lr > 0 ? ins.lr : 1e-3,
      momentum: num(w.config["momentum"], 0.9), weightDecay: num(w.config["weight_decay"], 1e-4),
      seed: deviceSeed(num(ins.config["seed"], 0), this.options.deviceId), proxMu: num(ins.config["prox_mu"], 0),
      evalSamples: Math.max(1, num(ins.config["eval_samples"], evaluating ? 512 : w.batch_size)), threads: this.options.threads ?? 1,
    };
  }

  /** This round's update for the instruction's model payload: trained once, then reused. */
  private async trainedUpdate(ch: Channel, ins: Instruction, prog: RoundProgress): Promise<Trained> {
    const done = prog.trained.get(ins.model_id);
    if (done !== undefined) return done;
    const [x, state, tail] = await this.graphTail(ch, ins, prog);
    const t = performance.now();
    const result = await trainTail(tail, state, x, this.data!.y, this.trainConfig(ins));
    await tail.release();
    prog.timings["train_s"]! += (performance.now() - t) / 1000;
    const trained: Trained = { deltas: result.deltas, numSamples: result.numSamples, trained: [ins.split, this.welcome!.num_blocks],
      metrics: { loss_before: result.lossBefore, loss_after: result.lossAfter, steps: result.steps, backend: this.options.runtime.name } };
    prog.trained.set(ins.model_id, trained);
    return trained;
  }

  private async evaluate(ch: Channel, ins: Instruction, prog: RoundProgress): Promise<Record<string, Scalar>> {
    const [x, state, tail] = await this.graphTail(ch, ins, prog);
    const t = performance.now();
    const metrics = await evaluateTail(tail, state, x, this.data!.y, this.trainConfig(ins, true));
    await tail.release();
    prog.timings["eval_s"] = (prog.timings["eval_s"] ?? 0) + (performance.now() - t) / 1000;
    return metrics;
  }

  /** ||delta - b||^2, <delta, b> and ||delta||^2 over the broadcast's entries (VaRSeL eq. 8). */
  private async compare(ch: Channel, ins: Instruction, prog: RoundProgress): Promise<Record<string, Scalar>> {
    if (!ins.broadcast_id) throw new ProtocolError(ErrorCode.MALFORMED, "a compare instruction needs a broadcast");
    const trained = await this.trainedUpdate(ch, ins, prog);
    const broadcast = decodeTensors(await this.fetch(ch, ins.round, ins.broadcast_id, prog), this.limits);
    let sqDistance = 0, dot = 0, sqNorm = 0;
    for (const [name, b] of Object.entries(broadcast)) {
      const d = trained.deltas[name];
      if (d === undefined) continue;
      if (isRowSparse(b)) throw new ProtocolError(ErrorCode.MALFORMED, `broadcast ${name} is row-sparse; this device's update is dense`);
      if (b.shape.join(",") !== d.shape.join(",")) throw new ProtocolError(ErrorCode.MALFORMED, `broadcast ${name} has shape [${b.shape}], the update [${d.shape}]`);
      for (let i = 0; i < d.data.length; i++) {
        const dv = Number(d.data[i]), bv = Number(b.data[i]);
        sqDistance += (dv - bv) ** 2; dot += dv * bv; sqNorm += dv * dv;
      }
    }
    return { sq_distance: sqDistance, dot, sq_norm: sqNorm, ...trained.metrics };
  }

  // -- downloads ----------------------------------------------------------------------------
  /** Download one payload, sha256 checked as it lands; a download cut by a dropped connection resumes. */
  private async fetch(ch: Channel, round: number, payloadId: string, prog: RoundProgress): Promise<Uint8Array> {
    const t = performance.now();
    let incoming = prog.partial.get(payloadId);
    for (;;) {
      await ch.send({ t: "fetch", round, payload_id: payloadId, offset: incoming?.offset ?? 0 });
      const begin = await this.recvInner(ch);
      if (begin.t === "ack" && !begin.accepted) throw new RoundAborted(begin.reason);
      if (begin.t !== "transfer_begin") throw new ProtocolError(ErrorCode.UNEXPECTED, `expected a transfer, got ${begin.t}`);
      if (incoming === undefined) { incoming = new IncomingTransfer(begin, this.limits); break; }
      if (incoming.begin.sha256 === begin.sha256 && begin.offset === incoming.offset) {
        incoming.resume(begin);
        this.emit("download_resumed", { device: this.options.deviceId, round, payload: payloadId, offset: begin.offset, total: begin.total_size });
        break;
      }
      await this.drain(ch, begin); // the payload changed since the partial download: start again from 0
      incoming = undefined;
    }
    prog.partial.set(payloadId, incoming);
    while (!incoming.finished) {
      const msg = await ch.recv();
      if (msg.t === "transfer_frame") incoming.feed(msg);
      else if (msg.t === "transfer_end") incoming.finish(msg);
      else if (msg.t === "error") throw new ProtocolError(msg.code, msg.message, true);
      else throw new ProtocolError(ErrorCode.UNEXPECTED, `${msg.t} during transfer ${incoming.begin.transfer_id.slice(0, 64)}`);
    }
    const data = incoming.result();
    prog.partial.delete(payloadId);
    prog.timings["download_s"]! += (performance.now() - t) / 1000;
    return data;
  }

  private async drain(ch: Channel, begin: TransferBegin): Promise<void> {
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
}
