/**
 * The training-graph backend on a browser's GPU: ONNX Runtime Web's WebGPU execution provider
 * (`ort.webgpu.min.mjs`). The same training graph and the same update rule as the WebAssembly
 * backend (./onnxruntime.ts, src/trainer.ts): the graph's sessions run with the execution providers
 * `["webgpu", "wasm"]`, so ONNX Runtime places every operator that has a WebGPU kernel on the GPU
 * and the others on WebAssembly (docs/js-device.md, "WebGPU"); the momentum SGD stays in
 * JavaScript, in float32 as the Python device's.
 *
 * Where the GPU is missing or goes away, the device trains on WebAssembly instead, and says so:
 * - no `navigator.gpu`, no adapter, or a WebGPU session that does not start: the probe (`probe()`,
 *   else the first `prepare`) finds it, and the hello names `onnxruntime-web` alone;
 * - the device lost (driver reset, the tab's GPU process gone, `GPUDevice.destroy()`) or a WebGPU
 *   session or run that fails mid-round: the instruction's training starts again on WebAssembly
 *   from the state received, so the update is exactly the WebAssembly backend's; every later tail
 *   trains on WebAssembly too (ONNX Runtime opens its GPU device once per page).
 * Each train report's `backend` names the runtime that trained it (`onnxruntime-webgpu` or
 * `onnxruntime-web`), `webgpu_adapter` the adapter, and `webgpu_fallback` why it ran on WebAssembly.
 */
import type { InferenceSession } from "onnxruntime-common";
import type { Scalar } from "../messages.js";
import { onnxNodes } from "../onnxnodes.js";
import { EXECUTION_PROVIDERS, makeRuntime, type OrtApi, type OrtSession, type Runtime } from "../runtime.js";
import type { Tensor, TensorValue } from "../tensors.js";
import { OrtTail, evaluateTail, trainTail, type TrainConfig, type TrainGraph, type TrainResult } from "../trainer.js";
import type { PreparedTail, TailRequest, TrainingBackend } from "./backend.js";
import { checkGraphInstruction, receiveTail } from "./onnxruntime.js";

/** The 84-byte model of edge_sdk.forward's warm-up (Relu over a (batch, 64) float input): the probe runs it on the GPU. */
const PROBE_MODEL = "CAk6SgoMCgF4EgF5IgRSZWx1EgZ3YXJtdXBaGAoBeBITChEIARINCgcSBWJhdGNoCgIIQGIYCgF5EhMKEQgBEg0KBxIFYmF0Y2gKAghAQgQKABAS";

/** A failure of ONNX Runtime's WebGPU path: opening a session on it, or one of its runs. */
export class WebGpuFailure extends Error {
  constructor(what: string, override readonly cause: unknown) {
    super(`${what} failed: ${cause instanceof Error ? cause.message : String(cause)}`.slice(0, 300));
    this.name = "WebGpuFailure";
  }
}

/**
 * Nodes of `model` the WebGPU execution provider takes but cannot run (ONNX Runtime Web 1.30):
 * MaxPool with its Indices output, which a training graph uses for MaxPool's gradient ("The
 * Indices output is not supported yet", at the first run). They run on WebAssembly instead.
 */
export function cpuOnlyNodes(model: Uint8Array): string[] {
  return onnxNodes(model).filter((n) => n.opType === "MaxPool" && (n.outputs[1] ?? "") !== "").map((n) => n.name);
}

/**
 * `ort` whose sessions keep `cpuOnlyNodes` off the GPU and whose creation and runs throw
 * `WebGpuFailure`: what the GPU path failed at, told apart from the trainer's own errors.
 */
function tagged(ort: OrtApi): OrtApi {
  const create = async (model: Uint8Array, options: SessionOptions): Promise<OrtSession> => {
    const cpu = cpuOnlyNodes(model);
    const providers = options.executionProviders?.map((ep) => (ep === "webgpu" && cpu.length > 0
      ? { name: "webgpu" as const, forceCpuNodeNames: cpu } : ep));
    let session: OrtSession;
    try {
      session = await ort.InferenceSession.create(model, { ...options, executionProviders: providers });
    } catch (exc) {
      throw new WebGpuFailure("opening a WebGPU session", exc);
    }
    const run = session.run.bind(session);
    Object.defineProperty(session, "run", {
      value: (...a: Parameters<OrtSession["run"]>) => run(...a).catch((exc: unknown) => { throw new WebGpuFailure("a WebGPU run", exc); }),
    });
    return session;
  };
  return { InferenceSession: { create } as unknown as OrtApi["InferenceSession"], Tensor: ort.Tensor, env: ort.env };
}

type SessionOptions = InferenceSession.SessionOptions;

/** The adapter as `GPUAdapterInfo` describes it (what a page may read of the GPU). */
export interface WebGpuAdapter {
  vendor: string;
  architecture: string;
  device: string;
  description: string;
}

/** The parts of WebGPU's API the probe uses (typed here: the SDK builds without the DOM's WebGPU types). */
interface GpuNavigator {
  gpu?: { requestAdapter(): Promise<{ info?: Partial<WebGpuAdapter> } | null> };
}
interface GpuDevice {
  lost: Promise<{ reason?: string; message?: string }>;
}

/** What the probe found: the GPU path usable (on its adapter), or not (and why). */
export type WebGpuProbe = { adapter: WebGpuAdapter } | { off: string };

export class WebGpuBackend implements TrainingBackend {
  readonly needsGraph = true;
  /** Sessions on the GPU (`["webgpu", "wasm"]`: per-operator fallback to WebAssembly). */
  readonly gpu: Runtime;
  /** Sessions on WebAssembly: where training goes once the GPU is missing or lost. */
  readonly wasm: Runtime;
  private probed: Promise<WebGpuProbe> | null = null;
  private found: WebGpuAdapter | null = null;
  private off: string | null = null;
  /** The probe's session, kept open: ONNX Runtime closes its GPU device with its last WebGPU session. */
  private keeper: OrtSession | null = null;

  /** `runtime`: an ONNX Runtime Web build with WebGPU (its `ort.webgpu.min.mjs`), the one the device runs its frozen chunks in. */
  constructor(readonly runtime: Runtime, readonly threads = 1) {
    this.gpu = makeRuntime("onnxruntime-webgpu", tagged(runtime.ort), threads);
    this.wasm = runtime.executionProviders.join() === EXECUTION_PROVIDERS["onnxruntime-web"].join()
      ? runtime : makeRuntime("onnxruntime-web", runtime.ort, threads);
  }

  /** Why tails train on WebAssembly (no adapter, the device lost, ...); null while the GPU path stands. */
  get fallback(): string | null {
    return this.off;
  }

  /** The adapter, once the probe found one (kept after the device is lost: the reports name it). */
  get adapter(): WebGpuAdapter | null {
    return this.found;
  }

  /** What reports name in `metrics.backend`: the runtime tails train on now. */
  get name(): string {
    return this.fallback === null ? this.gpu.name : this.wasm.name;
  }

  /** The hello's runtimes: the GPU first (a server that does not know it plans the device on WebAssembly), or WebAssembly alone. */
  get runtimes(): readonly string[] {
    return this.fallback === null ? [this.gpu.name, this.wasm.name] : [this.wasm.name];
  }

  /**
   * Find out, once, whether the GPU path works: an adapter, and a WebGPU session that opens and runs.
   * A page calls it before `DeviceClient.run()` so the first hello names the right runtimes and the
   * page can say which path trains; else the first `prepare` does.
   */
  probe(): Promise<WebGpuProbe> {
    this.probed ??= this.findGpu().then((found) => {
      if ("off" in found) this.lose(found.off);
      else this.found = found.adapter;
      return found;
    });
    return this.probed;
  }

  private async findGpu(): Promise<WebGpuProbe> {
    const gpu = (globalThis.navigator as GpuNavigator | undefined)?.gpu;
    if (gpu === undefined) return { off: "this browser has no WebGPU (navigator.gpu)" };
    let adapter;
    try {
      adapter = await gpu.requestAdapter();
    } catch (exc) {
      return { off: `no WebGPU adapter: ${String(exc).slice(0, 200)}` };
    }
    if (adapter === null) return { off: "no WebGPU adapter" };
    const info = adapter.info ?? {};
    const described: WebGpuAdapter = { vendor: info.vendor ?? "", architecture: info.architecture ?? "",
      device: info.device ?? "", description: info.description ?? "" };
    const env = this.gpu.ort.env as { webgpu: { adapter?: unknown; device?: Promise<GpuDevice> | GpuDevice } };
    if (env.webgpu.device === undefined) env.webgpu.adapter = adapter; // ONNX Runtime opens its device on this adapter
    try {
      const model = Uint8Array.from(atob(PROBE_MODEL), (ch) => ch.charCodeAt(0));
      this.keeper = await this.gpu.ort.InferenceSession.create(model, { executionProviders: ["webgpu"], logSeverityLevel: 3 });
      await this.keeper.run({ x: new this.gpu.ort.Tensor("float32", new Float32Array(64), [1, 64]) });
    } catch (exc) {
      return { off: `WebGPU did not start (${exc instanceof Error ? exc.message : String(exc)})`.slice(0, 300) };
    }
    const device = await env.webgpu.device;
    if (device === undefined) return { off: "this ONNX Runtime build has no WebGPU (load ort.webgpu.min.mjs)" };
    void device.lost.then((lost) => this.lose(`the GPU device was lost (${lost.reason ?? "unknown"}: ${lost.message ?? ""})`));
    return { adapter: described };
  }

  /** From now on, tails train on WebAssembly, for `why`. */
  lose(why: string): void {
    if (this.off !== null) return;
    this.off = why.slice(0, 300);
    void this.keeper?.release().catch(() => undefined);
    this.keeper = null;
  }

  check(ins: Parameters<TrainingBackend["check"]>[0]): void {
    checkGraphInstruction(ins);
  }

  async prepare(req: TailRequest): Promise<PreparedTail> {
    const { graph, state } = await receiveTail(req);
    await this.probe();
    return new WebGpuTail(this, graph, state);
  }

  /** What a report says of the path that ran: `backend`, the adapter, and why WebAssembly where it was. */
  metrics(): Record<string, Scalar> {
    const out: Record<string, Scalar> = { backend: this.name };
    const adapter = this.adapter;
    if (adapter !== null) out["webgpu_adapter"] = [adapter.vendor, adapter.architecture, adapter.device].filter(Boolean).join(" ");
    if (this.fallback !== null) out["webgpu_fallback"] = this.fallback;
    return out;
  }
}

/** One instruction's tail: on the GPU while the path stands, else (or after it fails) from the start on WebAssembly. */
class WebGpuTail implements PreparedTail {
  constructor(private readonly backend: WebGpuBackend, private readonly graph: TrainGraph,
    private readonly state: Record<string, TensorValue>) {}

  async train(x: Tensor, y: Tensor, cfg: TrainConfig): Promise<TrainResult> {
    const result = await this.attempt((tail) => trainTail(tail, this.state, x, y, cfg));
    return { ...result, metrics: { ...result.metrics, ...this.backend.metrics() } };
  }

  evaluate(x: Tensor, y: Tensor, cfg: TrainConfig): Promise<Record<string, number>> {
    return this.attempt((tail) => evaluateTail(tail, this.state, x, y, cfg));
  }

  async release(): Promise<void> {} // every attempt releases its sessions

  private async attempt<T>(work: (tail: OrtTail) => Promise<T>): Promise<T> {
    const backend = this.backend;
    if (backend.fallback === null) {
      const tail = new OrtTail(backend.gpu, this.graph, backend.threads);
      try {
        return await work(tail);
      } catch (exc) {
        if (!(exc instanceof WebGpuFailure)) throw exc;
        backend.lose(exc.message); // unless the device's lost event said why first
      } finally {
        await tail.release().catch(() => undefined); // sessions of a lost device may refuse to close
      }
    }
    const tail = new OrtTail(backend.wasm, this.graph, backend.threads);
    try {
      return await work(tail);
    } finally {
      await tail.release();
    }
  }
}
