/**
 * The ONNX Runtime a device runs on, injected: `onnxruntime-node` (native, x64/arm64 boards),
 * `onnxruntime-web` (WebAssembly, in a browser or under Node) or `onnxruntime-webgpu` (the same
 * package's WebGPU build, `ort.webgpu.min.mjs`, in a browser with a WebGPU adapter: its sessions
 * run on the GPU, each operator without a WebGPU kernel on WebAssembly). All implement the API of
 * `onnxruntime-common`, which is all this SDK uses, so the same code trains on any of them.
 */
import type * as ortCommon from "onnxruntime-common";

export type OrtApi = {
  InferenceSession: typeof ortCommon.InferenceSession;
  Tensor: typeof ortCommon.Tensor;
  env: ortCommon.Env;
};
export type OrtSession = ortCommon.InferenceSession;
export type OrtTensor = ortCommon.Tensor;

export interface Runtime {
  /** The name the device's hello declares in `runtimes` (docs/protocol.md, "Runtimes"). */
  name: string;
  ort: OrtApi;
  /** Execution providers for every session, in order of preference: ONNX Runtime places each
   * operator on the first that has a kernel for it. */
  executionProviders: string[];
  /** A full garbage collection, where the platform offers one (Node: src/load-runtime.ts); a tab's
   * V8 collects on its own between the tasks `nextTask` yields to. Called after a session is made or
   * released, so the downloaded model bytes and the session's freed buffers go before the next phase
   * grows (docs/js-device.md, "Memory"). */
  collect?: () => void;
}

export type RuntimeName = "onnxruntime-node" | "onnxruntime-web" | "onnxruntime-webgpu";

/** Each runtime's execution providers: `cpu` (node), `wasm` (web), `webgpu` then `wasm` (webgpu). */
export const EXECUTION_PROVIDERS: Readonly<Record<RuntimeName, readonly string[]>> = Object.freeze({
  "onnxruntime-node": ["cpu"],
  "onnxruntime-web": ["wasm"],
  "onnxruntime-webgpu": ["webgpu", "wasm"],
});

/**
 * A runtime from an already imported ONNX Runtime package (a page passes its `ort`). The two
 * browser runtimes may share one `ort`: the WebGPU build (`ort.webgpu.min.mjs`) runs `wasm`
 * sessions too.
 */
export function makeRuntime(name: RuntimeName, ort: OrtApi, threads = 1): Runtime {
  const providers = EXECUTION_PROVIDERS[name];
  if (providers === undefined) throw new Error(`unknown runtime '${name}' (known: ${Object.keys(EXECUTION_PROVIDERS).join(", ")})`);
  if (name !== "onnxruntime-node") ort.env.wasm.numThreads = Math.max(1, threads);
  return { name, ort, executionProviders: [...providers] };
}

/**
 * A session with the small-device settings of the Python device (edge_sdk.forward.ChunkRunner):
 * a fixed number of intra-op threads, sequential execution, no memory-pattern planning, no CPU
 * memory arena (an arena keeps the largest step's buffers for the session's life) and no prepacked
 * weights.
 * `model` may be a function that downloads it: its bytes are then held only until the session
 * exists, and collected before the session runs.
 */
export async function openSession(runtime: Runtime, model: Uint8Array | (() => Promise<Uint8Array>), threads = 1): Promise<OrtSession> {
  let bytes: Uint8Array;
  if (typeof model === "function") {
    bytes = await model();
    runtime.collect?.(); // the download's frames, garbage now, go before the session's copies of the model arrive
  } else bytes = model;
  const session = await runtime.ort.InferenceSession.create(bytes, {
    executionProviders: runtime.executionProviders,
    intraOpNumThreads: Math.max(1, threads),
    interOpNumThreads: 1,
    executionMode: "sequential",
    enableMemPattern: false,
    enableCpuMemArena: false,
    // Prepacked weights are a second copy of every matrix multiplication's weights, made while the
    // graph's own copy is still held: +15 MiB at the creation of a 17 MB chunk's session.
    extra: { session: { disable_prepacking: "1" } },
    logSeverityLevel: 3,
  });
  bytes = new Uint8Array(0); // the model's bytes are the session's now: held here no longer
  runtime.collect?.();
  return session;
}

/** Release a session and collect what it leaves to the garbage collector (`Runtime.collect`). */
export async function closeSession(runtime: Runtime, session: OrtSession): Promise<void> {
  await session.release();
  runtime.collect?.();
}

/**
 * Let the event loop run one task. A session run on onnxruntime-web with one thread never yields:
 * a loop of awaited runs is one chain of microtasks, so a page cannot repaint and V8 cannot finish
 * the garbage collections it schedules as tasks; every run's output arrays then pile up until the
 * loop ends (Chromium, a 4M-parameter tail's 20 steps: 646 MiB peak, 481 MiB with a yield per step).
 */
export function nextTask(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, 0));
}
