// One fleet run for bench/js_devices.py's accuracy part, one JSON object on stdout:
//
//   node bench/fleet-accuracy.mjs python|mixed SEED ROUNDS [--no-browser]
//
// digits_mlp on six devices, each with partition client i of 6 (the same shards in both fleets),
// against one orchestrator started with --seed SEED: `python` is six Python devices; `mixed` is
// two Python devices, a moderate and a weak onnxruntime-node device and two headless Chromium tabs
// on onnxruntime-web (one of them weak; without chromium, or with --no-browser, onnxruntime-web
// devices under Node). The final accuracy and each device's runtime and split come from the journal.
import { CHROMIUM } from "../test/browser.mjs";
import { join } from "node:path";
import { python } from "../test/cases.mjs";
import { browserDevice, freePort, journal, nodeDevice, pythonDevice, start, tempDir, writeShards } from "../test/fleet.mjs";

const [kind, seed, rounds, ...flags] = process.argv.slice(2);
const N = 6;
const tabs = CHROMIUM !== undefined && !flags.includes("--no-browser");
const dir = tempDir(`edgetrain-accuracy-${kind}-`);
const shards = writeShards(dir, [2, 3, 4, 5], N);
// The devices start first and retry until the server listens: on a loaded machine they take longer to
// start than the server waits for --min-devices.
const port = await freePort();
const url = `ws://127.0.0.1:${port}`;
const procs = [pythonDevice(dir, url, "py-0", "2GiB", 0, N), pythonDevice(dir, url, "py-1", "2GiB", 1, N)];
const pages = [];
if (kind === "python") {
  for (let c = 2; c < N; c++) procs.push(pythonDevice(dir, url, `py-${c}`, "2GiB", c, N));
} else {
  procs.push(nodeDevice(dir, url, "node-2", "400MiB", shards[2], "node"), nodeDevice(dir, url, "node-3", "185MiB", shards[3], "node"));
  if (tabs) {
    pages.push(await browserDevice(dir, url, "tab-4", shards[4], 400), await browserDevice(dir, url, "tab-5", shards[5], 330));
  } else {
    procs.push(nodeDevice(dir, url, "web-4", "400MiB", shards[4], "web"), nodeDevice(dir, url, "web-5", "330MiB", shards[5], "web"));
  }
}
await new Promise((resolve) => setTimeout(resolve, 20_000));
const server = start(dir, "server", python(), ["-m", "orchestrator.cli", "serve", "--host", "127.0.0.1", "--port", String(port),
  "--store", join(dir, "store"), "--model", "digits_mlp", "--rounds", rounds, "--min-devices", String(N), "--local-steps", "10",
  "--deadline", "300", "--seed", seed]);
const started = performance.now();
try {
  await Promise.all(pages.map((p) => p.done));
  await Promise.all(procs.map((p) => p.done));
  await server.done;
} finally {
  for (const p of [server, ...procs]) if (p.exitCode === null) p.kill();
  for (const p of pages) await p.close();
}
const j = journal(dir);
console.log(JSON.stringify({
  kind, seed: Number(seed), rounds: Number(rounds), wall_s: Math.round((performance.now() - started) / 1000), logs: dir,
  accuracy: j.rounds.map((r) => r.metrics.accuracy ?? null), finished: j.rounds.filter((r) => r.finished).length,
  devices: Object.fromEntries(Object.entries(j.devices).map(([id, d]) => [id, { runtime: d.backend, role: d.role, split: d.split }])),
}));
