/**
 * Import an ONNX Runtime package by name, for Node (the command line, a board's app), and the
 * optional peer dependencies a board installs beside this package (`ws`, `onnxruntime-node`, or
 * `onnxruntime-web` where onnxruntime-node has no build). Its own module, outside the browser entry
 * (src/browser.ts): a page imports onnxruntime-web itself and passes it to `makeRuntime`, so a
 * browser build never meets `onnxruntime-node`.
 */
import { MissingPackages } from "./errors.js";
import { makeRuntime, type OrtApi, type Runtime } from "./runtime.js";

/** The package each runtime kind trains on. */
export const RUNTIME_PACKAGES = { node: "onnxruntime-node", web: "onnxruntime-web" } as const;

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

/** Whether `exc` says that package `name` itself is not installed (not a module inside it failing). */
function notInstalled(exc: unknown, name: string): boolean {
  const e = exc as { code?: string; message?: string };
  return (e?.code === "ERR_MODULE_NOT_FOUND" || e?.code === "MODULE_NOT_FOUND") && (e.message ?? "").includes(`'${name}'`);
}

/** Whether package `name` resolves from here (installed), without loading it. */
function installed(name: string): boolean {
  try {
    import.meta.resolve(name);
    return true;
  } catch {
    return false;
  }
}

/** What to run to install `names`, at the versions this package's peer dependencies name. */
async function installCommand(names: readonly string[]): Promise<string> {
  let peers: Record<string, string> = {};
  try {
    const { readFileSync } = await import("node:fs");
    peers = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")).peerDependencies ?? {};
  } catch { /* bundled elsewhere: the names alone */ }
  const specs = names.map((n) => (peers[n] && /^\d/.test(peers[n]!) ? `${n}@${peers[n]}` : n));
  // onnxruntime-node's install script downloads a CUDA provider from outside the registry (linux x64); a device trains on the CPU.
  return `${names.includes("onnxruntime-node") ? "ONNXRUNTIME_NODE_INSTALL=skip " : ""}npm install ${specs.join(" ")}`;
}

/**
 * The optional peer dependencies `names`, imported; `MissingPackages` naming every one this install
 * lacks and the one command that installs them (a page's install has none of them).
 */
export async function importPeers(names: readonly string[], what = "this device"): Promise<unknown[]> {
  const found = await Promise.allSettled(names.map((n) => import(n)));
  const missing = names.filter((n, i) => found[i]!.status === "rejected" && notInstalled((found[i] as PromiseRejectedResult).reason, n));
  if (missing.length > 0) {
    const list = missing.length === 1 ? missing[0] : `${missing.slice(0, -1).join(", ")} and ${missing.at(-1)}`;
    // A board onnxruntime-node has no build for (armv7) trains on onnxruntime-web in WebAssembly.
    const web = missing.map((n) => (n === "onnxruntime-node" ? "onnxruntime-web" : n)).filter((n) => !installed(n));
    const or = !missing.includes("onnxruntime-node") ? "" : web.length === 0 ? " (or --runtime web: onnxruntime-web is installed)"
      : ` (or --runtime web: ${await installCommand(web)})`;
    throw new MissingPackages(missing, `${what} needs ${list}, installed beside edgetrain-device: ${await installCommand(missing)}${or}`);
  }
  return found.map((r) => {
    if (r.status === "rejected") throw r.reason;
    return r.value;
  });
}

/** `onnxruntime-node` (native; install it beside this package) or `onnxruntime-web` (WebAssembly under Node). */
export async function loadRuntime(kind: "node" | "web", threads = 1): Promise<Runtime> {
  const name = RUNTIME_PACKAGES[kind];
  const [ort] = (await importPeers([name], `--runtime ${kind}`)) as [OrtApi];
  return { ...makeRuntime(name, ort, threads), collect: await nodeCollector() };
}
