// A device's held payloads (docs/protocol.md, "Held payloads", "Delta downloads"): which payload each
// delta-download slot holds outlives a Node device's process (slots.json beside the payloads, the file
// the Python store writes), and a slot never names a payload the store no longer holds.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { memoryPayloadStore } from "../dist/payload-store.js";
import { folderPayloadStore, payloadFolder } from "../dist/payload-store-file.js";
import { tempDir } from "./tmp.mjs";

const sha = (data) => createHash("sha256").update(data).digest("hex");
const bytes = (c) => new Uint8Array(300).fill(c.charCodeAt(0));

test("a slot's payload outlives the process and a slot never names one gone", async (t) => {
  const folder = tempDir("edgetrain-slots-");
  const chunk = bytes("c"), tail = bytes("t"), other = bytes("o");
  const store = folderPayloadStore(folder, 700);
  await store.put(sha(chunk), chunk);
  await store.put(sha(tail), tail);
  await store.setSlot("chunk:0-2", sha(chunk));
  await store.setSlot("tail:2", sha(tail));
  await store.setSlot("tail:3", sha(bytes("n"))); // never kept: not entered
  const again = folderPayloadStore(folder, 700);
  assert.deepEqual([await again.slot("chunk:0-2"), await again.slot("tail:2"), await again.slot("tail:3")],
    [sha(chunk), sha(tail), ""]);
  assert.deepEqual(await again.get(sha(tail)), tail); // the tail is the most recently used
  await again.put(sha(other), other); // over the budget: the chunk goes
  assert.equal(await again.slot("chunk:0-2"), "");
  assert.equal(await again.slot("tail:2"), sha(tail));
  writeFileSync(join(folder, "slots.json"), "{not json");
  assert.equal(await folderPayloadStore(folder, 700).slot("tail:2"), "");
});

test("the memory store keeps slots for the page's life, only of payloads it holds", async () => {
  const store = memoryPayloadStore(700);
  const tail = bytes("t");
  await store.setSlot("tail:2", sha(tail));
  assert.equal(await store.slot("tail:2"), "");
  await store.put(sha(tail), tail);
  await store.setSlot("tail:2", sha(tail));
  assert.equal(await store.slot("tail:2"), sha(tail));
});

test("payload-cache auto is a folder of the device's own per server, as the Python device names it", () => {
  const saved = process.env.EDGETRAIN_PAYLOAD_CACHE;
  try {
    process.env.EDGETRAIN_PAYLOAD_CACHE = "/var/cache/held";
    // edge_sdk/payload_store.py's payload_folder("auto", "wss://Server.lan:8765", "board-7") (tests/test_validated_defaults.py)
    assert.equal(payloadFolder("auto", "wss://Server.lan:8765", "board-7"), "/var/cache/held/server.lan-8765/board-7");
    assert.equal(payloadFolder("auto", "ws://[::1]/", "d"), "/var/cache/held/__1-80/d");
    assert.equal(payloadFolder("off", "ws://h:1", "d"), undefined);
    assert.equal(payloadFolder("/x", "ws://h:1", "d"), "/x");
  } finally {
    if (saved === undefined) delete process.env.EDGETRAIN_PAYLOAD_CACHE; else process.env.EDGETRAIN_PAYLOAD_CACHE = saved;
  }
});

test("the folder store reads a payload afresh each time: what get returns is the caller's to write over", async (t) => {
  const folder = tempDir("edgetrain-fresh-");
  const store = folderPayloadStore(folder, 700), chunk = bytes("c");
  assert.equal(store.fresh, true);
  await store.put(sha(chunk), chunk);
  const first = await store.get(sha(chunk));
  first.fill(0); // a delta download rebuilt in place over its base
  assert.deepEqual(await store.get(sha(chunk)), chunk, "the held payload is untouched");
  // The memory store hands out the bytes it keeps: a delta must not be rebuilt over them.
  assert.notEqual(memoryPayloadStore(700).fresh, true);
});
