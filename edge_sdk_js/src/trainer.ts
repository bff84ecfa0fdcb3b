/**
 * Local training from the server's training graph (docs/protocol.md, "Training graphs" and "The
 * device's training rule"): the graph computes the loss, one gradient per parameter and the new
 * BatchNorm statistics in an ONNX Runtime inference session; the update is momentum SGD written
 * here, step for step the rule of the Python device (edge_sdk/ort_trainer.py), every operation
 * rounded to float32 as numpy does, so from the same state, batches and gradients both devices
 * reach the same weights.
 */
import { Decoder } from "@msgpack/msgpack";
import { ErrorCode, ProtocolError } from "./errors.js";
import type { Scalar } from "./messages.js";
import { closeSession, nextTask, openSession, type OrtSession, type OrtTensor, type Runtime } from "./runtime.js";
import { samplePlan, type SamplePlan } from "./sampling.js";
import { isRowSparse, numel, tensor, type Tensor, type TensorValue } from "./tensors.js";

/** Version of the training-graph payload layout this SDK reads. */
export const GRAPH_FORMAT = 1;

export interface TrainGraph {
  model: string;
  split: number;
  task: string;
  params: string[];
  buffers: string[];
  trainOnnx: Uint8Array;
  evalOnnx: Uint8Array;
  /** Parameters the step reads but does not train (the weights under LoRA adapters): no deltas. */
  frozen: string[];
}

export interface TrainConfig {
  localSteps: number;
  batchSize: number;
  lr: number;
  momentum: number;
  weightDecay: number;
  seed: number;
  evalSamples: number;
  proxMu: number;
  threads: number;
}

export const DEFAULT_TRAIN_CONFIG: TrainConfig = {
  localSteps: 10, batchSize: 32, lr: 0.05, momentum: 0.9, weightDecay: 1e-4, seed: 0, evalSamples: 512, proxMu: 0,
  threads: 1,
};

export interface TrainResult {
  deltas: Record<string, Tensor>;
  numSamples: number;
  lossBefore: number;
  lossAfter: number;
  steps: number;
  /** What the backend adds to the report's metrics (e.g. the runtime that trained: `backend`). */
  metrics?: Record<string, Scalar>;
}

/** Parse a `train_graph` payload (a msgpack map, docs/protocol.md, "Training graphs"). */
export function parseTrainGraph(data: Uint8Array): TrainGraph {
  let obj: unknown;
  try {
    obj = new Decoder().decode(data);
  } catch (exc) {
    throw new ProtocolError(ErrorCode.MALFORMED, `not a training graph payload: ${String(exc).slice(0, 200)}`);
  }
  const o = obj as Record<string, unknown>;
  const strings = (v: unknown) => Array.isArray(v) && v.every((s) => typeof s === "string");
  if (typeof o !== "object" || o === null || o["format"] !== GRAPH_FORMAT) {
    throw new ProtocolError(ErrorCode.MALFORMED, `training graph format ${String(o?.["format"])}, this device reads ${GRAPH_FORMAT}`);
  }
  if (typeof o["model"] !== "string" || typeof o["split"] !== "number" || typeof o["task"] !== "string"
    || !strings(o["params"]) || !strings(o["buffers"]) || !(o["train"] instanceof Uint8Array) || !(o["eval"] instanceof Uint8Array)
    || (o["frozen"] !== undefined && !strings(o["frozen"]))) {
    throw new ProtocolError(ErrorCode.MALFORMED, "not a training graph payload: a field is missing or of the wrong type");
  }
  return { model: o["model"], split: o["split"], task: o["task"], params: o["params"] as string[],
    buffers: o["buffers"] as string[], trainOnnx: o["train"], evalOnnx: o["eval"], frozen: (o["frozen"] ?? []) as string[] };
}

/** Rows `idx` of a tensor, copied into a tensor of their own. */
export function takeRows(t: Tensor, idx: ArrayLike<number>): Tensor {
  const row = numel(t.shape.slice(1));
  const Ctor = t.data.constructor as new (n: number) => Tensor["data"];
  const out = new Ctor(idx.length * row);
  for (let i = 0; i < idx.length; i++) {
    const start = idx[i]! * row;
    (out as Float32Array).set((t.data as Float32Array).subarray(start, start + row), i * row);
  }
  return { dtype: t.dtype, shape: [idx.length, ...t.shape.slice(1)], data: out };
}

/**
 * An output's float32 data, kept past the tensor's dispose(). Both runtimes hand out CPU outputs as
 * typed arrays of their own (onnxruntime-web copies each out of the WebAssembly heap), so no
 * second copy: every copy is garbage for V8 to collect, about 16 MiB per step for a 4M-parameter tail.
 */
function cpuData(t: OrtTensor): Float32Array {
  const data = t.data;
  if (!(data instanceof Float32Array)) throw new Error(`expected float32 output, got ${t.type}`);
  return data;
}

/** The element type a session's `target` input takes (`float32` labels for binary and regression, `int64` classes). */
function targetType(session: OrtSession): string | undefined {
  const meta = session.inputMetadata?.find((m) => m.name === "target");
  return meta?.isTensor ? meta.type : undefined;
}

/**
 * Labels as the graph's `target` takes them, as the Python device casts them (edge_sdk.ort_trainer):
 * a shard's 0/1 labels may come as integers to a graph whose binary loss takes floats.
 */
function asType(y: Tensor, dtype: string | undefined): Tensor {
  if (dtype === undefined || dtype === y.dtype) return y;
  if (dtype === "float32") return tensor("float32", y.shape, Float32Array.from(y.data as ArrayLike<number | bigint>, Number));
  if (dtype === "int64") return tensor("int64", y.shape, BigInt64Array.from(y.data as ArrayLike<number | bigint>, (v) => BigInt(Math.round(Number(v)))));
  return y;
}

/** The tail's two graphs in ONNX Runtime sessions; weights are passed in on every call. */
export class OrtTail {
  private train: OrtSession | null = null;
  private eval: OrtSession | null = null;

  constructor(readonly runtime: Runtime, readonly graph: TrainGraph, readonly threads = 1) {}

  /** Every state entry the graphs read, in their input order. */
  get names(): string[] { return [...this.graph.params, ...this.graph.buffers, ...this.graph.frozen]; }

  /** The entries a step changes: what an update holds. */
  get trained(): string[] { return [...this.graph.params, ...this.graph.buffers]; }

  private ortTensor(t: Tensor): OrtTensor {
    const dtype = t.dtype === "bool" ? "bool" : t.dtype;
    return new this.runtime.ort.Tensor(dtype as "float32", t.data as Float32Array, t.shape);
  }

  private feed(state: Record<string, Float32Array>, shapes: Record<string, number[]>, x: Tensor): Record<string, OrtTensor> {
    const feeds: Record<string, OrtTensor> = { input: this.ortTensor(x) };
    for (const n of this.names) feeds[n] = new this.runtime.ort.Tensor("float32", state[n]!, shapes[n]!);
    return feeds;
  }

  /** One training step's loss, gradients by parameter and new buffers; `state` is not changed. */
  async step(x: Tensor, y: Tensor, state: Record<string, Float32Array>, shapes: Record<string, number[]>) {
    this.train ??= await openSession(this.runtime, this.graph.trainOnnx, this.threads);
    const feeds = this.feed(state, shapes, x);
    feeds["target"] = this.ortTensor(asType(y, targetType(this.train)));
    const out = await this.train.run(feeds);
    const loss = Number((out["loss"]!.data as Float32Array)[0]);
    const grads: Record<string, Float32Array> = {};
    const fresh: Record<string, Float32Array> = {};
    for (const n of this.graph.params) grads[n] = cpuData(out[`grad:${n}`]!);
    for (const n of this.graph.buffers) fresh[n] = cpuData(out[`new:${n}`]!);
    for (const t of Object.values(out)) t.dispose();
    return { loss, grads, fresh };
  }

  /** The tail's output in eval mode (BatchNorm on its running statistics). */
  async forward(x: Tensor, state: Record<string, Float32Array>, shapes: Record<string, number[]>): Promise<Tensor> {
    this.eval ??= await openSession(this.runtime, this.graph.evalOnnx, this.threads);
    const out = await this.eval.run(this.feed(state, shapes, x));
    const o = out["output"] ?? out[this.eval.outputNames[0]!]!;
    const result = tensor("float32", [...o.dims], cpuData(o));
    for (const t of Object.values(out)) t.dispose();
    return result;
  }

  /** Drop a session with its memory arena; it opens again on its next use. */
  async release(which: "train" | "eval" | "both" = "both"): Promise<void> {
    if (which !== "eval" && this.train !== null) { await closeSession(this.runtime, this.train); this.train = null; }
    if (which !== "train" && this.eval !== null) { await closeSession(this.runtime, this.eval); this.eval = null; }
  }
}

/** The mean loss of `output` for the task, in float64 (as edge_sdk.ort_trainer.task_loss). */
export function taskLoss(task: string, output: Tensor, y: Tensor): number {
  const n = output.shape[0]!;
  const width = numel(output.shape.slice(1));
  const out = output.data as Float32Array;
  let total = 0;
  for (let i = 0; i < n; i++) {
    if (task === "classification") {
      let max = -Infinity;
      for (let j = 0; j < width; j++) max = Math.max(max, out[i * width + j]!);
      let sum = 0;
      for (let j = 0; j < width; j++) sum += Math.exp(out[i * width + j]! - max);
      const label = Number((y.data as BigInt64Array)[i]);
      total += -(out[i * width + label]! - max - Math.log(sum));
    } else {
      const z = out[i]!;
      const t = Number(y.data[i]);
      if (task === "binary") total += Math.max(z, 0) - z * t + Math.log1p(Math.exp(-Math.abs(z)));
      else if (task === "regression") total += (z - t) ** 2;
      else throw new Error(`unknown task ${task}`);
    }
  }
  return total / n;
}

function argmaxHits(output: Tensor, y: Tensor): number {
  const n = output.shape[0]!;
  const width = numel(output.shape.slice(1));
  const out = output.data as Float32Array;
  let hits = 0;
  for (let i = 0; i < n; i++) {
    let best = 0;
    for (let j = 1; j < width; j++) if (out[i * width + j]! > out[i * width + best]!) best = j;
    if (BigInt(best) === (y.data as BigInt64Array)[i]) hits++;
  }
  return hits;
}

async function meanLoss(tail: OrtTail, state: Record<string, Float32Array>, shapes: Record<string, number[]>,
  x: Tensor, y: Tensor, idx: Int32Array, batch: number, hits?: { count: number }): Promise<number> {
  let total = 0;
  for (let i = 0; i < idx.length; i += batch) {
    const rows = idx.subarray(i, i + batch);
    const out = await tail.forward(takeRows(x, rows), state, shapes);
    const labels = takeRows(y, rows);
    total += taskLoss(tail.graph.task, out, labels) * rows.length;
    if (hits !== undefined) hits.count += argmaxHits(out, labels);
  }
  return total / Math.max(idx.length, 1);
}

/** The tail's parameters and floating buffers as float32 arrays, with their shapes: float32 tensors
 * as received (views of the downloaded payload, never written: a copy would hold the tail twice),
 * float64 ones converted. */
function denseState(state: Record<string, TensorValue>, names: string[]): [Record<string, Float32Array>, Record<string, number[]>] {
  const arrays: Record<string, Float32Array> = {};
  const shapes: Record<string, number[]> = {};
  for (const n of names) {
    const v = state[n];
    if (v === undefined) throw new ProtocolError(ErrorCode.MALFORMED, `the received state lacks ${n}`);
    if (isRowSparse(v)) throw new ProtocolError(ErrorCode.MALFORMED, `${n} is row-sparse: a training graph trains dense tails only`);
    if (v.dtype !== "float32" && v.dtype !== "float64") throw new ProtocolError(ErrorCode.BAD_DTYPE, `${n} is ${v.dtype}, not floating`);
    arrays[n] = v.data instanceof Float32Array ? v.data : Float32Array.from(v.data as Float64Array);
    shapes[n] = v.shape;
  }
  return [arrays, shapes];
}

/** Loss (and accuracy, for classification) of the received state on the samples `idx` (default: drawn from the seed). */
export async function evaluateTail(tail: OrtTail, state: Record<string, TensorValue>, x: Tensor, y: Tensor,
  cfg: TrainConfig, idx?: Int32Array): Promise<Record<string, number>> {
  const [weights, shapes] = denseState(state, tail.names);
  const rows = idx ?? samplePlan(x.shape[0]!, { ...cfg, localSteps: 0 }).evalIdx;
  const hits = { count: 0 };
  const loss = await meanLoss(tail, weights, shapes, x, y, rows, cfg.batchSize, hits);
  const out: Record<string, number> = { loss };
  if (tail.graph.task === "classification") out["accuracy"] = hits.count / Math.max(rows.length, 1);
  return out;
}

/**
 * One parameter's momentum-SGD step in float32 (edge_sdk.trainer.MomentumSGD):
 * b_1 = g_1 + wd w, b_t = mu b_(t-1) + g_t + wd w, w <- w - lr b_t; without momentum
 * w <- w (1 - lr wd) - lr g; FedProx (Li et al. 2020, eq. 2) adds prox (w - w_received) to g first.
 */
function sgdStep(w: Float32Array, g: Float32Array, initial: Float32Array, buf: Float32Array | undefined,
  c: { lr: number; mu: number; wd: number; prox: number }): Float32Array | undefined {
  const f = Math.fround;
  const { lr, mu, wd, prox } = c;
  const n = w.length;
  if (prox > 0) for (let i = 0; i < n; i++) g[i] = f(g[i]! + f(f(w[i]! - initial[i]!) * prox));
  // Branches stay out of the per-element loops: a 4M-parameter tail spends tens of ms per step here.
  if (!mu) {
    const shrink = f(1 - f(lr * wd));
    if (wd) for (let i = 0; i < n; i++) w[i] = f(w[i]! * shrink);
    for (let i = 0; i < n; i++) w[i] = f(w[i]! - f(g[i]! * lr));
    return undefined;
  }
  if (buf === undefined) {
    const b = Float32Array.from(g);
    if (wd) for (let i = 0; i < n; i++) b[i] = f(b[i]! + f(w[i]! * wd));
    for (let i = 0; i < n; i++) w[i] = f(w[i]! - f(b[i]! * lr));
    return b;
  }
  if (wd) {
    for (let i = 0; i < n; i++) {
      const v = f(f(f(buf[i]! * mu) + g[i]!) + f(w[i]! * wd));
      buf[i] = v;
      w[i] = f(w[i]! - f(v * lr));
    }
  } else {
    for (let i = 0; i < n; i++) {
      const v = f(f(buf[i]! * mu) + g[i]!);
      buf[i] = v;
      w[i] = f(w[i]! - f(v * lr));
    }
  }
  return buf;
}

/**
 * tau local steps of momentum SGD on the tail from `state`; deltas (new - received, float32) per
 * trained parameter and floating buffer (none for frozen weights). `plan` fixes the samples (default: drawn from `cfg.seed`).
 */
export async function trainTail(tail: OrtTail, state: Record<string, TensorValue>, x: Tensor, y: Tensor,
  cfg: TrainConfig, plan?: SamplePlan): Promise<TrainResult> {
  const n = x.shape[0]!;
  if (n === 0 || y.shape[0] !== n) throw new Error(`need matching, non-empty inputs and labels (got ${n} and ${y.shape[0]})`);
  const [initial, shapes] = denseState(state, tail.names);
  // Copies of what training changes; frozen weights (under adapters) are read where they lie.
  const weights: Record<string, Float32Array> = { ...initial };
  for (const k of tail.trained) weights[k] = Float32Array.from(initial[k]!);
  const { evalIdx, batches } = plan ?? samplePlan(n, cfg);
  const lossBefore = await meanLoss(tail, weights, shapes, x, y, evalIdx, cfg.batchSize);
  await tail.release("eval"); // one session's arena at a time, as the Python device
  const f = Math.fround;
  const c = { lr: f(cfg.lr), mu: f(cfg.momentum), wd: f(cfg.weightDecay), prox: f(cfg.proxMu) };
  const momentum: Record<string, Float32Array | undefined> = {};
  for (const idx of batches) {
    const { loss, grads, fresh } = await tail.step(takeRows(x, idx), takeRows(y, idx), weights, shapes);
    if (!Number.isFinite(loss)) throw new Error(`local loss became ${loss}; lower the learning rate`);
    for (const p of tail.graph.params) momentum[p] = sgdStep(weights[p]!, grads[p]!, initial[p]!, momentum[p], c);
    for (const b of tail.graph.buffers) weights[b]!.set(fresh[b]!);
    // Each step's gradients are garbage now: a tail's worth of arrays a step, which V8 would
    // otherwise keep for several steps (a strong digits_mlp device: 34 MB a step, +100 MiB at its peak).
    tail.runtime.collect?.();
    await nextTask();
  }
  await tail.release("train");
  const lossAfter = await meanLoss(tail, weights, shapes, x, y, evalIdx, cfg.batchSize);
  const deltas: Record<string, Tensor> = {};
  for (const name of tail.trained) {
    const w = weights[name]!, init = initial[name]!;
    for (let i = 0; i < w.length; i++) w[i] = f(w[i]! - init[i]!);
    deltas[name] = tensor("float32", shapes[name]!, w);
  }
  return { deltas, numSamples: n, lossBefore, lossAfter, steps: batches.length };
}
