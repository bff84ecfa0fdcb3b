/**
 * Import an ONNX Runtime package by name, for Node (the command line, a board's app). Its own module,
 * outside the browser entry (src/browser.ts): a page imports onnxruntime-web itself and passes it to
 * `makeRuntime`, so a browser build never meets `onnxruntime-node`, an optional peer dependency.
 */
import { makeRuntime, type OrtApi, type Runtime } from "./runtime.js";

/** `onnxruntime-node` (native; install it beside this package) or `onnxruntime-web` (WebAssembly under Node). */
export async function loadRuntime(kind: "node" | "web", threads = 1): Promise<Runtime> {
  if (kind === "node") {
    let ort: OrtApi;
    try {
      ort = (await import("onnxruntime-node")) as unknown as OrtApi;
    } catch (exc) {
      throw new Error("the node runtime needs onnxruntime-node: npm install onnxruntime-node "
        + `(or --runtime web: onnxruntime-web in WebAssembly): ${(exc as Error).message}`);
    }
    return makeRuntime("onnxruntime-node", ort, threads);
  }
  const ort = (await import("onnxruntime-web")) as unknown as OrtApi;
  return makeRuntime("onnxruntime-web", ort, threads);
}
