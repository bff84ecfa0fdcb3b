// A real orchestrator (`python -m orchestrator.cli serve`) and devices as processes on 127.0.0.1,
// for the end-to-end tests and the benchmark.
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, openSync, writeFileSync } from "node:fs";
import { createServer, connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { encodeTensors } from "../dist/index.js";
import { loadShard } from "../dist/shard.js";
import { openPage, servePage } from "./browser.mjs";
import { HERE, REPO, python, pythonEnv } from "./cases.mjs";

export function tempDir(prefix) {
  return mkdtempSync(join(tmpdir(), prefix));
}

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

/** Start a child process with its output in `<dir>/<name>.log`; resolves its exit code via `.done`. */
export function start(dir, name, command, args, env = pythonEnv()) {
  const log = openSync(join(dir, `${name}.log`), "w");
  const child = spawn(command, args, { cwd: REPO, env, stdio: ["ignore", log, log] });
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

/** `edgetrain serve` on a free port; resolves once it listens. */
export async function startServer(dir, args) {
  const port = await freePort();
  const server = start(dir, "server", python(), ["-m", "orchestrator.cli", "serve", "--host", "127.0.0.1", "--port", String(port),
    "--store", join(dir, "store"), ...args]);
  await waitForPort(port, server);
  return { server, url: `ws://127.0.0.1:${port}` };
}

export function writeShards(dir, clients, numClients, data = "digits") {
  execFileSync(python(), [join(HERE, "shards.py"), "--data", data, "--num-clients", String(numClients), "--out", dir,
    ...clients.map(String)], { env: pythonEnv(), stdio: ["ignore", "ignore", "inherit"] });
  return Object.fromEntries(clients.map((c) => [c, join(dir, `${data}-${c}.npz`)]));
}

export function nodeDevice(dir, url, id, budget, shard, runtime) {
  return start(dir, id, process.execPath, [join(HERE, "..", "dist", "cli.js"), "--url", url, "--id", id, "--budget", budget,
    "--data", shard, "--runtime", runtime, "--json-events"], process.env);
}

export function pythonDevice(dir, url, id, budget, client, numClients) {
  return start(dir, id, python(), ["-m", "edge_sdk", "--server", url, "--id", id, "--budget", budget, "--data", "digits",
    "--client", String(client), "--num-clients", String(numClients), "--json-events", "--once"]);
}

export function journal(dir) {
  return JSON.parse(execFileSync(python(), [join(HERE, "journal.py"), join(dir, "store")], { env: pythonEnv() }).toString());
}

/** A device in a headless Chromium tab: the page fetches its shard and trains on onnxruntime-web. */
export async function browserDevice(dir, url, id, shard, budgetMiB) {
  const data = loadShard(shard);
  writeFileSync(join(dir, `${id}.bin`), encodeTensors({ x: data.x, y: data.y }));
  const site = await servePage({ shards: dir });
  const { browser, page } = await openPage(site.url);
  const done = page.evaluate(async (server, shardUrl, deviceId, budgetBytes) => {
    const { DeviceClient, decodeTensors, makeRuntime } = window.sdk;
    const t = decodeTensors(new Uint8Array(await (await fetch(shardUrl)).arrayBuffer()));
    window.events = [];
    const client = new DeviceClient({ server, deviceId, budgetBytes, runtime: makeRuntime("onnxruntime-web", window.ort, 2),
      webSocket: (u) => new WebSocket(u), data: { x: t.x, y: t.y }, onEvent: (kind, d) => window.events.push({ event: kind, ...d }) });
    const reports = await client.run();
    return { reports: reports.length, events: window.events };
  }, url, `/shards/${id}.bin`, id, budgetMiB * 2 ** 20);
  return { done, close: async () => { await browser.close(); await site.close(); } };
}
