// Bytes on the wire from a Node device (docs/protocol.md, "Held payloads"): a device that keeps its
// payloads by sha256 (--payload-cache) is sent no byte of a payload it holds, and the server's
// journal says which payloads came from the device's own store.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { nodeDevice, startServer, tempDir, writeShards } from "./fleet.mjs";
import { HERE, python, pythonEnv } from "./cases.mjs";

/** The server journal's payload movements (orchestrator.store.Store.transfers). */
function transfers(dir) {
  const code = "import json, sys\nfrom orchestrator.store import Store\n"
    + "with Store.open_readonly(sys.argv[1]) as s: print(json.dumps(s.transfers()))";
  return JSON.parse(execFileSync(python(), ["-c", code, join(dir, "store")], { env: pythonEnv(), cwd: join(HERE, "..", "..") }).toString());
}

function events(dir, id) {
  return readFileSync(join(dir, `${id}.log`), "utf8").trim().split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
}

test("a Node device in its second round is sent no byte of the chunks and training graph it holds", { timeout: 300_000 }, async () => {
  const dir = tempDir("edgetrain-js-held-");
  const shards = writeShards(dir, [0], 2);
  const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--rounds", "2", "--min-devices", "1",
    "--local-steps", "2", "--deadline", "90"]);
  // weak: the frozen chunk is never trained, so its bytes stay the same while its id follows the version
  const device = nodeDevice(dir, url, "node-held", "185MiB", shards[0], "node", ["--payload-cache", join(dir, "held")]);
  try {
    assert.equal(await device.done, 0, `device log in ${dir}`);
    assert.equal(await server.done, 0);
  } finally {
    for (const p of [server, device]) if (p.exitCode === null) p.kill();
  }
  const used = events(dir, "node-held").filter((e) => e.event === "from_store").map((e) => `${e.round}:${e.kind}`);
  assert.deepEqual([...new Set(used)].sort(), ["2:chunk", "2:train_graph"]);
  const rows = transfers(dir);
  const held = (round) => rows.filter((r) => r.round === round && (r.kind === "chunk" || r.kind === "train_graph"));
  assert.ok(held(1).length >= 2 && held(1).every((r) => r.bytes > 0 && !r.from_device_store));
  assert.deepEqual(held(2).map((r) => [r.kind, r.bytes, r.held, r.from_device_store]),
    held(1).map((r) => [r.kind, 0, r.bytes, true]), "every chunk and the graph: 0 bytes, all from the device's store");
  assert.ok(rows.some((r) => r.round === 2 && r.kind === "model" && r.bytes > 0), "the tail's new weights are sent");
  assert.ok(readdirSync(join(dir, "held")).some((n) => /^[0-9a-f]{64}$/.test(n)), "the payloads are kept by sha256");
});
