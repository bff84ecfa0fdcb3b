// Measurements of the JavaScript device for bench/js_devices.py, one JSON object on stdout.
//
//   node bench/run.mjs conformance <case folder>... [--browser]   every case in node, web (and a Chromium tab)
//   node bench/run.mjs step <case folder> node|web|browser STEPS   ms per local step and peak memory, fresh process
//   node bench/run.mjs runtime node|web|browser                    memory of a process (tab) with ONNX Runtime loaded
import { readFileSync } from "node:fs";
import { dirname, basename } from "node:path";
import { loadRuntime, makeRuntime, parseTrainGraph, OrtTail, multiStepForward, samplePlan, trainTail } from "../dist/index.js";
import { conformanceInPage, openPage, rendererMemory, servePage } from "../test/browser.mjs";
import { loadCase } from "../test/cases.mjs";
import { runConformance } from "../test/conformance-core.mjs";

// The 84-byte warm-up graph of edge_sdk.forward (Relu over a (batch, 64) float input).
const WARM_UP = "CAk6SgoMCgF4EgF5IgRSZWx1EgZ3YXJtdXBaGAoBeBITChEIARINCgcSBWJhdGNoCgIIQGIYCgF5EhMKEQgBEg0KBxIFYmF0Y2gKAghAQgQKABAS";

const [mode, ...args] = process.argv.slice(2);
/** VmRSS and VmHWM of this process (getrusage's maxRSS would carry the launching process's peak across exec). */
const rss = () => {
  const status = readFileSync("/proc/self/status", "utf8");
  const kb = (key) => Number(new RegExp(`${key}:\\s+(\\d+)`).exec(status)?.[1] ?? 0) * 1024;
  return { rss: kb("VmRSS"), peak: kb("VmHWM") };
};

async function conformance(folders, browser) {
  const out = [];
  for (const kind of ["node", "web"]) {
    const runtime = await loadRuntime(kind);
    for (const f of folders) out.push({ case: basename(f), runtime: `onnxruntime-${kind}`, ...(await runConformance(runtime, loadCase(f))) });
  }
  if (browser) {
    const site = await servePage({ cases: dirname(folders[0]) });
    const { browser: b, page } = await openPage(site.url);
    for (const f of folders) {
      const r = await conformanceInPage(page, f);
      out.push({ case: basename(f), runtime: "chromium onnxruntime-web", err: r.err, msPerStep: r.msPerStep });
    }
    await b.close();
    await site.close();
  }
  return out.map(({ deltaNames, expectedNames, ...rest }) => rest);
}

/** tau steps on the case's tail from its state; time per step (whole train_tail call / steps). */
async function stepNode(folder, kind, steps) {
  const c = loadCase(folder);
  const runtime = await loadRuntime(kind);
  const s = c.summary;
  const acts = await multiStepForward(runtime, c.chunks, c.data.x, s.train.batch_size);
  const tail = new OrtTail(runtime, parseTrainGraph(c.graph));
  const cfg = { localSteps: steps, batchSize: s.train.batch_size, lr: s.train.lr, momentum: 0.9, weightDecay: 1e-4, seed: 1,
    evalSamples: s.train.batch_size, proxMu: 0, threads: 1 };
  const before = rss();
  await trainTail(tail, c.state, acts, c.data.y, { ...cfg, localSteps: 2 }); // warm: sessions and arenas
  const t0 = performance.now();
  await trainTail(tail, c.state, acts, c.data.y, cfg, samplePlan(acts.shape[0], cfg));
  const ms = (performance.now() - t0) / steps;
  return { runtime: `onnxruntime-${kind}`, msPerStep: ms, beforeTrainRss: before.rss, peakRss: rss().peak };
}

async function stepBrowser(folder, steps) {
  const site = await servePage({ cases: dirname(folder) });
  const { browser, page } = await openPage(site.url);
  const idle = rendererMemory(browser);
  const ms = await page.evaluate(async (base, steps) => {
    const sdk = window.sdk;
    const bytes = async (n) => new Uint8Array(await (await fetch(`${base}/${n}`)).arrayBuffer());
    const s = JSON.parse(new TextDecoder().decode(await bytes("expected.json")));
    const runtime = sdk.makeRuntime("onnxruntime-web", window.ort, 1);
    const chunks = [];
    for (let i = 0; i < s.chunks; i++) chunks.push(await bytes(`chunk-${i}.onnx`));
    const data = sdk.decodeTensors(await bytes("data.bin"));
    const state = sdk.decodeTensors(await bytes("state.bin"));
    const acts = await sdk.multiStepForward(runtime, chunks, data.x, s.train.batch_size);
    const tail = new sdk.OrtTail(runtime, sdk.parseTrainGraph(await bytes("graph.bin")));
    const cfg = { localSteps: steps, batchSize: s.train.batch_size, lr: s.train.lr, momentum: 0.9, weightDecay: 1e-4, seed: 1,
      evalSamples: s.train.batch_size, proxMu: 0, threads: 1 };
    await sdk.trainTail(tail, state, acts, data.y, { ...cfg, localSteps: 2 });
    const t0 = performance.now();
    await sdk.trainTail(tail, state, acts, data.y, cfg);
    return (performance.now() - t0) / steps;
  }, `/cases/${basename(folder)}`, steps);
  const mem = rendererMemory(browser);
  await browser.close();
  await site.close();
  const worst = mem.reduce((a, m) => (m.peak > a.peak ? m : a), { peak: 0, rss: 0 });
  return { runtime: "chromium onnxruntime-web", msPerStep: ms, peakRss: worst.peak, rss: worst.rss, idleRendererRss: Math.max(0, ...idle.map((m) => m.rss)) };
}

/** A process (or a tab's renderer) after loading ONNX Runtime and running one tiny session. */
async function runtimeMemory(kind) {
  const model = Uint8Array.from(Buffer.from(WARM_UP, "base64"));
  if (kind !== "browser") {
    const bare = rss();
    const runtime = await loadRuntime(kind);
    const session = await runtime.ort.InferenceSession.create(model, { executionProviders: runtime.executionProviders });
    await session.run({ x: new runtime.ort.Tensor("float32", new Float32Array(32 * 64), [32, 64]) });
    await session.release();
    return { runtime: `onnxruntime-${kind}`, bareRss: bare.rss, rss: rss().rss, peakRss: rss().peak };
  }
  const site = await servePage();
  const { browser, page } = await openPage(site.url);
  await page.evaluate(async (b64) => {
    const bytes = Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
    const runtime = window.sdk.makeRuntime("onnxruntime-web", window.ort, 1);
    const session = await window.ort.InferenceSession.create(bytes, { executionProviders: runtime.executionProviders });
    await session.run({ x: new window.ort.Tensor("float32", new Float32Array(32 * 64), [32, 64]) });
    await session.release();
  }, WARM_UP);
  const mem = rendererMemory(browser);
  await browser.close();
  await site.close();
  return { runtime: "onnxruntime-web (chromium renderer)", rss: Math.max(0, ...mem.map((m) => m.rss)), peakRss: Math.max(0, ...mem.map((m) => m.peak)) };
}

let result;
if (mode === "conformance") result = await conformance(args.filter((a) => !a.startsWith("--")), args.includes("--browser"));
else if (mode === "step") result = args[1] === "browser" ? await stepBrowser(args[0], Number(args[2])) : await stepNode(args[0], args[1], Number(args[2]));
else if (mode === "runtime") result = await runtimeMemory(args[0]);
else throw new Error(`unknown mode ${mode}`);
console.log(JSON.stringify(result));
process.exit(0);
