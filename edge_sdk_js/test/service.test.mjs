// The Node device as a service (`edgetrain-device --config device.toml`, as its systemd unit runs
// it): started before its server, it keeps trying and joins when the server comes; a server killed
// with SIGKILL mid-round and restarted with --resume gets it back by itself and the run finishes;
// and when a run ends the device waits for the next one and trains it. (tests/test_device_service.py
// holds the Python device to the same.)
import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { HERE, python, pythonEnv } from "./cases.mjs";
import { freePort, journal, start, tempDir, writeShards } from "./fleet.mjs";

const ROUNDS = 5;

function events(file) {
  if (!existsSync(file)) return [];
  return readFileSync(file, "utf8").split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
}

async function until(predicate, what, timeoutMs = 120_000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (predicate()) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`timed out waiting for ${what}`);
}

function serve(dir, name, port, store, ...args) {
  return start(dir, name, python(), ["-m", "edgetrain", "serve", "--host", "127.0.0.1", "--port", String(port),
    "--store", join(dir, store), "--model", "digits_mlp", "--min-devices", "1", "--local-steps", "20", "--deadline", "90",
    "--json-events", ...args],
  pythonEnv());
}

test("a Node service started before its server survives its kill -9 and --resume, and waits for the next run",
  { timeout: 480_000 }, async () => {
    const dir = tempDir("edgetrain-js-service-");
    const shard = writeShards(dir, [0], 2)[0];
    const port = await freePort();
    const config = join(dir, "device.toml");
    writeFileSync(config, `server = "ws://127.0.0.1:${port}"\nid = "board-0"\nbudget = "400MiB"\ndata = ${JSON.stringify(shard)}\n`
      + "json-events = true\nreconnect-max-delay = 1.0\n"); // reconnect-retries: the default, forever
    const log = join(dir, "board-0.log");
    const device = start(dir, "board-0", process.execPath, [join(HERE, "..", "dist", "cli.js"), "--config", config], process.env);
    const procs = [device];
    try {
      await until(() => events(log).filter((e) => e.event === "reconnect").length >= 3, "three attempts before the server");
      const tries = events(log).filter((e) => e.event === "reconnect");
      assert.ok(tries.every((e) => e.delay_s <= 1.0), "the waits are capped by reconnect-max-delay");
      assert.equal(device.exitCode, null);

      const first = serve(dir, "server-1", port, "store", "--rounds", String(ROUNDS));
      procs.push(first);
      await until(() => events(join(dir, "server-1.log")).some((e) => e.event === "round_start" && e.round === 3), "round 3");
      first.kill("SIGKILL"); // mid-round: no goodbye
      await first.done;
      const killedAt = journal(dir).rounds.filter((r) => r.finished).length;
      assert.ok(killedAt >= 2 && killedAt < ROUNDS, `killed after ${killedAt} rounds`);
      const before = events(log).filter((e) => e.event === "reconnect").length;
      await until(() => events(log).filter((e) => e.event === "reconnect").length > before, "a reconnect after the kill");
      assert.equal(device.exitCode, null, "the device outlives its server");

      const resumed = serve(dir, "server-2", port, "store", "--rounds", String(ROUNDS), "--resume");
      procs.push(resumed);
      assert.equal(await resumed.done, 0, `the resumed server finishes (logs in ${dir})`);
      const j = journal(dir);
      assert.equal(j.rounds.filter((r) => r.finished).length, ROUNDS);
      const late = new Set(j.reports.filter((r) => r.device === "board-0" && r.accepted === 1 && r.round > killedAt).map((r) => r.round));
      assert.equal(late.size, ROUNDS - killedAt, "the device came back by itself and trained every round after the restart");

      await until(() => events(log).some((e) => e.event === "run_over"), "the end of the run");
      assert.equal(device.exitCode, null, "the run is over and the service waits for the next one");

      const nextRun = tempDir("edgetrain-js-service-next-");
      const next = serve(nextRun, "server-3", port, "store", "--rounds", "1");
      procs.push(next);
      assert.equal(await next.done, 0);
      assert.deepEqual(journal(nextRun).reports.filter((r) => r.device === "board-0").map((r) => [r.round, r.accepted]), [[1, 1]]);
      await until(() => events(log).filter((e) => e.event === "run_over" && e.rounds === 1).length >= 1
        && events(log).filter((e) => e.event === "welcome").length >= 3, "the next run trained");
      assert.equal(device.exitCode, null);
    } finally {
      for (const p of procs) if (p.exitCode === null) p.kill("SIGTERM");
    }
    await device.done;
    const said = readFileSync(log, "utf8");
    assert.doesNotMatch(said, /^error: |    at /m, "no error and no stack");
  });
