/**
 * Import an ONNX Runtime package by name, for Node (the command line, a board's app). Its own module,
 * outside the browser entry (src/browser.ts): a page imports onnxruntime-web itself and passes it to
 * `makeRuntime`, so a browser build never meets `onnxruntime-node`, an optional peer dependency.
 */
import { makeRuntime, type OrtApi, type Runtime } from "./runtime.js";

/**
 * Node's full garbage collection (`--expose-gc`, set here so that the command needs no flag). A
 * Node device otherwise keeps a payload it is done with until V8 next feels pressure on its own heap,
 * which the typed arrays outside it do little to raise: a weak digits_mlp device at 185 MiB downloads
 * two 17 MB chunks a round and its resident memory grew by about 17 MiB a round without it.
 */
async function nodeCollector(): Promise<() => void> {
  // Imported here, not at the top: pages that import this package's Node entry must still load.
  const [{ setFlagsFromString }, { runInNewContext }] = await Promise.all([import("node:v8"), import("node:vm")]);
  setFlagsFromString("--expose-gc");
  const gc = runInNewContext("gc") as () => void;
  return () => gc();
}

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
    return { ...makeRuntime("onnxruntime-node", ort, threads), collect: await nodeCollector() };
  }
  const ort = (await import("onnxruntime-web")) as unknown as OrtApi;
  return { ...makeRuntime("onnxruntime-web", ort, threads), collect: await nodeCollector() };
}
