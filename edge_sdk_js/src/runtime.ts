/**
 * The ONNX Runtime a device runs on, injected: `onnxruntime-node` (native, x64/arm64 boards) or
 * `onnxruntime-web` (WebAssembly, in a browser or under Node). Both implement the API of
 * `onnxruntime-common`, which is all this SDK uses, so the same code trains on either.
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
  /** Execution providers for every session: `cpu` (node) or `wasm` (web). */
  executionProviders: string[];
}

/** A runtime from an already imported ONNX Runtime package (a page passes `globalThis.ort`). */
export function makeRuntime(name: "onnxruntime-node" | "onnxruntime-web", ort: OrtApi, threads = 1): Runtime {
  if (name === "onnxruntime-web") {
    ort.env.wasm.numThreads = Math.max(1, threads);
  }
  return { name, ort, executionProviders: name === "onnxruntime-web" ? ["wasm"] : ["cpu"] };
}

/**
 * A session with the small-device settings of the Python device (edge_sdk.forward.ChunkRunner):
 * a fixed number of intra-op threads, sequential execution, no memory-pattern planning.
 */
export async function openSession(runtime: Runtime, model: Uint8Array, threads = 1): Promise<OrtSession> {
  return runtime.ort.InferenceSession.create(model, {
    executionProviders: runtime.executionProviders,
    intraOpNumThreads: Math.max(1, threads),
    interOpNumThreads: 1,
    executionMode: "sequential",
    enableMemPattern: false,
    logSeverityLevel: 3,
  });
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
