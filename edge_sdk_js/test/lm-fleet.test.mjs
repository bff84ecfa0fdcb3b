// The language model end to end (slow tier): `edgetrain serve` trains the test-sized transformer with LoRA
// adapters (char_transformer_tiny@rank=4) on a mixed fleet, each device on its own UTF-8 text (a speaking
// role of Tiny Shakespeare): a Python device on torch training the whole model, a Python device without torch
// and a Chromium tab (onnxruntime-web) each at the least budget that trains, planned through their
// adapters, and a Node device training the whole model from its graph. Every round's report of every
// device is accepted (the adapters' holding only the adapters), the Python and Node devices run under a
// hard memory cap of their budget (test/capped.py: cgroup memory controller) and the tab's renderer peak
// stays under its budget. Skipped with one line without a cgroup controller, Chromium or the dataset.
import assert from "node:assert/strict";
import { execFile, execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";
import { CHROMIUM, openPage, rendererMemory, servePage } from "./browser.mjs";
import { HERE, REPO, python, pythonEnv } from "./cases.mjs";
import { journal, startServer, tempDir } from "./fleet.mjs";
import { NO_CAP, tracePage, tracePhases } from "./budgets.mjs";

const MODEL = "char_transformer_tiny@rank=4";
const ROUNDS = 2;
const MiB = 2 ** 20;
const DATA = process.env.EDGETRAIN_DATA ?? resolve(REPO, "..", "shared", "datasets");

/** A device command under a hard cap of its budget; resolves test/capped.py's result, or `{ skipped }`. */
async function capped(budgetMiB, argv) {
  try {
    const { stdout } = await promisify(execFile)(python(), [join(HERE, "capped.py"), String(budgetMiB * MiB), "--", ...argv],
      { env: pythonEnv(), maxBuffer: 64 * MiB });
    return JSON.parse(stdout.trim().split("\n").at(-1));
  } catch (exc) {
    if (exc.code === NO_CAP) return { skipped: exc.stdout.trim() };
    throw exc;
  }
}

/**
 * A process's resident bytes by kind of mapping (/proc/PID/smaps): `code` anonymous executable (V8's compiled
 * WebAssembly), `anon` other anonymous memory (`big`: of it, mappings over 8 MiB resident), `file` file-backed.
 * A tab's growth outside its JavaScript heap and WebAssembly memory shows in `anon` (the compilation memory
 * of profiles/runtime.py, WEB_ATTENTION_COMPILE_BYTES).
 */
function smapsSummary(pid) {
  const out = { code: 0, anon: 0, file: 0, big: 0 };
  let kind = "file";
  try {
    for (const line of readFileSync(`/proc/${pid}/smaps`, "utf8").split("\n")) {
      const m = /^[0-9a-f]+-[0-9a-f]+ (\S+) \S+ \S+ (\d+)\s*(.*)$/.exec(line);
      if (m) {
        const anon = m[2] === "0" || m[3].startsWith("[");
        kind = anon ? (m[1].includes("x") ? "code" : "anon") : "file";
        continue;
      }
      const r = /^Rss:\s+(\d+) kB/.exec(line);
      if (r) { out[kind] += Number(r[1]) * 1024; if (kind === "anon" && Number(r[1]) > 8192) out.big += Number(r[1]) * 1024; }
    }
  } catch { /* gone */ }
  return out;
}

/** The tab: its text read in the page (textData, as the device page reads a picked file), then DeviceClient. */
async function tab(dir, url, d) {
  const site = await servePage({ shards: dir });
  const { browser, page } = await openPage(site.url);
  // LM_FLEET_TRACE=1: where the renderer's memory goes, phase by phase (test/budgets.mjs, tracePage, with its
  // mappings and V8's heap and array buffers from the DevTools protocol), printed; at the end, after a full collection.
  const tracer = process.env.LM_FLEET_TRACE ? await tracePage(browser) : null;
  const samples = [];
  const cdp = tracer ? await page.createCDPSession() : null;
  let sampling = tracer !== null;
  const done = page.evaluate(async (server, textUrl, budgetBytes) => {
    const { DeviceClient, makeRuntime, textData } = window.sdk;
    const data = textData(await (await fetch(textUrl)).text(), { context: 40 });
    window.events = [];
    const client = new DeviceClient({ server, deviceId: "tab-1", budgetBytes, runtime: makeRuntime("onnxruntime-web", window.ort, 1),
      webSocket: (u) => new WebSocket(u), data: { x: data.x, y: data.y }, onEvent: (kind, e) => window.events.push({ event: kind, ...e }) });
    return (await client.run()).length;
  }, url, "/shards/tab-1.txt", d.budget_mib * MiB).finally(() => { sampling = false; });
  const sampler = (async () => {
    while (sampling) {
      const s = await tracer.sample().catch(() => ({}));
      const pid = rendererMemory(browser).sort((a, b) => b.rss - a.rss)[0]?.pid;
      const h = await cdp.send("Runtime.getHeapUsage").catch(() => ({}));
      samples.push({ ...s, ...(pid ? smapsSummary(pid) : {}),
        jsTotal: h.totalSize ?? 0, backing: h.backingStorageSize ?? 0 });
      await new Promise((r) => setTimeout(r, 200));
    }
  })();
  const phases = async () => { sampling = false; await sampler; return tracePhases(samples.filter((s) => s.rss)); };
  return { done, browser, phases, close: async () => { sampling = false; await browser.close(); await site.close(); } };
}

test("a mixed fleet trains the transformer on its own texts, the tab through its adapters, each device under its budget",
  { timeout: 1_500_000, skip: (!CHROMIUM && "chromium is not installed") || (!existsSync(join(DATA, "tinyshakespeare")) && `no ${DATA}/tinyshakespeare`) },
  async (t) => {
    const dir = tempDir("edgetrain-lm-fleet-");
    const env = { ...pythonEnv(), EDGETRAIN_DATA: DATA };
    const fleet = JSON.parse(execFileSync(python(), [join(HERE, "lm_fleet.py"), "--out", dir, "--model", MODEL], { env, encoding: "utf8" }));
    const { server, url } = await startServer(dir, ["--model", MODEL, "--data", "tinyshakespeare", "--data-root", DATA,
      "--rounds", String(ROUNDS), "--min-devices", "4", "--local-steps", "5", "--lr", "0.1", "--deadline", "900",
      "--straggler-policy", "deadline"]); // every device every round: a slow first torch import is not a straggler
    const common = (id) => ["--id", id, "--budget", `${fleet[id].budget_mib}MiB`, "--data", fleet[id].text, "--json-events", "--once",
      "--reconnect-retries", "5"]; // a device whose server is gone gives up
    const page = await tab(dir, url, fleet["tab-1"]);
    let results;
    try {
      results = await Promise.all([
        capped(fleet["py-torch"].budget_mib, [python(), "-m", "edge_sdk", "--server", url, "--backend", "torch", ...common("py-torch")]),
        capped(fleet["py-ort"].budget_mib, [python(), "-m", "edge_sdk", "--server", url, "--backend", "onnxruntime", ...common("py-ort")]),
        capped(fleet["node-1"].budget_mib, [process.execPath, join(HERE, "..", "dist", "cli.js"), "--url", url, "--runtime", "node",
          ...common("node-1")]),
        page.done,
      ]);
      const tabPeak = Math.max(0, ...rendererMemory(page.browser).map((m) => m.peak));
      if (results.some((r) => r?.skipped)) { t.skip(results.find((r) => r?.skipped).skipped); return; }
      for (const [i, id] of ["py-torch", "py-ort", "node-1"].entries()) {
        console.log(`# ${id} (${fleet[id].runtime}) at ${fleet[id].budget_mib} MiB: ${JSON.stringify(results[i])}`);
      }
      console.log(`# tab-1 (onnxruntime-web, adapters) at ${fleet["tab-1"].budget_mib} MiB: renderer peak ${(tabPeak / MiB).toFixed(1)} MiB`);
      if (process.env.LM_FLEET_TRACE) {
        for (const row of await page.phases()) console.log(`# tab-1 trace ${JSON.stringify(row)}`);
        const [p] = (await page.browser.pages()).filter((q) => q.url().startsWith("http"));
        const cdp = await p.createCDPSession();
        await cdp.send("HeapProfiler.collectGarbage");
        await new Promise((r) => setTimeout(r, 2000));
        const r = rendererMemory(page.browser).sort((a, b) => b.rss - a.rss)[0];
        console.log(`# tab-1 after a full collection: rss ${(r.rss / MiB).toFixed(1)} ${JSON.stringify(smapsSummary(r.pid))}`);
      }
      assert.equal(await server.done, 0, `server exit (logs in ${dir})`);
      const j = journal(dir);
      for (const [id, d] of Object.entries(fleet)) {
        const mine = j.reports.filter((r) => r.device === id);
        assert.equal(mine.filter((r) => r.accepted === 1).length, ROUNDS, `${id}: ${JSON.stringify(mine)} (logs in ${dir})`);
        assert.equal(j.devices[id].adapters, d.adapters, `${id} planned ${JSON.stringify(j.devices[id])}`);
        assert.ok(mine.every((r) => r.selection === (d.adapters ? "adapters" : "tail")));
      }
      assert.equal(j.devices["tab-1"].backend, "onnxruntime-web");
      for (const [i, id] of ["py-torch", "py-ort", "node-1"].entries()) {
        const r = results[i];
        assert.ok(r.returncode === 0 && !r.oom_killed && r.cgroup_peak_bytes <= fleet[id].budget_mib * MiB,
          `${id}: ${JSON.stringify(r)} (logs in ${dir})`);
      }
      // The tab's plan charges what its renderer holds while V8 compiles the transformer's kernels
      // (profiles/runtime.py, WEB_ATTENTION_COMPILE_BYTES): its peak stays under its budget.
      assert.ok(tabPeak > 50 * MiB && tabPeak <= fleet["tab-1"].budget_mib * MiB,
        `tab renderer peak ${tabPeak / MiB} MiB`);
    } finally {
      if (server.exitCode === null) server.kill();
      await page.close();
    }
  });
