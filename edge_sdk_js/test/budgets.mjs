// Devices held to the budget they declare (docs/js-device.md, "Memory"): one device of a runtime
// against a real orchestrator for a few rounds, and the most memory it held. A Node device (or the
// Python device, for comparison) runs under a hard memory cap equal to its budget (test/capped.py:
// the cgroup memory controller, so going over is a kill, not a number); a tab runs in headless
// Chromium, its renderer's resident high-water mark read from /proc (test/browser.mjs). Used by
// test/budgets.test.mjs and bench/js_budgets.py.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";
import { CHROMIUM, rendererMemory } from "./browser.mjs";
import { HERE, python, pythonEnv } from "./cases.mjs";
import { browserDevice, enroll, journal, start, startServer, tempDir, writeShards } from "./fleet.mjs";

const MiB = 2 ** 20;
/** test/capped.py's exit status where this machine has no cgroup memory controller to cap with. */
export const NO_CAP = 77;
/** The dataset each model's devices train on (their shards, the server's evaluation data). */
export const DATA = { digits_mlp: "digits", mnist_cnn: "mnist" };
const CLIENTS = 4;
const CLIENT = 1;

/** A secure run's server options: two devices a round, each with its credential, their updates masked. */
const SECURE = ["--min-devices", "2", "--require-credentials", "--secure-aggregation", "--secure-clip", "20"];

async function server(dir, model, rounds, secure = false) {
  return startServer(dir, ["--model", model, "--data", DATA[model], "--rounds", String(rounds), "--min-devices", "1",
    "--local-steps", "10", "--deadline", "300", "--straggler-policy", "deadline", ...(secure ? SECURE : [])]);
}

/** What the journal says of the one device `id`: its role and split, rounds finished, reports accepted, its reported peak. */
function outcome(dir, id) {
  const j = journal(dir);
  const mine = j.reports.filter((r) => r.device === id);
  return { role: j.devices[id]?.role, split: j.devices[id]?.split, runtime: j.devices[id]?.backend,
    finished: j.rounds.filter((r) => r.finished).length, accepted: mine.filter((r) => r.accepted === 1).length,
    masked: j.rounds.map((r) => r.metrics?.secure?.masked ?? 0),
    reportedPeak: Math.max(0, ...mine.map((r) => r.peak_rss_bytes ?? 0)) };
}

/** The command of a device: `node` (dist/cli.js on onnxruntime-node) or `python` (python -m edge_sdk on
 * ONNX Runtime training graphs, as the Node device trains: torch alone takes more than a weak budget). */
function deviceArgv(kind, url, id, budgetMiB, model, dir) {
  if (kind === "python") {
    return [python(), "-m", "edge_sdk", "--server", url, "--id", id, "--budget", `${budgetMiB}MiB`, "--data", DATA[model],
      "--client", String(CLIENT), "--num-clients", String(CLIENTS), "--backend", "onnxruntime", "--json-events", "--once"];
  }
  const shard = writeShards(dir, [CLIENT], CLIENTS, DATA[model])[CLIENT];
  return [process.execPath, join(HERE, "..", "dist", "cli.js"), "--url", url, "--id", id, "--budget", `${budgetMiB}MiB`,
    "--data", shard, "--runtime", "node", "--json-events", "--once"];
}

/**
 * One device of `kind` (node, python) at `budgetMiB` under a hard cap of its budget for `rounds`
 * rounds of `model`. Resolves `{ skipped }` (why) where nothing can cap, else the journal's outcome
 * with `cap` (test/capped.py's result: exit status, OOM kill, cgroup and resident peaks). `secure`:
 * the rounds use secure aggregation, an uncapped Python device (on torch, 2 GiB) the capped one's
 * partner in every block's cohort, both with enrolled credentials.
 */
export async function cappedDevice(kind, model, budgetMiB, rounds, { secure = false } = {}) {
  const dir = tempDir(`edgetrain-budget-${kind}-`);
  const { server: srv, url } = await server(dir, model, rounds, secure);
  let partner;
  try {
    const argv = deviceArgv(kind, url, `${kind}-1`, budgetMiB, model, dir);
    if (secure) {
      argv.push("--secret-file", enroll(dir, `${kind}-1`));
      partner = start(dir, "py-0", python(), ["-m", "edge_sdk", "--server", url, "--id", "py-0", "--budget", "2GiB",
        "--data", DATA[model], "--client", "0", "--num-clients", String(CLIENTS), "--secret-file", enroll(dir, "py-0"),
        "--json-events", "--once"]);
    }
    let out;
    try {
      ({ stdout: out } = await promisify(execFile)(python(), [join(HERE, "capped.py"), String(budgetMiB * MiB), "--", ...argv],
        { env: { ...pythonEnv(), EDGETRAIN_PAYLOAD_CACHE: join(dir, "payloads") }, maxBuffer: 64 * MiB }));
    } catch (exc) {
      if (exc.code === NO_CAP) return { skipped: exc.stdout.trim() };
      throw exc;
    }
    const cap = JSON.parse(out.trim().split("\n").at(-1));
    await srv.done;
    return { kind, model, budget: budgetMiB * MiB, logs: dir, cap, peak: cap.rss_peak_bytes, ...outcome(dir, `${kind}-1`) };
  } finally {
    for (const p of [srv, partner]) if (p !== undefined && p.exitCode === null) p.kill();
  }
}

/**
 * Where a tab's memory goes, phase by phase (docs/js-device.md, "Memory"): hooks ONNX Runtime in the
 * page (its WebAssembly memory, caught as it is made, and every session's creation, runs and release)
 * before the first session. `sample()` reads the renderer's resident memory from /proc with what the
 * page is doing and holds: its WebAssembly memory (which never shrinks) and V8's JavaScript heap.
 */
export async function tracePage(browser) {
  const [page] = (await browser.pages()).filter((p) => p.url().startsWith("http"));
  await page.evaluate(() => {
    const Memory = WebAssembly.Memory;
    const trace = window.trace = { phase: "start", runs: 0, memories: [] };
    WebAssembly.Memory = function (d) { const m = new Memory(d); trace.memories.push(m); return m; };
    WebAssembly.Memory.prototype = Memory.prototype;
    const S = window.ort.InferenceSession;
    const create = S.create.bind(S);
    S.create = async (...args) => {
      trace.phase = "create";
      const s = await create(...args);
      const kind = s.outputNames.includes("loss") ? "train" : s.inputNames.length > 1 ? "eval" : "chunk";
      const run = s.run.bind(s), release = s.release.bind(s);
      s.run = async (...a) => { trace.phase = `${kind} run`; trace.runs++; return run(...a); };
      s.release = async () => { trace.phase = `${kind} released`; return release(); };
      trace.phase = `${kind} created`;
      return s;
    };
  });
  return {
    // The page sets window.events once it has fetched its shard: a first sample may come before that.
    async sample() {
      const seen = await page.evaluate(() => ({ phase: window.trace.phase, runs: window.trace.runs, rounds: (window.events ?? []).filter((e) => e.event === "round_done").length,
        wasm: window.trace.memories.reduce((a, m) => a + m.buffer.byteLength, 0), js: performance.memory?.usedJSHeapSize ?? 0 }));
      const r = rendererMemory(browser).sort((a, b) => b.rss - a.rss)[0] ?? { rss: 0, peak: 0 };
      const gpu = Math.max(0, ...rendererMemory(browser, "gpu-process").map((m) => m.rss));
      return { ...seen, rss: r.rss, peak: r.peak, gpu };
    },
  };
}

/** The largest of each reading per round and phase of a trace's samples, in MiB. */
export function tracePhases(samples) {
  const rows = new Map();
  for (const s of samples) {
    const key = `${s.rounds} ${s.phase}`;
    const row = rows.get(key) ?? { round: s.rounds, phase: s.phase, rss: 0, peak: 0, wasm: 0, js: 0, gpu: 0 };
    for (const k of ["rss", "peak", "wasm", "js", "gpu", "code", "anon", "file", "big", "jsTotal", "backing"].filter((k) => k in s)) row[k] = Math.max(row[k] ?? 0, Math.round(s[k] / MiB * 10) / 10);
    rows.set(key, row);
  }
  return [...rows.values()];
}

/** One headless Chromium tab (onnxruntime-web) at `budgetMiB` for `rounds` rounds; `peak`: its renderer's
 * VmHWM. `trace`: also where its memory went (`tracePage`), sampled every 200 ms, as `phases`, and the
 * highest VmHWM a sample saw counts in `peak`. `webgpu`: the tab trains on its GPU (onnxruntime-web's
 * WebGPU build; SwiftShader here), and `gpuPeak` is the GPU process's VmHWM, which holds the GPU's
 * buffers (reported beside the renderer's: a page cannot see or bound it). */
export async function tabDevice(model, budgetMiB, rounds, { trace = false, webgpu = false } = {}) {
  const dir = tempDir(`edgetrain-budget-${webgpu ? "gpu" : ""}tab-`);
  const { server: srv, url } = await server(dir, model, rounds);
  const shard = writeShards(dir, [CLIENT], CLIENTS, DATA[model])[CLIENT];
  const tab = await browserDevice(dir, url, "tab-1", shard, budgetMiB, { webgpu });
  const tracer = trace ? await tracePage(tab.browser) : null;
  const samples = [];
  let sampling = tracer !== null;
  const sampler = (async () => {
    while (sampling) {
      samples.push(await tracer.sample());
      await new Promise((r) => setTimeout(r, 200));
    }
  })();
  try {
    const { reports } = await tab.done;
    sampling = false;
    await sampler;
    // The renderer's high-water mark at the end, or a higher one a sample saw (one run's renderer read
    // 361.8 MiB in rounds 1-3 and 316.0 MiB at the end).
    const peak = Math.max(0, ...rendererMemory(tab.browser).map((m) => m.peak), ...samples.map((s) => s.peak));
    const gpuPeak = Math.max(0, ...rendererMemory(tab.browser, "gpu-process").map((m) => m.peak), ...samples.map((s) => s.gpu));
    await srv.done;
    return { kind: webgpu ? "gputab" : "tab", model, budget: budgetMiB * MiB, logs: dir, reports, peak, gpuPeak, ...outcome(dir, "tab-1"),
      ...(trace ? { phases: tracePhases(samples) } : {}) };
  } finally {
    sampling = false;
    await tab.close();
    if (srv.exitCode === null) srv.kill();
  }
}

/** A budgets test's run `r` (cappedDevice, tabDevice) kept its budget: planned `role`, each of its `rounds`
 * rounds finished and its report accepted, its peak a reading and under the budget. */
export function assertKept(r, role, rounds) {
  const where = `(logs in ${r.logs})`;
  assert.equal(r.role, role, `planned ${r.role}, expected ${role} ${where}`);
  assert.equal(r.finished, rounds, `${r.finished} of ${rounds} rounds finished ${where}`);
  assert.equal(r.accepted, rounds, `${r.accepted} of ${rounds} reports accepted ${where}`);
  assert.ok(r.peak > 50 * MiB, `a peak of ${r.peak} bytes is no reading ${where}`);
  assert.ok(r.peak <= r.budget, `peak ${(r.peak / MiB).toFixed(1)} MiB over the budget of ${r.budget / MiB} MiB ${where}`);
}

/** A tab on its GPU trains three rounds: SwiftShader's rounds take a minute each, and a peak that grew round
 * over round shows by the third as it does by the fifth (the CPU tabs and Node devices train five). */
export const GPU_ROUNDS = 3;

/**
 * The test of a tab training on its GPU (the WebGPU build; SwiftShader here) at `budget` MiB: planned `role`
 * on onnxruntime-webgpu, GPU_ROUNDS rounds each accepted, its renderer's peak under the budget, its GPU
 * process's (which a page can neither see nor bound) read and reported beside it.
 */
export function gpuTabTest(budget, role) {
  test(`a ${role} Chromium tab on its GPU at ${budget} MiB trains ${GPU_ROUNDS} rounds under its budget`, { timeout: 900_000 }, async (t) => {
    if (CHROMIUM === undefined) { t.skip("no Chromium: set CHROMIUM or install Debian's chromium"); return; }
    const r = await tabDevice("digits_mlp", budget, GPU_ROUNDS, { trace: true, webgpu: true });
    console.log(`# ${role} tab on the GPU at ${budget} MiB: split ${r.split}, renderer peak ${(r.peak / MiB).toFixed(1)} MiB, `
      + `GPU process peak ${(r.gpuPeak / MiB).toFixed(1)} MiB`);
    assert.equal(r.runtime, "onnxruntime-webgpu", "planned on the GPU's runtime");
    assert.ok(r.gpuPeak > 0, "the GPU process is read");
    assertKept(r, role, GPU_ROUNDS);
  });
}
