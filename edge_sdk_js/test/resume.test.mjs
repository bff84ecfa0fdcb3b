// A device closed mid-upload and started again finishes its round (docs/protocol.md, "Resume"):
// its unacknowledged update is kept in a pending store (a file in Node, IndexedDB in a page), the
// new run says hello with that round and the server asks for the rest of the upload.
import assert from "node:assert/strict";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import WebSocket from "ws";
import { DeviceClient, encodeTensors, loadRuntime } from "../dist/index.js";
import { fileStore } from "../dist/pending-file.js";
import { loadShard } from "../dist/shard.js";
import { CHROMIUM, openPage, servePage } from "./browser.mjs";
import { journal, startServer, tempDir, writeShards } from "./fleet.mjs";

const ROUNDS = 1; // the round the device was closed in
const CUT = 200_000; // bytes sent before the first connection is cut: inside the first upload

/** A one-device run of digits_mlp (its update is megabytes: many 64 KiB frames). */
function oneDeviceServer(dir) {
  return startServer(dir, ["--model", "digits_mlp", "--rounds", String(ROUNDS), "--min-devices", "1", "--local-steps", "2",
    "--deadline", "120", "--chunk-codec", "none", "--tail-codec", "none", "--graph-codec", "none", "--download-delta", "none", "--update-codec", "none"]); // float32: the cut lands mid-upload
}

function assertEveryRoundOnce(dir, id) {
  const j = journal(dir);
  assert.equal(j.rounds.length, ROUNDS);
  assert.ok(j.rounds.every((r) => r.finished), "every round finished");
  const mine = j.reports.filter((r) => r.device === id && r.phase === "train");
  assert.deepEqual(mine.map((r) => [r.round, r.accepted]).sort(), Array.from({ length: ROUNDS }, (_, r) => [r + 1, 1]));
}

test("a Node device killed mid-upload and started again finishes its round", { timeout: 240_000 }, async () => {
  const dir = tempDir("edgetrain-js-resume-");
  const shard = writeShards(dir, [0], 1)[0];
  const { server, url } = await oneDeviceServer(dir);
  const pendingFile = join(dir, "pending.bin");
  const runtime = await loadRuntime("node");
  const device = (webSocket, events, reconnect = true) => new DeviceClient({
    server: url, deviceId: "node-r", budgetBytes: 400 * 2 ** 20, runtime, data: loadShard(shard), webSocket,
    frameSize: 64 << 10, reconnect, pending: fileStore(pendingFile), onEvent: (kind, data) => events.push({ event: kind, ...data }),
  });
  try {
    let sent = 0;
    const cutting = (u, maxPayload) => {
      const ws = new WebSocket(u, { maxPayload, perMessageDeflate: false });
      const send = ws.send.bind(ws);
      ws.send = (data) => { sent += data.byteLength; if (sent > CUT) ws.terminate(); else send(data); };
      return ws;
    };
    const first = [];
    await assert.rejects(device(cutting, first, false).run(), /ConnectionLost|lost the server/);
    assert.ok(existsSync(pendingFile), "the unacknowledged update was kept");
    assert.ok(first.some((e) => e.event === "welcome") && !first.some((e) => e.event === "round_done"));

    const second = [];
    const plain = (u, maxPayload) => new WebSocket(u, { maxPayload, perMessageDeflate: false });
    const reports = await device(plain, second).run();
    const resumed = second.find((e) => e.event === "upload_resumed");
    assert.ok(second.some((e) => e.event === "pending_restored" && e.round === 1), "the new run found round 1's update");
    assert.ok(resumed && resumed.round === 1 && resumed.offset > 0 && resumed.offset < resumed.total, JSON.stringify(resumed));
    assert.deepEqual(reports.map((r) => [r.round, r.accepted]), Array.from({ length: ROUNDS }, (_, r) => [r + 1, true]));
    assert.ok(!existsSync(pendingFile), "the store is emptied once the server acknowledged");
    assert.equal(await server.done, 0);
  } finally {
    if (server.exitCode === null) server.kill();
  }
  assertEveryRoundOnce(dir, "node-r");
});

/** In a page: a device on onnxruntime-web with its pending upload in IndexedDB; with `cut` > 0 its
 * socket stops sending after `cut` bytes and sets `window.cut` (the test then closes the tab). */
async function tabDevice(server, shardUrl, cut) {
  const { DeviceClient, decodeTensors, indexedDbStore, makeRuntime } = window.sdk;
  const t = decodeTensors(new Uint8Array(await (await fetch(shardUrl)).arrayBuffer()));
  const events = [];
  let sent = 0;
  const webSocket = (u) => {
    const ws = new WebSocket(u);
    if (cut > 0) {
      const send = ws.send.bind(ws);
      ws.send = (data) => { sent += data.byteLength; if (sent > cut) window.cut = true; else send(data); };
    }
    return ws;
  };
  const client = new DeviceClient({ server, deviceId: "tab-r", budgetBytes: 580 * 2 ** 20, webSocket, frameSize: 64 << 10,
    runtime: makeRuntime("onnxruntime-web", window.ort, 1), data: { x: t.x, y: t.y }, pending: indexedDbStore("tab-r"),
    onEvent: (kind, d) => events.push({ event: kind, round: d.round, offset: d.offset, total: d.total }) });
  const reports = await client.run();
  return { reports: reports.map((r) => [r.round, r.accepted]), events };
}

test("a Chromium tab closed mid-upload and opened again finishes its round", { skip: CHROMIUM ? false : "chromium is not installed (apt-get install chromium): browser tests skipped", timeout: 300_000 }, async () => {
  const dir = tempDir("edgetrain-js-tab-resume-");
  const data = loadShard(writeShards(dir, [0], 1)[0]);
  writeFileSync(join(dir, "shard.bin"), encodeTensors({ x: data.x, y: data.y }));
  const { server, url } = await oneDeviceServer(dir);
  const site = await servePage({ shards: dir });
  const { browser, page } = await openPage(site.url);
  try {
    page.evaluate(tabDevice, url, "/shards/shard.bin", CUT).catch(() => undefined); // ends with the tab
    await page.waitForFunction(() => window.cut === true, { timeout: 180_000, polling: 100 });
    const kept = await page.evaluate(async () => (await window.sdk.indexedDbStore("tab-r").load())?.round ?? null);
    assert.equal(kept, 1, "the tab kept round 1's unacknowledged update");
    await page.close();

    const again = await browser.newPage();
    await again.goto(site.url);
    await again.waitForFunction(() => window.ready === true, { timeout: 60_000 });
    const { reports, events } = await again.evaluate(tabDevice, url, "/shards/shard.bin", 0);
    const resumed = events.find((e) => e.event === "upload_resumed");
    assert.ok(events.some((e) => e.event === "pending_restored" && e.round === 1), "the reopened tab found round 1's update");
    assert.ok(resumed && resumed.round === 1 && resumed.offset > 0 && resumed.offset < resumed.total, JSON.stringify(resumed));
    assert.deepEqual(reports, Array.from({ length: ROUNDS }, (_, r) => [r + 1, true]));
    assert.equal(await again.evaluate(async () => window.sdk.indexedDbStore("tab-r").load()), null);
    assert.equal(await server.done, 0);
  } finally {
    if (server.exitCode === null) server.kill();
    await browser.close();
    await site.close();
  }
  assertEveryRoundOnce(dir, "tab-r");
});
