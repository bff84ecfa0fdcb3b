/**
 * One round's work on a device (docs/protocol.md, "Phases" and "One round"; the Python twin is
 * edge_sdk/roundwork.py): the instruction's phase, run from the device's registry (src/phases.ts)
 * with a `PhaseContext` that does each of the device's own steps at most once per round. The
 * multi-step forward pass (EmbracingFL Algorithm 1): fetch the frozen chunks one at a time and run
 * each over the local data, the activations at the split cached for the round; then the tail from
 * the device's training backend (src/backends/), trained once per model payload. What survives a
 * reconnect within the round is its `RoundProgress`.
 */
import type { TrainingBackend, PreparedTail } from "./backends/backend.js";
import { randomHex } from "./credentials.js";
import type { DeviceData } from "./data.js";
import { downloadSlot, fetchPayload } from "./downloads.js";
import { ErrorCode, ProtocolError } from "./errors.js";
import { runChunk } from "./forward.js";
import { SECAGG_KEY, type Instruction, type Limits, type Report, type Scalar, type SecAggUnmask, type Welcome } from "./messages.js";
import type { PayloadStore } from "./payload-store.js";
import type { DeviceRegistry, Metrics, PhaseContext, TrainedUpdate } from "./phases.js";
import type { Runtime } from "./runtime.js";
import { deviceSeed } from "./sampling.js";
import type { DeviceRound } from "./secagg/round.js";
import { decodeTensors, encodeTensors, type Tensor, type TensorValue } from "./tensors.js";
import type { TrainConfig } from "./trainer.js";
import type { IncomingTransfer } from "./transfer.js";
import type { Channel } from "./transport.js";
import type { UpdateEncoder } from "./wire-codecs.js";

export type EventSink = (kind: string, data: Record<string, unknown>) => void;

/** A report and its encoded tensors (null: none), kept until the server acknowledges it. */
export type HeldReport = [Report, Uint8Array | null];

/** What survives a reconnect within one round. */
export class RoundProgress {
  /** Chunk ids run forward so far, in order, and their output. */
  chunksDone: string[] = [];
  activations: Tensor | null = null;
  readonly partial = new Map<string, IncomingTransfer>();
  /** Trained updates by model payload id. */
  readonly trained = new Map<string, TrainedUpdate>();
  /** Reports by phase, until acknowledged. */
  readonly reports = new Map<string, HeldReport>();
  /** What this round's phases share (`PhaseContext.notes`). */
  readonly notes: Metrics = {};
  readonly timings: Record<string, number> = { download_s: 0, forward_s: 0, train_s: 0, upload_s: 0 };
  /** The round's secure-aggregation state (src/secagg/round.ts), until it has answered the unmasking. */
  secure: DeviceRound | null = null;
  constructor(readonly round: number) {}
}

/** The device as its round's work sees it. */
export interface WorkingDevice {
  readonly deviceId: string;
  readonly data: DeviceData;
  readonly welcome: Welcome;
  /** Runs the frozen chunks. */
  readonly runtime: Runtime;
  readonly backend: TrainingBackend;
  readonly registry: DeviceRegistry;
  readonly threads: number;
  /** Batch of the multi-step forward pass; 0: the planned batch size. */
  readonly forwardBatch: number;
  readonly limits: Limits;
  readonly emit: EventSink;
  /** Encodes updates through the instruction's codec, its error feedback kept across rounds. */
  readonly updates: UpdateEncoder;
  /** Payloads kept by sha256 (src/payload-store.ts): none it holds is downloaded again. */
  readonly payloadStore?: PayloadStore;
  /** The device's credential: it signs a secure round's keys (src/secagg/binding.ts). */
  readonly secret?: string;
  /** The device's own t in secure rounds (`secure-min-survivors`). */
  readonly secureMinSurvivors?: number;
}

/** Resident memory of this process at its peak, where the platform tells (Node); else 0. */
function peakRssBytes(): number {
  const proc = (globalThis as { process?: { resourceUsage?: () => { maxRSS: number } } }).process;
  return proc?.resourceUsage ? proc.resourceUsage().maxRSS * 1024 : 0;
}

function seconds(since: number): number {
  return (performance.now() - since) / 1000;
}

/** Do the instruction's phase (and the hooks after it) and make its report. */
export async function phaseReport(device: WorkingDevice, ch: Channel, ins: Instruction, prog: RoundProgress): Promise<HeldReport> {
  const result = await device.registry.run(new RoundWork(device, ch, ins, prog));
  const numSamples = result.numSamples ?? device.data.x.shape[0]!;
  let payload: Uint8Array | null = null;
  if (result.tensors !== undefined && ins.config[SECAGG_KEY]) payload = await masked(device, ch, ins, prog, result.tensors, numSamples);
  else if (result.tensors !== undefined) payload = device.updates.encode(result.tensors, ins.config);
  return [{ t: "report", round: ins.round, phase: ins.phase, num_samples: numSamples,
    trained: result.trained ?? [0, 0], transfer_id: payload === null ? "" : randomHex(16), metrics: result.metrics,
    model_version: ins.model_version }, payload];
}

/** A secure round's upload in place of the update (src/secagg/exchange.ts; the cryptography loads here). */
async function masked(device: WorkingDevice, ch: Channel, ins: Instruction, prog: RoundProgress,
  tensors: Record<string, TensorValue>, numSamples: number): Promise<Uint8Array> {
  const exchange = await import("./secagg/exchange.js");
  prog.secure = await exchange.startRound(device.deviceId, device.secret ?? "", ins, device.welcome.num_blocks,
    device.secureMinSurvivors);
  return encodeTensors(await exchange.maskedUpdate(ch, prog.secure, ins, tensors, numSamples));
}

/** Answer a secure round's unmasking request, once; the refusal if the device refused it ("" if not). */
export async function revealRound(ch: Channel, prog: RoundProgress | null, msg: SecAggUnmask): Promise<string> {
  const exchange = await import("./secagg/exchange.js");
  const refused = await exchange.reveal(ch, prog?.secure ?? null, msg);
  // answered for good (not only signed the survivor set)
  if (prog !== null && (refused !== "" || Object.keys(msg.signatures).length > 0)) prog.secure = null;
  return refused;
}

/** The device as a phase handler sees it: one instruction on one connection, with the round's progress. */
class RoundWork implements PhaseContext {
  constructor(private readonly device: WorkingDevice, private readonly ch: Channel, readonly instruction: Instruction,
    private readonly prog: RoundProgress) {}

  get deviceId(): string { return this.device.deviceId; }
  get x(): Tensor { return this.device.data.x; }
  get y(): Tensor { return this.device.data.y; }
  get notes(): Metrics { return this.prog.notes; }

  event(kind: string, data: Record<string, unknown>): void { this.device.emit(kind, data); }

  usage(): Metrics {
    const timings = Object.entries(this.prog.timings).map(([k, v]) => [k, Math.round(v * 1e6) / 1e6]);
    return { ...Object.fromEntries(timings), peak_rss_bytes: peakRssBytes(), storage: "memory" };
  }

  async fetchTensors(payloadId: string): Promise<Record<string, TensorValue>> {
    return decodeTensors(await this.fetch(payloadId), this.device.limits);
  }

  /** This round's update for the instruction's model payload: trained once, then reused. */
  async trained(): Promise<TrainedUpdate> {
    const ins = this.instruction;
    const done = this.prog.trained.get(ins.model_id);
    if (done !== undefined) return done;
    const [x, tail] = await this.tail();
    const t = performance.now();
    const result = await tail.train(x, this.y, this.trainConfig()).finally(() => tail.release());
    this.prog.timings["train_s"]! += seconds(t);
    const update: TrainedUpdate = { deltas: result.deltas, numSamples: result.numSamples,
      trained: [ins.split, this.device.welcome.num_blocks],
      metrics: { loss_before: result.lossBefore, loss_after: result.lossAfter, steps: result.steps, backend: this.device.backend.name,
        ...result.metrics } };
    this.prog.trained.set(ins.model_id, update);
    return update;
  }

  async evaluate(): Promise<Metrics> {
    const [x, tail] = await this.tail();
    const t = performance.now();
    const metrics = await tail.evaluate(x, this.y, this.trainConfig(true)).finally(() => tail.release());
    this.prog.timings["eval_s"] = (this.prog.timings["eval_s"] ?? 0) + seconds(t);
    return metrics;
  }

  /** Download one of the instruction's payloads (resumed after a drop, timed as the round's download_s). */
  private async fetch(payloadId: string): Promise<Uint8Array> {
    const t = performance.now();
    const device = this.device;
    const data = await fetchPayload(this.ch, this.instruction.round, payloadId, {
      limits: device.limits, partial: this.prog.partial,
      onResumed: (resumed) => device.emit("download_resumed", { device: device.deviceId, ...resumed }),
      digest: this.instruction.digests?.[payloadId] ?? "", ...(device.payloadStore ? { store: device.payloadStore } : {}),
      onHeld: (held) => device.emit("from_store", { device: device.deviceId, ...held }),
      slot: downloadSlot(this.instruction, payloadId),
      onDelta: (applied) => device.emit("delta_applied", { device: device.deviceId, ...applied }),
    });
    this.prog.timings["download_s"]! += seconds(t);
    return data;
  }

  /** The tail's input and the tail from the backend; the instruction is checked before any download. */
  private async tail(): Promise<[Tensor, PreparedTail]> {
    const { instruction: ins, device } = this;
    const selection = device.registry.selection(ins.selection);
    selection.check?.(ins);
    if (device.backend.needsGraph && !selection.trainsGraph) {
      throw new ProtocolError(ErrorCode.UNEXPECTED, `no training graph trains a '${ins.selection}' selection, and this device's backend (${device.backend.name}) trains from training graphs`);
    }
    device.backend.check(ins);
    const x = await this.forward();
    const tail = await device.backend.prepare({ instruction: ins, welcome: device.welcome, fetch: (id) => this.fetch(id),
      fetchTensors: (id) => this.fetchTensors(id) });
    return [x, tail];
  }

  /** The input of block `split` for every local sample: the raw data, or the frozen chunks' output. */
  private async forward(): Promise<Tensor> {
    const { instruction: ins, prog, device } = this;
    if (prog.activations === null || prog.chunksDone.some((id, i) => ins.chunk_ids[i] !== id)) {
      prog.activations = device.data.x;
      prog.chunksDone = [];
    }
    const batch = device.forwardBatch || device.welcome.batch_size;
    for (const id of ins.chunk_ids.slice(prog.chunksDone.length)) {
      const downloaded = prog.timings["download_s"]!;
      const t = performance.now();
      // The chunk is downloaded as its session opens, and its bytes are held only until then.
      prog.activations = await runChunk(device.runtime, () => this.fetch(id), prog.activations, batch, device.threads);
      prog.chunksDone = [...prog.chunksDone, id];
      prog.timings["forward_s"]! += seconds(t) - (prog.timings["download_s"]! - downloaded);
    }
    return prog.activations;
  }

  private trainConfig(evaluating = false): TrainConfig {
    const { instruction: ins, device } = this;
    const w = device.welcome;
    const num = (v: Scalar | undefined, d: number) => (v === undefined ? d : Number(v));
    return {
      localSteps: ins.local_steps, batchSize: w.batch_size, lr: ins.lr > 0 ? ins.lr : 1e-3,
      momentum: num(w.config["momentum"], 0.9), weightDecay: num(w.config["weight_decay"], 1e-4),
      seed: deviceSeed(num(ins.config["seed"], 0), device.deviceId), proxMu: num(ins.config["prox_mu"], 0),
      evalSamples: Math.max(1, num(ins.config["eval_samples"], evaluating ? 512 : w.batch_size)), threads: device.threads,
    };
  }
}
