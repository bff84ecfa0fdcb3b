// Headless Chromium (Debian's `chromium`, driven by puppeteer-core: no browser download) and a
// page served from 127.0.0.1 with the cross-origin isolation headers that give WebAssembly
// threads, loading the built SDK and onnxruntime-web as ES modules from local files. For a
// benchmark on a phone: EDGETRAIN_BROWSER_URL (its Chrome's DevTools endpoint, forwarded by
// `adb forward tcp:9222 localabstract:chrome_devtools_remote`) opens the page there instead, and
// EDGETRAIN_PAGE_PORT fixes the page's port for `adb reverse` (bench/README.md).
import { existsSync, readFileSync, statSync } from "node:fs";
import { createServer } from "node:http";
import { basename, extname, join, normalize, resolve } from "node:path";
import { HERE } from "./cases.mjs";

const ROOT = resolve(HERE, "..");
export const CHROMIUM = process.env.CHROMIUM ?? ["/usr/bin/chromium", "/usr/bin/chromium-browser"].find((p) => existsSync(p));
export const CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run"];
/**
 * A tab with a WebGPU adapter: headless Chromium exposes one (SwiftShader, a CPU Vulkan: correct,
 * not fast) with --enable-unsafe-webgpu and without --disable-gpu. Without the switch: no adapter.
 */
export const WEBGPU_FLAGS = [...CHROMIUM_FLAGS.filter((f) => f !== "--disable-gpu"), "--enable-unsafe-webgpu"];

const TYPES = { ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm", ".html": "text/html",
  ".json": "application/json", ".bin": "application/octet-stream", ".onnx": "application/octet-stream" };

/**
 * The page: an import map for the SDK's dependencies, onnxruntime-web as `window.ort`: its
 * WebAssembly build, or with `?ort=webgpu` its WebGPU build (which runs WebAssembly sessions too).
 */
export const page = (build = "wasm") => `<!doctype html><html><head><meta charset="utf-8"><title>edgetrain device</title>
<script type="importmap">{"imports": {
  "@msgpack/msgpack": "/node_modules/@msgpack/msgpack/dist.esm/index.mjs",
  "@noble/ciphers/": "/node_modules/@noble/ciphers/",
  "@noble/curves/": "/node_modules/@noble/curves/",
  "@noble/hashes/": "/node_modules/@noble/hashes/",
  "shamir-secret-sharing": "/node_modules/shamir-secret-sharing/esm/index.js",
  "shamir-secret-sharing/csprng": "/node_modules/shamir-secret-sharing/esm/csprng.js",
  "fflate": "/node_modules/fflate/esm/browser.js",
  "idb": "/node_modules/idb/build/index.js"
}}</script>
<script type="module">
  import * as ort from "/node_modules/onnxruntime-web/dist/ort.${build === "webgpu" ? "webgpu" : "wasm"}.min.mjs";
  import * as sdk from "/dist/index.js";
  ort.env.wasm.wasmPaths = "/node_modules/onnxruntime-web/dist/";
  window.ort = ort;
  window.sdk = sdk;
  window.ready = true;
</script></head><body><pre id="log"></pre></body></html>`;

/**
 * Serve the package folder (dist, node_modules, test) and `extra` folders (`/<name>/...`) on
 * 127.0.0.1 with COOP same-origin and COEP require-corp. Resolves `{ url, close }`.
 */
export function servePage(extra = {}) {
  const server = createServer((req, res) => {
    const url = new URL(req.url, "http://x");
    const path = decodeURIComponent(url.pathname);
    const headers = { "Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp",
      "Cross-Origin-Resource-Policy": "same-origin", "Cache-Control": "no-store" };
    if (path === "/" || path === "/index.html") {
      res.writeHead(200, { ...headers, "Content-Type": "text/html" }).end(page(url.searchParams.get("ort") ?? "wasm"));
      return;
    }
    const [, top, ...rest] = path.split("/");
    const base = top in extra ? extra[top] : ["dist", "node_modules", "test"].includes(top) ? join(ROOT, top) : null;
    const file = base === null ? null : normalize(join(base, ...rest));
    if (file === null || !file.startsWith(base) || !existsSync(file) || !statSync(file).isFile()) {
      res.writeHead(404, headers).end();
      return;
    }
    res.writeHead(200, { ...headers, "Content-Type": TYPES[extname(file)] ?? "application/octet-stream" }).end(readFileSync(file));
  });
  // EDGETRAIN_PAGE_PORT: a fixed port, for a phone that reaches it through `adb reverse`.
  return new Promise((resolvePage) => server.listen(Number(process.env.EDGETRAIN_PAGE_PORT ?? 0), "127.0.0.1", () => {
    resolvePage({ url: `http://127.0.0.1:${server.address().port}/`, close: () => new Promise((r) => server.close(r)) });
  }));
}

/**
 * A headless Chromium with the page open and loaded (window.ready). `webgpu`: the page loads
 * onnxruntime-web's WebGPU build; `adapter` (default: as `webgpu`): the browser offers an adapter;
 * `flags`: more command-line switches of a browser it launches (a measurement's, e.g. V8's `--js-flags`).
 */
export async function openPage(url, { webgpu = false, adapter = webgpu, flags = [] } = {}) {
  const { default: puppeteer } = await import("puppeteer-core");
  // A device page may train for many minutes inside one evaluate: the callers bound it with their own timeouts.
  const remote = process.env.EDGETRAIN_BROWSER_URL;
  const browser = remote ? await puppeteer.connect({ browserURL: remote, protocolTimeout: 0 })
    : await puppeteer.launch({ executablePath: CHROMIUM, headless: true, args: [...(adapter ? WEBGPU_FLAGS : CHROMIUM_FLAGS), ...flags],
      protocolTimeout: 0 });
  const page = await browser.newPage();
  if (remote) browser.close = async () => { await page.close(); await browser.disconnect(); }; // a phone's browser stays open
  page.on("pageerror", (err) => console.error(`# page error: ${err.message}`));
  await page.goto(webgpu ? `${url}?ort=webgpu` : url);
  await page.waitForFunction(() => window.ready === true, { timeout: 60_000 });
  return { browser, page };
}

/**
 * Resident memory of the browser's tab renderers (VmRSS and peak VmHWM, bytes), from /proc. Beside
 * the page's renderer there may be a spare one (a fresh renderer, ~80 MiB): the page's is the largest.
 * `type: "gpu-process"`: the GPU process instead, which holds a WebGPU page's buffers and compiled
 * shaders (on SwiftShader in its own memory; on a phone's GPU in memory the driver maps for it).
 */
export function rendererMemory(browser, type = "renderer") {
  const root = browser.process()?.pid;
  const out = [];
  if (root === undefined) return out;
  const children = (pid) => {
    try {
      return readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim().split(/\s+/).filter(Boolean).map(Number);
    } catch { return []; }
  };
  const walk = (pid) => {
    for (const child of children(pid)) {
      try {
        const cmd = readFileSync(`/proc/${child}/cmdline`, "utf8");
        // Tab renderers only: not the browser's own WebUI renderer (its top chrome).
        if (cmd.includes(`--type=${type}`) && !cmd.includes("--top-chrome-webui")) {
          const status = readFileSync(`/proc/${child}/status`, "utf8");
          const kb = (key) => Number(new RegExp(`${key}:\\s+(\\d+)`).exec(status)?.[1] ?? 0) * 1024;
          out.push({ pid: child, rss: kb("VmRSS"), peak: kb("VmHWM") });
        }
      } catch { /* gone */ }
      walk(child);
    }
  };
  walk(root);
  return out;
}

/**
 * Run one case inside the page (files fetched from /cases/<folder>/). `webgpu`: the tail on the
 * WebGPU backend's GPU runtime (the page opened with `{ webgpu: true }`), the frozen chunks on
 * WebAssembly as a WebGPU device runs them; the result names the adapter, or why there was none.
 */
export async function conformanceInPage(page, folder, { webgpu = false } = {}) {
  return page.evaluate(async (base, webgpu) => {
    const { WebGpuBackend, decodeTensors, makeRuntime } = window.sdk;
    const bytes = async (name) => {
      const res = await fetch(`${base}/${name}`);
      if (!res.ok) throw new Error(`${name}: ${res.status}`);
      return new Uint8Array(await res.arrayBuffer());
    };
    const summary = JSON.parse(new TextDecoder().decode(await bytes("expected.json")));
    const chunks = [];
    for (let i = 0; i < summary.chunks; i++) chunks.push(await bytes(`chunk-${i}.onnx`));
    const c = { chunks, graph: await bytes("graph.bin"), state: decodeTensors(await bytes("state.bin")),
      data: decodeTensors(await bytes("data.bin")), plan: decodeTensors(await bytes("plan.bin")),
      expected: decodeTensors(await bytes("expected.bin")), summary };
    const { runConformance } = await import("/test/conformance-core.mjs");
    const runtime = makeRuntime("onnxruntime-web", window.ort, 1);
    const backend = webgpu ? new WebGpuBackend(runtime, 1) : null;
    const probe = backend === null ? null : await backend.probe();
    const result = await runConformance(runtime, c, backend === null ? runtime : backend.gpu);
    return { ...result, isolated: window.crossOriginIsolated, probe, backend: backend?.name ?? runtime.name,
      expectedNames: Object.keys(c.expected).filter((k) => k.startsWith("delta:")).map((k) => k.slice(6)).sort() };
  }, `/cases/${basename(folder)}`, webgpu);
}


/**
 * Train one case's tail in the page through the WebGPU backend (`prepare`, then `train`, as a device
 * does in a round), and again through the WebAssembly backend on the same `ort`. Test hooks, through
 * the runtime the page hands the backend (the page owns its ONNX Runtime): `loseAt: k` destroys the
 * GPU device (`GPUDevice.destroy()`) just before the k-th run of a WebGPU session after the probe;
 * `failOpen: true` makes opening the first WebGPU session after the probe throw. Resolves the probe,
 * the train report's metrics, the backend's state afterwards, and how far its deltas are from the
 * WebAssembly backend's (max |difference|: 0 where it trained on WebAssembly).
 */
export async function backendInPage(page, folder, { loseAt = 0, failOpen = false } = {}) {
  return page.evaluate(async (base, loseAt, failOpen) => {
    const { GraphBackend, WebGpuBackend, decodeTensors, makeRuntime, multiStepForward } = window.sdk;
    const ort = window.ort;
    const bytes = async (name) => new Uint8Array(await (await fetch(`${base}/${name}`)).arrayBuffer());
    const s = JSON.parse(new TextDecoder().decode(await bytes("expected.json")));
    const chunks = [];
    for (let i = 0; i < s.chunks; i++) chunks.push(await bytes(`chunk-${i}.onnx`));
    const [graph, state, data] = [await bytes("graph.bin"), decodeTensors(await bytes("state.bin")), decodeTensors(await bytes("data.bin"))];
    let armed = false, runs = 0, opened = 0;
    const create = async (model, options) => {
      const gpu = options.executionProviders.includes("webgpu");
      if (armed && gpu && failOpen && opened++ === 0) throw new Error("injected: the WebGPU session does not open");
      const session = await ort.InferenceSession.create(model, options);
      if (!gpu) return session;
      const run = session.run.bind(session);
      session.run = async (...args) => {
        if (armed && ++runs === loseAt) (await ort.env.webgpu.device).destroy();
        return run(...args);
      };
      return session;
    };
    const hooked = { InferenceSession: { create }, Tensor: ort.Tensor, env: ort.env };
    const runtime = makeRuntime("onnxruntime-web", hooked, 1);
    const backend = new WebGpuBackend(runtime, 1);
    const probe = await backend.probe();
    armed = true;
    const acts = await multiStepForward(runtime, chunks, data.x, s.train.batch_size);
    const cfg = { localSteps: s.train.local_steps, batchSize: s.train.batch_size, lr: s.train.lr, momentum: s.train.momentum,
      weightDecay: s.train.weight_decay, seed: s.train.seed, evalSamples: s.train.eval_samples, proxMu: 0, threads: 1 };
    const req = { instruction: { config: { train_graph_id: "graph" }, split: s.split, model_id: "state" }, welcome: { model: s.model },
      fetch: async () => graph, fetchTensors: async () => state };
    const train = async (b) => {
      const tail = await b.prepare(req);
      try { return await tail.train(acts, data.y, cfg); } finally { await tail.release(); }
    };
    const gpu = await train(backend);
    const wasm = await train(new GraphBackend(makeRuntime("onnxruntime-web", ort, 1), 1));
    let vsWasm = 0;
    for (const [name, d] of Object.entries(gpu.deltas)) {
      const w = wasm.deltas[name].data;
      for (let i = 0; i < w.length; i++) vsWasm = Math.max(vsWasm, Math.abs(d.data[i] - w[i]));
    }
    return { probe, metrics: gpu.metrics, vsWasm, names: Object.keys(gpu.deltas).sort(), wasmNames: Object.keys(wasm.deltas).sort(), runs,
      after: { name: backend.name, runtimes: [...backend.runtimes], fallback: backend.fallback } };
  }, `/cases/${basename(folder)}`, loseAt, failOpen);
}
