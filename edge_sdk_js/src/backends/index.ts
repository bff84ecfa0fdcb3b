/**
 * The training backends a device can be given, by name (`makeBackend`), and the interface a new
 * one implements (./backend.ts). A backend of an app's own needs no entry here: pass the object as
 * `DeviceOptions.backend`.
 */
import type { Runtime } from "../runtime.js";
import type { TrainingBackend } from "./backend.js";
import { GraphBackend } from "./onnxruntime.js";
import { WebGpuBackend } from "./webgpu.js";

export type { PreparedTail, TailRequest, TrainingBackend } from "./backend.js";
export { GraphBackend } from "./onnxruntime.js";
export { PROBE_SHAPE, measureProbe, probeSgdStep } from "./probe.js";
export { WebGpuBackend, WebGpuFailure, cpuOnlyNodes, type WebGpuAdapter, type WebGpuProbe } from "./webgpu.js";

/** Builds a backend on the device's runtime (the ONNX Runtime it runs frozen chunks in) with `threads`. */
export type BackendFactory = (runtime: Runtime, threads: number) => TrainingBackend;

/**
 * Every backend by name. `onnxruntime`: training graphs in ONNX Runtime (the Python device's name
 * for the same); `onnxruntime-webgpu`: the same graphs on a browser's GPU (ONNX Runtime Web's
 * WebGPU build as the runtime), WebAssembly where the GPU is missing or lost.
 */
export const BACKENDS: ReadonlyMap<string, BackendFactory> = new Map<string, BackendFactory>([
  ["onnxruntime", (runtime, threads) => new GraphBackend(runtime, threads)],
  ["onnxruntime-webgpu", (runtime, threads) => new WebGpuBackend(runtime, threads)],
]);

/** The device's default backend. */
export const DEFAULT_BACKEND = "onnxruntime";

/** The backend registered as `name`, on `runtime`. */
export function makeBackend(name: string, runtime: Runtime, threads = 1): TrainingBackend {
  const factory = BACKENDS.get(name);
  if (factory === undefined) throw new Error(`unknown training backend '${name}' (known: ${[...BACKENDS.keys()].join(", ")})`);
  return factory(runtime, threads);
}
