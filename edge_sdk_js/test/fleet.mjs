// A real orchestrator (`python -m edgetrain serve`) and devices as processes on 127.0.0.1,
// for the end-to-end tests and the benchmark.
import { execFileSync, spawn } from "node:child_process";
import { openSync, writeFileSync } from "node:fs";
import { createServer, connect } from "node:net";
import { join } from "node:path";
import { encodeTensors } from "../dist/index.js";
import { loadShard } from "../dist/shard.js";
import { CHROMIUM, openPage, rendererMemory, servePage } from "./browser.mjs";
import { HERE, REPO, python, pythonEnv } from "./cases.mjs";
import { tempDir } from "./tmp.mjs";

/** A test's folder in the system temp directory: removed when the test passes, kept (its path printed) when it fails. */
export { tempDir };

export function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
    server.on("error", reject);
  });
}

/** Start a child process with its output in `<dir>/<name>.log`; resolves its exit code via `.done`. A device
 * keeps its payloads (payload-cache "auto") under `<dir>/payloads`: each fleet's own, as a benchmark's runs need. */
export function start(dir, name, command, args, env = pythonEnv()) {
  const log = openSync(join(dir, `${name}.log`), "w");
  const child = spawn(command, args, { cwd: REPO, env: { ...env, EDGETRAIN_PAYLOAD_CACHE: join(dir, "payloads") },
    stdio: ["ignore", log, log] });
  child.done = new Promise((resolve) => child.on("exit", (code, signal) => resolve(code ?? signal)));
  return child;
}

export async function waitForPort(port, child, timeoutMs = 120_000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`the server exited with ${child.exitCode} before listening`);
    const ok = await new Promise((resolve) => {
      const socket = connect(port, "127.0.0.1", () => { socket.end(); resolve(true); });
      socket.on("error", () => resolve(false));
    });
    if (ok) return;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  throw new Error(`nothing listens on port ${port}`);
}

/** `edgetrain serve` on a free port; resolves once it listens. Its log (`<dir>/server.log`) is what tools read:
 * the events as JSON lines and every log line (`--json-events`), not the progress a person reads. */
export async function startServer(dir, args) {
  const port = await freePort();
  const server = start(dir, "server", python(), ["-m", "edgetrain", "serve", "--host", "127.0.0.1", "--port", String(port),
    "--store", join(dir, "store"), "--json-events", ...args]);
  await waitForPort(port, server);
  return { server, url: `ws://127.0.0.1:${port}` };
}

export function writeShards(dir, clients, numClients, data = "digits") {
  execFileSync(python(), [join(HERE, "shards.py"), "--data", data, "--num-clients", String(numClients), "--out", dir,
    ...clients.map(String)], { env: pythonEnv(), stdio: ["ignore", "ignore", "inherit"] });
  return Object.fromEntries(clients.map((c) => [c, join(dir, `${data}-${c}.npz`)]));
}

/** A Node device (dist/cli.js); `args` more options, `env` more environment (NODE_EXTRA_CA_CERTS for wss://). */
export function nodeDevice(dir, url, id, budget, shard, runtime, args = [], env = {}) {
  return start(dir, id, process.execPath, [join(HERE, "..", "dist", "cli.js"), "--url", url, "--id", id, "--budget", budget,
    "--data", shard, "--runtime", runtime, "--json-events", "--once", ...args], { ...process.env, ...env }); // one run, then exit
}

export function pythonDevice(dir, url, id, budget, client, numClients, args = []) {
  return start(dir, id, python(), ["-m", "edge_sdk", "--server", url, "--id", id, "--budget", budget, "--data", "digits",
    "--client", String(client), "--num-clients", String(numClients), "--json-events", "--once",
    "--reconnect-max-delay", "2", ...args]); // a device started before its server joins soon after it listens
}

/** Enroll device `id` in the store of `dir` (`edgetrain device enroll`): the path of its secret's file. */
export function enroll(dir, id) {
  const out = join(dir, `${id}.secret`);
  execFileSync(python(), ["-m", "edgetrain", "device", "enroll", "--store", join(dir, "store"), "--id", id, "--out", out],
    { env: pythonEnv(), stdio: ["ignore", "ignore", "inherit"] });
  return out;
}

export function journal(dir) {
  return JSON.parse(execFileSync(python(), [join(HERE, "journal.py"), join(dir, "store")], { env: pythonEnv() }).toString());
}

/**
 * A device in a headless Chromium tab: the page fetches its shard and trains on onnxruntime-web;
 * `webgpu`: its tail on the browser's GPU (the WebGPU backend; SwiftShader's adapter here). `secret`: its
 * enrolled credential (each hello carries a proof of it), as the device page takes it from its fragment.
 */
export async function browserDevice(dir, url, id, shard, budgetMiB, { webgpu = false, secret } = {}) {
  const data = loadShard(shard);
  writeFileSync(join(dir, `${id}.bin`), encodeTensors({ x: data.x, y: data.y }));
  const site = await servePage({ shards: dir });
  const { browser, page } = await openPage(site.url, { webgpu });
  const done = page.evaluate(async (server, shardUrl, deviceId, budgetBytes, webgpu, secret) => {
    const { DeviceClient, decodeTensors, makeBackend, makeRuntime } = window.sdk;
    const t = decodeTensors(new Uint8Array(await (await fetch(shardUrl)).arrayBuffer()));
    window.events = [];
    const runtime = makeRuntime("onnxruntime-web", window.ort, 2);
    const backend = webgpu ? makeBackend("onnxruntime-webgpu", runtime, 2) : undefined;
    const probe = await backend?.probe();
    const client = new DeviceClient({ server, deviceId, budgetBytes, runtime, backend, ...(secret ? { secret } : {}),
      webSocket: (u) => new WebSocket(u), data: { x: t.x, y: t.y }, onEvent: (kind, d) => window.events.push({ event: kind, ...d }) });
    const reports = await client.run();
    return { reports: reports.length, events: window.events, probe };
  }, url, `/shards/${id}.bin`, id, budgetMiB * 2 ** 20, webgpu, secret ?? "");
  return { id, done, browser, close: async () => { await browser.close(); await site.close(); } };
}

/**
 * The accuracy workload (bench/js_devices.py --parts accuracy, the mixed-fleet test): digits_mlp on
 * six devices, device i training partition client i of 6 (the same shards in every fleet), 10 local
 * steps a round, one orchestrator started with --seed SEED.
 */
export const WORKLOAD = { model: "digits_mlp", devices: 6, localSteps: 10 };

/**
 * Start the devices of one fleet of the workload into `fleet` (its processes and pages, so that the
 * caller stops whatever started). `python`: six Python devices (torch, strong). `mixed`: two Python
 * devices, an onnxruntime-node device at 400 MiB (strong) and one at 185 MiB (weak), and two
 * onnxruntime-web devices: headless Chromium tabs when `tabs` (the first, at 710 MiB, on the GPU:
 * WebGPU, moderate; the second, at 400 MiB, on WebAssembly, weak), else under Node (400 MiB, 400 MiB).
 */
async function startFleet(kind, dir, url, tabs, { procs, pages }, { deviceArgs = [], gpuTab = true } = {}) {
  const N = WORKLOAD.devices;
  const py = (c) => pythonDevice(dir, url, `py-${c}`, "2GiB", c, N, deviceArgs);
  procs.push(py(0), py(1));
  if (kind === "python") {
    for (let c = 2; c < N; c++) procs.push(py(c));
    return;
  }
  const shards = writeShards(dir, [2, 3, 4, 5], N);
  procs.push(nodeDevice(dir, url, "node-2", "400MiB", shards[2], "node", deviceArgs),
    nodeDevice(dir, url, "node-3", "185MiB", shards[3], "node", deviceArgs));
  if (tabs) {
    pages.push(await browserDevice(dir, url, "tab-4", shards[4], 710, { webgpu: gpuTab }));
    pages.push(await browserDevice(dir, url, "tab-5", shards[5], 400));
  } else {
    procs.push(nodeDevice(dir, url, "web-4", "400MiB", shards[4], "web"), nodeDevice(dir, url, "web-5", "400MiB", shards[5], "web"));
  }
}

/**
 * Run one fleet of the workload for `rounds` rounds; resolves what the journal says (final
 * accuracy per round, each device's runtime, role and split) and what `during({ url, site, dir })`
 * resolved: a check run while the fleet trains (`web` serves the status page at `site`), and each tab's run (`tabs`: its
 * reports and events, its renderer's and GPU process's resident peaks). `serveArgs`
 * and `deviceArgs` are more options of the server and of the Python and Node devices (the tabs take
 * none: a page's settings are the SDK's defaults); `gpuTab` false: the first tab trains on WebAssembly too.
 */
export async function runFleet({ kind, seed, rounds, tabs = CHROMIUM !== undefined, web = false, during, serveArgs = [],
  deviceArgs = [], gpuTab = true }) {
  const dir = tempDir(`edgetrain-accuracy-${kind}-`);
  const port = await freePort();
  const url = `ws://127.0.0.1:${port}`;
  // The server and the devices start together: the devices retry until it listens, and it waits
  // for all of them (--min-devices) before the first round. Every round waits for every device's
  // update (straggler policy deadline): on a loaded machine the straggler grace would otherwise
  // leave the slowest device's update out of some rounds, and the fleets would not be comparable.
  const server = start(dir, "server", python(), ["-m", "edgetrain", "serve", "--host", "127.0.0.1", "--port", String(port),
    "--store", join(dir, "store"), "--model", WORKLOAD.model, "--rounds", String(rounds), "--min-devices", String(WORKLOAD.devices),
    "--local-steps", String(WORKLOAD.localSteps), "--deadline", "300", "--straggler-policy", "deadline", "--seed", String(seed),
    "--json-events", ...(web ? ["--web"] : []), ...serveArgs]);
  const started = performance.now();
  const fleet = { procs: [], pages: [] };
  let seen;
  let tabRuns = {};
  try {
    await startFleet(kind, dir, url, tabs, fleet, { deviceArgs, gpuTab });
    const watching = during && waitForPort(port, server).then(() => during({ url, site: `http://127.0.0.1:${port}`, dir }));
    let ran;
    [seen, ...ran] = await Promise.all([watching, ...fleet.pages.map((p) => p.done)]);
    // Each tab's run (its reports, its events) and, before it closes, its renderer's and GPU process's peaks.
    tabRuns = Object.fromEntries(fleet.pages.map((p, i) => [p.id, { ...ran[i],
      peak: Math.max(0, ...rendererMemory(p.browser).map((m) => m.peak)),
      gpuPeak: Math.max(0, ...rendererMemory(p.browser, "gpu-process").map((m) => m.peak)) }]));
    const code = await server.done;
    if (code !== 0) throw new Error(`the server exited with ${code} (logs in ${dir})`);
    // Each device process ends within a minute of its server (a run's bye, or its connection gone): one that
    // does not (it reconnects to a server that is gone) fails the test by name instead of holding it open.
    const codes = await Promise.all(fleet.procs.map((p) => Promise.race([p.done,
      new Promise((resolve) => { const t = setTimeout(resolve, 60_000, "still running a minute after its server"); t.unref(); })])));
    if (codes.some((c) => c !== 0)) throw new Error(`device exit codes ${codes} (logs in ${dir})`);
  } finally {
    for (const p of [server, ...fleet.procs]) if (p.exitCode === null) p.kill();
    for (const p of fleet.pages) await p.close();
  }
  const j = journal(dir);
  return {
    kind, seed, rounds, wall_s: Math.round((performance.now() - started) / 1000), logs: dir, journal: j, seen, tabs: tabRuns,
    accuracy: j.rounds.map((r) => r.metrics.accuracy ?? null), finished: j.rounds.filter((r) => r.finished).length,
    devices: Object.fromEntries(Object.entries(j.devices).map(([id, d]) => [id, { runtime: d.backend, role: d.role, split: d.split }])),
  };
}
