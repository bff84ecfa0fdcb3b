// A JavaScript device takes part in secure aggregation: a real orchestrator (`serve
// --secure-aggregation --require-credentials`), two Python devices and one Node device (its
// onnxruntime-node backend, on a weak budget: it trains the last blocks only, so the block cohorts
// are nested), each with its enrolled credential file, train digits_mlp for two rounds. From the
// store's journal: every round finished, every block of every round revealed (the Node device's
// masks cancelled against the Python devices', its self mask removed with the shares it revealed),
// three masked uploads a round, and the Node device's report accepted in each. In `make test-slow`.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { python, pythonEnv } from "./cases.mjs";
import { journal, nodeDevice, start, startServer, tempDir, writeShards } from "./fleet.mjs";

const ROUNDS = 2;
const DEVICES = ["py-0", "py-1", "node-2"];

function enroll(dir, id) {
  const out = join(dir, `${id}.secret`);
  execFileSync(python(), ["-m", "orchestrator.cli", "device", "enroll", "--store", join(dir, "store"), "--id", id, "--out", out],
    { env: pythonEnv(), stdio: ["ignore", "ignore", "inherit"] });
  return out;
}

test("a Node device takes part in secure rounds beside Python devices: every block revealed, its reports accepted",
  { timeout: 900_000 }, async () => {
    const dir = tempDir("edgetrain-secagg-js-");
    const secrets = Object.fromEntries(DEVICES.map((id) => [id, enroll(dir, id)]));
    const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--rounds", String(ROUNDS), "--min-devices", "3",
      "--local-steps", "5", "--lr", "0.1", "--deadline", "300", "--straggler-policy", "deadline", "--require-credentials",
      "--secure-aggregation", "--secure-clip", "20"]);
    const shards = writeShards(dir, [2], 3);
    const procs = [];
    try {
      for (const [c, id] of ["py-0", "py-1"].entries()) {
        procs.push(start(dir, id, python(), ["-m", "edge_sdk", "--server", url, "--id", id, "--budget", "2GiB", "--data", "digits",
          "--client", String(c), "--num-clients", "3", "--secret-file", secrets[id], "--json-events", "--once"]));
      }
      procs.push(nodeDevice(dir, url, "node-2", "185MiB", shards[2], "node", ["--secret-file", secrets["node-2"]]));
      const codes = await Promise.all(procs.map((p) => p.done));
      assert.deepEqual(codes, [0, 0, 0], `device exit codes (logs in ${dir})`);
      assert.equal(await server.done, 0, `the server's exit code (logs in ${dir})`);
    } finally {
      for (const p of [server, ...procs]) if (p.exitCode === null) p.kill();
    }
    const j = journal(dir);
    assert.equal(j.rounds.length, ROUNDS);
    assert.ok(j.devices["node-2"].split > 0 && j.devices["py-0"].split === 0, `nested cohorts: ${JSON.stringify(j.devices)}`);
    for (const r of j.rounds) {
      assert.ok(r.finished, `round ${r.round} finished (logs in ${dir})`);
      const secure = r.metrics.secure;
      assert.equal(secure.masked, DEVICES.length, `round ${r.round}: three masked uploads`);
      const blocks = Object.values(secure.blocks);
      assert.ok(blocks.length > 0 && blocks.every((b) => b.revealed), `round ${r.round}: every block revealed: ${JSON.stringify(secure)}`);
      assert.equal(Math.max(...blocks.map((b) => b.cohort)), DEVICES.length, "the Node device's blocks summed with the Python devices'");
    }
    const mine = j.reports.filter((r) => r.device === "node-2" && r.phase === "train");
    assert.deepEqual(mine.map((r) => [r.round, r.accepted]), Array.from({ length: ROUNDS }, (_, r) => [r + 1, 1]));
    const reveals = readFileSync(join(dir, "node-2.log"), "utf8").split("\n").filter((l) => l.includes('"secure_reveal"'))
      .map((l) => JSON.parse(l));
    assert.deepEqual(reveals.map((e) => [e.round, e.survivors, e.dropped]), Array.from({ length: ROUNDS }, (_, r) => [r + 1, 3, 0]),
      "the Node device answered each round's unmasking request");
    // 10 classes: chance is 0.1 (two rounds of five steps, the updates clipped to 20 and quantized).
    assert.ok(j.rounds.at(-1).metrics.accuracy > 0.2, `accuracy after ${ROUNDS} rounds: ${j.rounds.at(-1).metrics.accuracy}`);
    rmSync(dir, { recursive: true, force: true });
  });
