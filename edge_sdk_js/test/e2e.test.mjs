// End to end: one real orchestrator on 127.0.0.1 with a Python device and three JavaScript
// devices (onnxruntime-node moderate and weak, onnxruntime-web under Node) trains several
// rounds; the journal shows each device's runtime and split, and every round completes. One Node
// device loses its connection inside an upload and inside a download, and resumes both; where
// chromium is installed, a headless Chromium tab is one more device.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import WebSocket from "ws";
import { DeviceClient, loadRuntime } from "../dist/index.js";
import { loadShard } from "../dist/shard.js";
import { CHROMIUM } from "./browser.mjs";
import { browserDevice, journal, nodeDevice, pythonDevice, startServer, tempDir, writeShards } from "./fleet.mjs";

const ROUNDS = 3;
const TAB = CHROMIUM !== undefined; // a browser tab joins the fleet where chromium is installed

/**
 * Websockets that drop: the first connection once it has sent `cuts[0].sent` bytes (inside the
 * first upload), the second once it has received `cuts[1].received` bytes (inside a chunk download).
 */
function droppingSockets(cuts) {
  let n = 0;
  return (url, maxPayload) => {
    const ws = new WebSocket(url, { maxPayload, perMessageDeflate: false });
    const cut = cuts[n++];
    if (cut === undefined) return ws;
    let sent = 0, received = 0;
    const send = ws.send.bind(ws);
    ws.send = (data) => {
      sent += data.byteLength;
      if (cut.sent !== undefined && sent > cut.sent) ws.terminate();
      else send(data);
    };
    ws.on("message", (data) => {
      received += data.byteLength;
      if (cut.received !== undefined && received > cut.received) ws.terminate();
    });
    return ws;
  };
}

test("a mixed fleet of Python, Node and WebAssembly devices trains every round", { timeout: 300_000 }, async () => {
  const dir = tempDir("edgetrain-js-e2e-");
  const clients = TAB ? 5 : 4;
  const shards = writeShards(dir, TAB ? [1, 2, 3, 4] : [1, 2, 3], clients);
  const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--rounds", String(ROUNDS), "--min-devices", String(clients),
    "--local-steps", "3", "--deadline", "90", "--chunk-codec", "none", "--tail-codec", "none", "--graph-codec", "none", "--download-delta", "none", "--update-codec", "none"]); // whole chunks and updates: the cuts below land mid-transfer
  const devices = [
    pythonDevice(dir, url, "py-0", "2GiB", 0, clients),
    nodeDevice(dir, url, "web-2", "400MiB", shards[2], "web"),
    nodeDevice(dir, url, "node-3", "185MiB", shards[3], "node"), // weak: the head only
  ];
  const tab = TAB ? await browserDevice(dir, url, "tab-4", shards[4], 400) : null;
  const events = [];
  const inProcess = new DeviceClient({
    server: url, deviceId: "node-1", budgetBytes: 200 * 2 ** 20, runtime: await loadRuntime("node"), data: loadShard(shards[1]),
    webSocket: droppingSockets([{ sent: 200_000 }, { received: 4_000_000 }]), frameSize: 64 << 10,
    onEvent: (kind, data) => events.push({ event: kind, ...data }),
  });
  try {
    const reports = await inProcess.run();
    assert.equal(reports.length, ROUNDS);
    assert.ok(events.some((e) => e.event === "upload_resumed"), "the cut upload resumed");
    assert.ok(events.some((e) => e.event === "download_resumed" && e.offset > 0), "the cut download resumed");
    if (tab !== null) {
      const { reports, events: tabEvents } = await tab.done;
      assert.equal(reports, ROUNDS);
      assert.equal(tabEvents.filter((e) => e.event === "round_done" && e.accepted).length, ROUNDS);
    }
    const codes = await Promise.all(devices.map((d) => d.done));
    assert.deepEqual(codes, [0, 0, 0], `device exit codes (logs in ${dir})`);
    assert.equal(await server.done, 0);
  } finally {
    for (const p of [server, ...devices]) if (p.exitCode === null) p.kill();
    await tab?.close();
  }
  const j = journal(dir);
  assert.deepEqual(j.devices["node-1"].runtimes, ["onnxruntime-node"]);
  assert.deepEqual(j.devices["web-2"].runtimes, ["onnxruntime-web"]);
  assert.equal(j.devices["node-3"].role, "weak");
  for (const id of ["node-1", "web-2", "node-3"]) {
    assert.equal(j.devices[id].backend, j.devices[id].runtimes[0], `${id} trains on the runtime it declared`);
    assert.ok(j.devices[id].split > 0, `${id} trains a tail`);
  }
  assert.equal(j.rounds.length, ROUNDS);
  assert.ok(j.rounds.every((r) => r.finished));
  if (TAB) {
    assert.deepEqual(j.devices["tab-4"].runtimes, ["onnxruntime-web"]);
    assert.equal(j.devices["tab-4"].role, "weak", "the tab on a tight budget trains the head only");
  }
  for (const id of ["py-0", "node-1", "web-2", "node-3", ...(TAB ? ["tab-4"] : [])]) {
    const mine = j.reports.filter((r) => r.device === id);
    assert.equal(mine.length, ROUNDS, `${id} reported every round`);
    assert.ok(mine.every((r) => r.accepted === 1), `${id}'s reports were accepted`);
  }
  const web = readFileSync(join(dir, "web-2.log"), "utf8").trim().split("\n").map((l) => JSON.parse(l));
  assert.equal(web.filter((e) => e.event === "round_done").length, ROUNDS);
  console.log(`# ${JSON.stringify(j.devices)} accuracy ${j.rounds.at(-1).metrics.accuracy}`);
});
