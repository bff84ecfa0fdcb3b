// Measurements of the JavaScript device for bench/js_devices.py, one JSON object on stdout.
//
//   node bench/run.mjs conformance <case folder>... [--browser] [--webgpu]
//                                                                  every case in node, web (and a Chromium tab, and a
//                                                                  tab whose tail trains on WebGPU)
//   node bench/run.mjs step <case folder> node|web|browser|webgpu STEPS [WARM [THREADS]]
//                                                                  ms per local step after a warm-up round of WARM
//                                                                  steps, and peak memory; fresh process
//   node bench/run.mjs runtime node|web|browser|webgpu             memory of a process (tab) with ONNX Runtime loaded
//   node bench/run.mjs placements <case folder>...                 where ONNX Runtime places each graph's nodes on
//                                                                  WebGPU, and why a node is on WebAssembly
//   node bench/run.mjs profile <case folder> RUNS WARM              a tab's kernel times: the training graph on the
//                                                                  case's first batch, ONNX Runtime's profiler on
import { readFileSync } from "node:fs";
import { dirname, basename } from "node:path";
import { loadRuntime, parseTrainGraph, OrtTail, multiStepForward, samplePlan, trainTail } from "../dist/index.js";
import { CHROMIUM_FLAGS, conformanceInPage, openPage, rendererMemory, servePage } from "../test/browser.mjs";
import { loadCase } from "../test/cases.mjs";
import { runConformance } from "../test/conformance-core.mjs";

// The 84-byte warm-up graph of edge_sdk.forward (Relu over a (batch, 64) float input).
const WARM_UP = "CAk6SgoMCgF4EgF5IgRSZWx1EgZ3YXJtdXBaGAoBeBITChEIARINCgcSBWJhdGNoCgIIQGIYCgF5EhMKEQgBEg0KBxIFYmF0Y2gKAghAQgQKABAS";

const [mode, ...args] = process.argv.slice(2);
// Extra Chromium switches for a diagnosis (bench/js_devices.py --chromium-flags), e.g.
// --js-flags=--liftoff-only: a page cannot set them, so no figure against a target uses them.
CHROMIUM_FLAGS.push(...(process.env.EDGETRAIN_BENCH_CHROMIUM_FLAGS ?? "").split(" ").filter(Boolean));
/** The `key:` field of a /proc status or smaps_rollup text (kB), in bytes. */
const kib = (text, key) => Number(new RegExp(`${key}:\\s+(\\d+)`).exec(text)?.[1] ?? 0) * 1024;
/** VmRSS and VmHWM of this process (getrusage's maxRSS would carry the launching process's peak across exec). */
const rss = () => {
  const status = readFileSync("/proc/self/status", "utf8");
  return { rss: kib(status, "VmRSS"), peak: kib(status, "VmHWM") };
};

async function conformance(folders, browser, webgpu) {
  const out = [];
  for (const kind of ["node", "web"]) {
    const runtime = await loadRuntime(kind);
    for (const f of folders) out.push({ case: basename(f), runtime: `onnxruntime-${kind}`, ...(await runConformance(runtime, loadCase(f))) });
  }
  for (const gpu of [false, true]) {
    if (!(gpu ? webgpu : browser)) continue;
    const site = await servePage({ cases: dirname(folders[0]) });
    const { browser: b, page } = await openPage(site.url, { webgpu: gpu });
    for (const f of folders) {
      const r = await conformanceInPage(page, f, { webgpu: gpu });
      out.push({ case: basename(f), runtime: `chromium ${r.backend}`, err: r.err, msPerStep: r.msPerStep,
        ...(gpu ? { adapter: r.probe.adapter ?? r.probe.off } : {}) });
    }
    await b.close();
    await site.close();
  }
  return out.map(({ deltaNames, expectedNames, ...rest }) => rest);
}

/**
 * Watches a browser's page renderer: VmRSS every 20 ms (each phase's end and largest reading) and
 * VmHWM (the peak of the whole run).
 * Chromium resets a renderer's VmHWM now and then (one fell from 183 to 161 MiB within 3 s while
 * its page waited), so one read at the end can miss the run's peak: the peak is the largest value read.
 */
function watchRenderer(browser) {
  const phases = [];
  let current = null;
  let peak = 0;
  let gpuPeak = 0;
  const largest = (type) => rendererMemory(browser, type).reduce((a, m) => (m.rss > a.rss ? m : a), { rss: 0, peak: 0, pid: 0 });
  const sample = () => {
    if (current === null) return;
    const page = largest("renderer");
    const gpu = largest("gpu-process");
    current.rss = page.rss;
    current.maxRss = Math.max(current.maxRss, page.rss);
    current.gpuRss = gpu.rss;
    current.gpuMaxRss = Math.max(current.gpuMaxRss, gpu.rss);
    peak = Math.max(peak, page.peak, page.rss);
    gpuPeak = Math.max(gpuPeak, gpu.peak, gpu.rss);
    current.pid = page.pid;
  };
  const timer = setInterval(sample, 20);
  return {
    /** Close the current phase (its last reading is its end RSS) and open `name`. */
    phase(name) {
      sample();
      current = { name, rss: 0, maxRss: 0, gpuRss: 0, gpuMaxRss: 0, pid: 0 };
      phases.push(current);
      sample();
    },
    stop() {
      sample();
      clearInterval(timer);
      const pss = current?.pid ? kib(readFileSync(`/proc/${current.pid}/smaps_rollup`, "utf8"), "Pss") : 0;
      return { phases: phases.map(({ pid, ...p }) => p), peak, gpuPeak, pss };
    },
  };
}

/**
 * One warm-up round of `warm` steps (sessions, arenas; in WebAssembly also the code tiers: V8 first
 * runs baseline code and compiles hot functions optimised in the background), then `steps` timed
 * steps (the whole train_tail call / steps). The first round's time per step is reported beside.
 */
async function stepNode(folder, kind, steps, warm, threads) {
  const c = loadCase(folder);
  const runtime = await loadRuntime(kind, threads);
  const s = c.summary;
  const acts = await multiStepForward(runtime, c.chunks, c.data.x, s.train.batch_size, threads);
  const tail = new OrtTail(runtime, parseTrainGraph(c.graph), threads);
  const cfg = { localSteps: steps, batchSize: s.train.batch_size, lr: s.train.lr, momentum: 0.9, weightDecay: 1e-4, seed: 1,
    evalSamples: s.train.batch_size, proxMu: 0, threads };
  const before = rss();
  let t0 = performance.now();
  await trainTail(tail, c.state, acts, c.data.y, { ...cfg, localSteps: warm });
  const firstMs = (performance.now() - t0) / warm;
  t0 = performance.now();
  await trainTail(tail, c.state, acts, c.data.y, cfg, samplePlan(acts.shape[0], cfg));
  const ms = (performance.now() - t0) / steps;
  return { runtime: `onnxruntime-${kind}`, threads, msPerStep: ms, firstRoundMsPerStep: firstMs, beforeTrainRss: before.rss,
    peakRss: rss().peak, rss: rss().rss };
}

/**
 * The tab's step time and memory per phase (renderer, and the GPU process). `webgpu`: the tail on
 * the WebGPU backend's GPU runtime (the frozen chunks on WebAssembly, as the backend's device runs
 * them); the "runtime" phase is then the backend's probe (ONNX Runtime's WebGPU device and a first
 * WebGPU session) instead of a tiny WebAssembly session.
 */
async function stepBrowser(folder, steps, warm, threads, webgpu = false) {
  const site = await servePage({ cases: dirname(folder) });
  const { browser, page } = await openPage(site.url, { webgpu });
  const watch = watchRenderer(browser);
  await page.exposeFunction("benchPhase", (name) => watch.phase(name));
  watch.phase("page");
  const r = await page.evaluate(async (base, steps, warm, threads, warmUp, webgpu) => {
    const sdk = window.sdk;
    const bytes = async (n) => new Uint8Array(await (await fetch(`${base}/${n}`)).arrayBuffer());
    const s = JSON.parse(new TextDecoder().decode(await bytes("expected.json")));
    const chunks = [];
    for (let i = 0; i < s.chunks; i++) chunks.push(await bytes(`chunk-${i}.onnx`));
    const data = sdk.decodeTensors(await bytes("data.bin"));
    const state = sdk.decodeTensors(await bytes("state.bin"));
    const graph = sdk.parseTrainGraph(await bytes("graph.bin"));
    await window.benchPhase("runtime");
    const runtime = sdk.makeRuntime("onnxruntime-web", window.ort, threads);
    const backend = webgpu ? new sdk.WebGpuBackend(runtime, threads) : null;
    const probe = backend === null ? null : await backend.probe();
    if (backend !== null && probe.off) throw new Error(`no WebGPU: ${probe.off}`);
    if (backend === null) {
      const tiny = await sdk.openSession(runtime, Uint8Array.from(atob(warmUp), (ch) => ch.charCodeAt(0)), threads);
      await tiny.run({ x: new window.ort.Tensor("float32", new Float32Array(32 * 64), [32, 64]) });
      await tiny.release();
    }
    await window.benchPhase("forward");
    const acts = await sdk.multiStepForward(runtime, chunks, data.x, s.train.batch_size, threads);
    await window.benchPhase("first round");
    const tail = new sdk.OrtTail(backend?.gpu ?? runtime, graph, threads);
    const cfg = { localSteps: steps, batchSize: s.train.batch_size, lr: s.train.lr, momentum: 0.9, weightDecay: 1e-4, seed: 1,
      evalSamples: s.train.batch_size, proxMu: 0, threads };
    let t0 = performance.now();
    await sdk.trainTail(tail, state, acts, data.y, { ...cfg, localSteps: warm });
    const firstMs = (performance.now() - t0) / warm;
    await window.benchPhase("timed round");
    t0 = performance.now();
    await sdk.trainTail(tail, state, acts, data.y, cfg);
    return { ms: (performance.now() - t0) / steps, firstMs, isolated: window.crossOriginIsolated, adapter: probe?.adapter ?? null };
  }, `/cases/${basename(folder)}`, steps, warm, threads, WARM_UP, webgpu);
  const mem = watch.stop();
  await browser.close();
  await site.close();
  const at = Object.fromEntries(mem.phases.map((p) => [p.name, p]));
  return { runtime: `chromium onnxruntime-${webgpu ? "webgpu" : "web"}`, threads, isolated: r.isolated, msPerStep: r.ms,
    firstRoundMsPerStep: r.firstMs, peakRss: mem.peak, rss: at["timed round"].rss, pss: mem.pss, idleRendererRss: at["page"].rss,
    gpuProcessPeak: mem.gpuPeak, gpuProcessIdle: at["page"].gpuRss, phases: mem.phases, ...(webgpu ? { adapter: r.adapter } : {}) };
}

/** A process (or a tab's renderer) after loading ONNX Runtime and running one tiny session. */
async function runtimeMemory(kind) {
  const model = Uint8Array.from(Buffer.from(WARM_UP, "base64"));
  if (kind !== "browser" && kind !== "webgpu") {
    const bare = rss();
    const runtime = await loadRuntime(kind);
    const session = await runtime.ort.InferenceSession.create(model, { executionProviders: runtime.executionProviders });
    await session.run({ x: new runtime.ort.Tensor("float32", new Float32Array(32 * 64), [32, 64]) });
    await session.release();
    return { runtime: `onnxruntime-${kind}`, bareRss: bare.rss, rss: rss().rss, peakRss: rss().peak };
  }
  const webgpu = kind === "webgpu";
  const site = await servePage();
  const { browser, page } = await openPage(site.url, { webgpu });
  const watch = watchRenderer(browser);
  watch.phase("page");
  await new Promise((r) => setTimeout(r, 200));
  watch.phase("runtime");
  const probe = await page.evaluate(async (b64, webgpu) => {
    const runtime = window.sdk.makeRuntime("onnxruntime-web", window.ort, 1);
    if (webgpu) return new window.sdk.WebGpuBackend(runtime, 1).probe(); // a first WebGPU session, kept open
    const bytes = Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
    const session = await window.ort.InferenceSession.create(bytes, { executionProviders: runtime.executionProviders });
    await session.run({ x: new window.ort.Tensor("float32", new Float32Array(32 * 64), [32, 64]) });
    await session.release();
    return null;
  }, WARM_UP, webgpu);
  await new Promise((r) => setTimeout(r, 200));
  const mem = watch.stop();
  await browser.close();
  await site.close();
  if (probe?.off) throw new Error(`no WebGPU: ${probe.off}`);
  const [idle, loaded] = mem.phases;
  return { runtime: `onnxruntime-${webgpu ? "webgpu" : "web"} (chromium renderer)`, rss: loaded.rss, peakRss: mem.peak, pss: mem.pss,
    idleRendererRss: idle.rss, gpuProcessRss: loaded.gpuRss, gpuProcessIdleRss: idle.gpuRss, gpuProcessPeak: mem.gpuPeak,
    ...(webgpu ? { adapter: probe.adapter } : {}) };
}

/**
 * ONNX Runtime's per-kernel profile of the training graph in a tab: WARM untimed runs (sessions,
 * the optimised code tier), then RUNS profiled ones; milliseconds per run by operator type.
 */
async function profileBrowser(folder, runs, warm) {
  const site = await servePage({ cases: dirname(folder) });
  const { browser, page } = await openPage(site.url);
  const lines = [];
  page.on("console", (msg) => lines.push(msg.text()));
  await page.evaluate(async (base, runs, warm) => {
    const { sdk, ort } = window;
    const bytes = async (n) => new Uint8Array(await (await fetch(`${base}/${n}`)).arrayBuffer());
    const s = JSON.parse(new TextDecoder().decode(await bytes("expected.json")));
    const runtime = sdk.makeRuntime("onnxruntime-web", ort, 1);
    const chunks = [];
    for (let i = 0; i < s.chunks; i++) chunks.push(await bytes(`chunk-${i}.onnx`));
    const data = sdk.decodeTensors(await bytes("data.bin"));
    const state = sdk.decodeTensors(await bytes("state.bin"));
    const graph = sdk.parseTrainGraph(await bytes("graph.bin"));
    const rows = Int32Array.from({ length: s.train.batch_size }, (_, i) => i);
    const x = sdk.takeRows(await sdk.multiStepForward(runtime, chunks, data.x, s.train.batch_size), rows);
    const feeds = { input: new ort.Tensor("float32", x.data, x.shape), target: new ort.Tensor("int64", data.y.data.subarray(0, rows.length), [rows.length]) };
    for (const n of [...graph.params, ...graph.buffers]) feeds[n] = new ort.Tensor("float32", state[n].data, state[n].shape);
    for (const profiled of [false, true]) {
      const session = await ort.InferenceSession.create(graph.trainOnnx, { executionProviders: ["wasm"], intraOpNumThreads: 1,
        interOpNumThreads: 1, executionMode: "sequential", enableMemPattern: false, logSeverityLevel: 3, enableProfiling: profiled });
      for (let i = 0; i < (profiled ? runs : warm); i++) await session.run(feeds);
      if (profiled) session.endProfiling();
      await session.release();
    }
  }, `/cases/${basename(folder)}`, runs, warm);
  await browser.close();
  await site.close();
  const events = lines.flatMap((l) => l.split("\n")).map((l) => l.trim().replace(/,$/, ""))
    .filter((l) => l.startsWith("{") && l.includes('"cat" : "Node"')).map((l) => JSON.parse(l))
    .filter((e) => e.name.endsWith("_kernel_time"));
  // Each node's median over the runs (a shared machine preempts some kernel runs), summed by operator type.
  const byNode = new Map();
  for (const e of events) {
    if (!byNode.has(e.name)) byNode.set(e.name, { op: e.args.op_name, us: [] });
    byNode.get(e.name).us.push(e.dur);
  }
  const ms = {};
  for (const { op, us } of byNode.values()) {
    us.sort((a, b) => a - b);
    ms[op] = (ms[op] ?? 0) + us[Math.floor(us.length / 2)] / 1000;
  }
  return { runtime: "chromium onnxruntime-web", runs, warm, events: events.length, msPerOp: ms };
}

/**
 * Where ONNX Runtime Web places each node of a case's graphs (training graph, evaluation graph, the
 * frozen chunk) on the WebGPU backend's sessions, from its verbose log: per graph, the nodes on the
 * GPU, and each operator type on WebAssembly with why: it has no WebGPU kernel (for its types),
 * the backend keeps it off the GPU (`cpuOnlyNodes`), or ONNX Runtime placed it there itself (small
 * shape computations whose inputs are on the CPU).
 */
async function placements(folders) {
  const site = await servePage({ cases: dirname(folders[0]) });
  const { browser, page } = await openPage(site.url, { webgpu: true });
  const lines = [];
  page.on("console", (msg) => lines.push(...msg.text().split("\n")));
  const out = [];
  for (const folder of folders) {
    lines.length = 0;
    const graphs = await page.evaluate(async (base) => {
      const { sdk, ort } = window;
      const bytes = async (n) => new Uint8Array(await (await fetch(`${base}/${n}`)).arrayBuffer());
      const s = JSON.parse(new TextDecoder().decode(await bytes("expected.json")));
      const graph = sdk.parseTrainGraph(await bytes("graph.bin"));
      const models = [["train", graph.trainOnnx], ["eval", graph.evalOnnx]];
      for (let i = 0; i < s.chunks; i++) models.push([`chunk ${i}`, await bytes(`chunk-${i}.onnx`)]);
      const backend = new sdk.WebGpuBackend(sdk.makeRuntime("onnxruntime-web", ort, 1), 1);
      const probe = await backend.probe();
      if (probe.off) throw new Error(`no WebGPU: ${probe.off}`);
      ort.env.logLevel = "verbose";
      for (const [name, model] of models) {
        console.log(["edgetrain-graph", name, sdk.cpuOnlyNodes(model).join(",")].join("\t"));
        const session = await backend.gpu.ort.InferenceSession.create(model, { executionProviders: backend.gpu.executionProviders,
          logSeverityLevel: 0, logVerbosityLevel: 0 });
        await session.release();
      }
      ort.env.logLevel = "warning";
      return models.map(([name]) => name);
    }, `/cases/${basename(folder)}`);
    out.push({ case: basename(folder), graphs: parsePlacements(lines, graphs) });
  }
  await browser.close();
  await site.close();
  return out;
}

/** The verbose log of session creations (test `placements`) as { graph: { gpu: n, cpu: { op: { nodes, why } } } }. */
function parsePlacements(lines, graphs) {
  const result = {};
  let graph = null, forced = new Set(), noKernel = new Set(), provider = null;
  for (const line of lines) {
    const marker = line.split("\t");
    if (marker[0] === "edgetrain-graph" && graphs.includes(marker[1])) {
      graph = { gpu: 0, cpu: {} };
      result[marker[1]] = graph;
      forced = new Set((marker[2] ?? "").split(",").filter(Boolean));
      noKernel = new Set();
      continue;
    }
    if (graph === null) continue;
    const missing = /webgpu kernel not found in registries for Op type: (\S+) node name: (\S*)/.exec(line);
    if (missing) noKernel.add(missing[2]);
    // The placement list: one log entry per line, "<prefix> VerifyEachNodeIsAssignedToAnEp] <text>".
    const [, text] = /VerifyEachNodeIsAssignedToAnEp\] (.*)$/.exec(line) ?? [];
    if (text === undefined) continue;
    const placed = /(?:All nodes|Node\(s\)) placed on \[(\w+)\]\. Number of nodes: (\d+)/.exec(text);
    if (placed) {
      provider = placed[1];
      if (provider === "WebGpuExecutionProvider") graph.gpu += Number(placed[2]);
      continue;
    }
    const node = /^ {2}(\S+) \((.*)\)$/.exec(text);
    if (node && provider === "CPUExecutionProvider") {
      const why = forced.has(node[2]) ? "kept off the GPU by the backend (cpuOnlyNodes)"
        : noKernel.has(node[2]) ? "no WebGPU kernel for it (or its types)" : "placed on the CPU by ONNX Runtime (a shape computation)";
      const entry = (graph.cpu[node[1]] ??= { nodes: 0, why: {} });
      entry.nodes += 1;
      entry.why[why] = (entry.why[why] ?? 0) + 1;
    }
  }
  return result;
}

let result;
if (mode === "conformance") {
  result = await conformance(args.filter((a) => !a.startsWith("--")), args.includes("--browser"), args.includes("--webgpu"));
} else if (mode === "step") {
  const [folder, kind, steps, warm = "15", threads = "1"] = args;
  result = ["browser", "webgpu"].includes(kind) ? await stepBrowser(folder, Number(steps), Number(warm), Number(threads), kind === "webgpu")
    : await stepNode(folder, kind, Number(steps), Number(warm), Number(threads));
}
else if (mode === "placements") result = await placements(args);
else if (mode === "runtime") result = await runtimeMemory(args[0]);
else if (mode === "profile") result = await profileBrowser(args[0], Number(args[1]), Number(args[2]));
else throw new Error(`unknown mode ${mode}`);
console.log(JSON.stringify(result));
process.exit(0);
