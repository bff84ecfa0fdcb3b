// A browser device keeps its payloads in IndexedDB (`indexedDbPayloadStore`, src/payload-store-idb.ts):
// in a headless Chromium page the store keeps payloads by sha256 within its byte budget (least recently
// used first out), its delta-download slots, and both across a page reload; damaged bytes read as not
// held. End to end: a tab trains a run's first round, the page is reloaded, and in the resumed run's
// next round the server sends it no byte of the chunks and training graph its IndexedDB holds (the
// journal says they came from the device's store). In `make test-slow`.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { encodeTensors } from "../dist/index.js";
import { loadShard } from "../dist/shard.js";
import { CHROMIUM, openPage, servePage } from "./browser.mjs";
import { HERE, python, pythonEnv } from "./cases.mjs";
import { startServer, tempDir, writeShards } from "./fleet.mjs";

const skip = CHROMIUM === undefined && "chromium is not installed (apt-get install chromium)";

/** The server journal's payload movements (orchestrator.store.Store.transfers). */
function transfers(dir) {
  const code = "import json, sys\nfrom orchestrator.store import Store\n"
    + "with Store.open_readonly(sys.argv[1]) as s: print(json.dumps(s.transfers.all()))";
  return JSON.parse(execFileSync(python(), ["-c", code, join(dir, "store")], { env: pythonEnv(), cwd: join(HERE, "..", "..") }).toString());
}

async function reload(page) {
  await page.reload();
  await page.waitForFunction(() => window.ready === true, { timeout: 60_000 });
}

test("the IndexedDB payload store keeps payloads and slots across a reload, least recently used out first", { timeout: 120_000, skip },
  async () => {
    const site = await servePage();
    const { browser, page } = await openPage(site.url);
    try {
      const first = await page.evaluate(async () => {
        const hex = async (b) => [...new Uint8Array(await crypto.subtle.digest("SHA-256", b))].map((x) => x.toString(16).padStart(2, "0")).join("");
        const bytes = (v) => new Uint8Array(1000).fill(v);
        window.digests = {};
        for (const k of ["a", "b", "c", "d"]) window.digests[k] = await hex(bytes(k.charCodeAt(0)));
        const store = await window.sdk.indexedDbPayloadStore("t", 3000);
        for (const k of ["a", "b", "c"]) await store.put(window.digests[k], bytes(k.charCodeAt(0)));
        await store.get(window.digests.a); // a is now the most recently used: b goes first
        await store.put(window.digests.d, bytes(100));
        await store.setSlot("tail:3", window.digests.a);
        await store.setSlot("chunk:0", window.digests.b); // b is not held: no slot
        const held = {};
        for (const k of ["a", "b", "c", "d"]) held[k] = (await store.get(window.digests[k]))?.length ?? 0;
        const tooBig = await window.sdk.indexedDbPayloadStore("small", 10);
        await tooBig.put(window.digests.a, bytes(97));
        return { held, slots: [await store.slot("tail:3"), await store.slot("chunk:0")], small: (await tooBig.get(window.digests.a)) === undefined,
          digests: window.digests };
      });
      assert.deepEqual(first.held, { a: 1000, b: 0, c: 1000, d: 1000 }, "within 3,000 bytes the least recently used (b) went");
      assert.deepEqual(first.slots, [first.digests.a, ""]);
      assert.ok(first.small, "a payload over the budget is not kept");
      await reload(page);
      const again = await page.evaluate(async (digests) => {
        const store = await window.sdk.indexedDbPayloadStore("t", 3000);
        const a = await store.get(digests.a);
        const slot = await store.slot("tail:3");
        // Damage c's bytes where they are kept: it then reads as not held, and is dropped.
        const db = await new Promise((resolve, reject) => {
          const req = indexedDB.open("t");
          req.onsuccess = () => resolve(req.result);
          req.onerror = () => reject(req.error);
        });
        await new Promise((resolve, reject) => {
          const tx = db.transaction("payloads", "readwrite");
          const s = tx.objectStore("payloads");
          const get = s.get(digests.c);
          get.onsuccess = () => { const v = get.result; v.data = new Uint8Array(1000).fill(1); s.put(v, digests.c); };
          tx.oncomplete = resolve;
          tx.onerror = () => reject(tx.error);
        });
        db.close();
        return { a: a ? [a.length, a[0]] : null, slot, c: (await store.get(digests.c)) === undefined, d: (await store.get(digests.d))?.length ?? 0 };
      }, first.digests);
      assert.deepEqual(again, { a: [1000, 97], slot: first.digests.a, c: true, d: 1000 }, "kept across the reload; damaged bytes not held");
    } finally {
      await browser.close();
      await site.close();
    }
  });

test("a tab reloaded between runs is sent no byte of the chunks and training graph its IndexedDB holds", { timeout: 600_000, skip },
  async () => {
    const dir = tempDir("edgetrain-js-tab-held-");
    const shard = writeShards(dir, [0], 2)[0];
    const data = loadShard(shard);
    writeFileSync(join(dir, "tab.bin"), encodeTensors({ x: data.x, y: data.y }));
    const site = await servePage({ shards: dir });
    const { browser, page } = await openPage(site.url);
    // One weak device: its frozen chunks are never trained, so their bytes stay the same from run to run.
    const serve = (rounds, more = []) => startServer(dir, ["--model", "digits_mlp", "--rounds", String(rounds), "--min-devices", "1",
      "--local-steps", "2", "--deadline", "90", "--no-direction-trust", ...more]);
    const run = (url) => page.evaluate(async (server) => {
      const { DeviceClient, decodeTensors, indexedDbPayloadStore, makeRuntime } = window.sdk;
      const t = decodeTensors(new Uint8Array(await (await fetch("/shards/tab.bin")).arrayBuffer()));
      const events = [];
      const client = new DeviceClient({ server, deviceId: "tab-held", budgetBytes: 400 * 2 ** 20, webSocket: (u) => new WebSocket(u),
        runtime: makeRuntime("onnxruntime-web", window.ort, 2), data: { x: t.x, y: t.y }, maxRetries: 3,
        payloadStore: await indexedDbPayloadStore("edgetrain-payloads", 256 * 2 ** 20),
        onEvent: (kind, d) => events.push({ event: kind, ...d }) });
      const reports = await client.run();
      return { reports: reports.length, fromStore: events.filter((e) => e.event === "from_store").map((e) => `${e.round}:${e.kind}`) };
    }, url);
    try {
      const one = await serve(1);
      const first = await run(one.url);
      assert.equal(await one.server.done, 0, `the first run's server (logs in ${dir})`);
      assert.deepEqual(first, { reports: 1, fromStore: [] });
      await reload(page);
      const two = await serve(2, ["--resume"]);
      const second = await run(two.url);
      assert.equal(await two.server.done, 0, `the resumed run's server (logs in ${dir})`);
      assert.equal(second.reports, 1);
      assert.deepEqual([...new Set(second.fromStore)].sort(), ["2:chunk", "2:train_graph"], "after the reload, from IndexedDB");
      const rows = transfers(dir);
      const held = (round) => rows.filter((r) => r.round === round && (r.kind === "chunk" || r.kind === "train_graph"));
      assert.ok(held(1).length >= 2 && held(1).every((r) => r.bytes > 0 && !r.from_device_store));
      assert.deepEqual(held(2).map((r) => [r.kind, r.bytes, r.held, r.from_device_store]),
        held(1).map((r) => [r.kind, 0, r.bytes, true]), "every chunk and the graph: 0 bytes, all from the tab's store");
    } finally {
      await browser.close();
      await site.close();
    }
  });
