// The secure mixed fleet of test/secagg-fleet.test.mjs (CI's slow tier: the secure run and the run with a
// third of the fleet killed after upload) and test/secagg-fleet-accuracy.test.mjs (the heavy tier: the secure
// run's accuracy against the same fleet's plain run): Python devices on torch and on ONNX Runtime, two Node
// devices and a headless Chromium tab (onnxruntime-web on WebAssembly), each with its enrolled credential,
// train digits_mlp under EmbracingFL (strong and weak devices: nested block cohorts) with `serve
// --secure-aggregation --require-credentials`; every run the same fleet, shards and server seed.
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { python } from "./cases.mjs";
import { browserDevice, enroll, journal, nodeDevice, start, startServer, tempDir, writeShards } from "./fleet.mjs";

export const ROUNDS = 3;
export const SEED = 0;
/**
 * id -> [kind, budget, runtime]: kind python (runtime its --backend), node or tab. The budgets give
 * the same roles planned plain or secure (a secure run plans its devices with the secure round's
 * memory, profiles.accounting TrainingMemory.secured).
 */
export const FLEET = {
  "py-0": ["python", "2GiB", "torch"], // strong
  "py-1": ["python", "2GiB", "onnxruntime"], // strong: four strong of six reach the round's t = 4 on every block
  "node-2": ["node", "400MiB", "node"], // strong
  "node-3": ["node", "195MiB", "node"], // weak
  "tab-4": ["tab", "400", "onnxruntime-web"], // weak (MiB)
  "py-5": ["python", "2GiB", "torch"], // strong
};
export const KILLED = ["py-1", "tab-4"];
export const KILL_ROUND = 2;
/**
 * Final accuracy, secure minus plain, may be off by this much either way. The same fleet's final
 * accuracy moves by 0.028 with nothing but the server seed (the mixed-fleet test's measure), the two
 * runs' models differ by the updates' quantisation (2^-f of a clip of 20) and the devices' own
 * nondeterminism (thread counts, WebAssembly's sums), and one test sample of 359 is 0.0028.
 */
export const TOLERANCE = 0.035;

export function events(file) {
  if (!existsSync(file)) return [];
  return readFileSync(file, "utf8").split("\n").filter((l) => l.startsWith("{")).map((l) => {
    try { return JSON.parse(l); } catch { return {}; } // a line still being written
  });
}

/** Resolves once the server's log has the update of each of `ids` in `round`; `stop()` ends the watch. */
function whenUploaded(dir, ids, round) {
  let watching = true;
  const seen = (async () => {
    while (watching) {
      const got = new Set(events(join(dir, "server.log")).filter((e) => e.event === "update" && e.round === round).map((e) => e.device));
      if (ids.every((id) => got.has(id))) return true;
      await new Promise((r) => setTimeout(r, 50));
    }
    return false;
  })();
  return { seen, stop: () => { watching = false; } };
}

/** One run of the fleet; `secure`: with secure aggregation; `kill`: ids killed after their KILL_ROUND upload. */
export async function runFleet(kind, { secure, kill = [] }) {
  const dir = tempDir(`edgetrain-secagg-fleet-${kind}-`);
  const ids = Object.keys(FLEET);
  const secrets = Object.fromEntries(ids.map((id) => [id, enroll(dir, id)]));
  // A stage waits 120 s, not 30: on a loaded machine a device's keys can take longer than 30 s to come (its
  // process starved of CPU), and the test's claim is every masked upload of the fleet in every round.
  const rule = secure ? ["--secure-aggregation", "--secure-clip", "20", "--secure-stage-s", "120"]
    : ["--norm-bound", "0", "--no-direction-trust", "-O", "max_weight_share=1.0"];
  const { server, url } = await startServer(dir, ["--model", "digits_mlp", "--rounds", String(ROUNDS), "--min-devices", String(ids.length),
    "--local-steps", "10", "--deadline", "300", "--straggler-policy", "deadline", "--seed", String(SEED), "--eval-every", "1",
    "--require-credentials", ...rule]);
  const shards = writeShards(dir, ids.map((_, i) => i), ids.length);
  const procs = {};
  let tab;
  const watch = kill.length ? whenUploaded(dir, kill, KILL_ROUND) : null;
  try {
    for (const [i, [id, [k, budget, runtime]]] of Object.entries(FLEET).entries()) {
      if (k === "python") {
        procs[id] = start(dir, id, python(), ["-m", "edge_sdk", "--server", url, "--id", id, "--budget", budget, "--backend", runtime,
          "--data", "digits", "--client", String(i), "--num-clients", String(ids.length), "--secret-file", secrets[id],
          "--json-events", "--once"]);
      } else if (k === "node") {
        procs[id] = nodeDevice(dir, url, id, budget, shards[i], runtime, ["--secret-file", secrets[id]]);
      } else {
        tab = await browserDevice(dir, url, id, shards[i], Number(budget), { secret: readFileSync(secrets[id], "utf8").trim() });
      }
    }
    const killed = watch?.seen.then(async (seen) => {
      if (!seen) return;
      for (const id of kill) {
        if (procs[id]) procs[id].kill("SIGKILL");
        else await tab.browser.close(); // the tab's renderer and its websocket, at once
      }
    });
    const tabDone = tab.done.then((r) => r, (err) => (kill.includes("tab-4") ? { killed: true } : Promise.reject(err)));
    const code = await server.done;
    watch?.stop();
    await killed;
    const tabResult = await tabDone;
    const codes = Object.fromEntries(await Promise.all(Object.entries(procs).map(async ([id, p]) => [id, await p.done])));
    return { dir, code, codes, tabResult, journal: journal(dir) };
  } finally {
    watch?.stop();
    server.kill();
    for (const p of Object.values(procs)) if (p.exitCode === null) p.kill();
    await tab?.close().catch(() => {});
  }
}

export function checkRounds(run, masked) {
  const j = run.journal;
  assert.equal(run.code, 0, `the server's exit code (logs in ${run.dir})`);
  assert.equal(j.rounds.length, ROUNDS, `rounds (logs in ${run.dir})`);
  for (const r of j.rounds) {
    assert.ok(r.finished, `round ${r.round} finished (logs in ${run.dir})`);
    if (masked === null) continue;
    const secure = r.metrics.secure;
    assert.equal(secure.masked, masked[r.round - 1], `round ${r.round}: masked uploads (logs in ${run.dir})`);
    const blocks = Object.values(secure.blocks);
    assert.ok(blocks.length > 0 && blocks.every((b) => b.revealed), `round ${r.round}: every block revealed: ${JSON.stringify(secure)}`);
  }
}

/** The secure run's claims: every round finished with all six masked uploads and every block revealed; each
 * device on its runtime, a weak device on the last blocks only (nested cohorts), every report accepted; the
 * last blocks summed over all six devices, the tab's included; the tab answered each round's unmasking. */
export function checkSecure(secure) {
  const all = Object.keys(FLEET).length;
  checkRounds(secure, Array(ROUNDS).fill(all));
  const j = secure.journal;
  assert.deepEqual(secure.codes, Object.fromEntries(Object.keys(FLEET).filter((id) => !id.startsWith("tab")).map((id) => [id, 0])));
  assert.equal(secure.tabResult.reports, ROUNDS, "the tab's run returned a report a round");
  // Each device trained on its runtime, with nested cohorts: a weak device trains the last blocks only.
  assert.equal(j.devices["tab-4"].backend, "onnxruntime-web");
  assert.equal(j.devices["py-1"].backend, "onnxruntime");
  assert.equal(j.devices["py-0"].split, 0);
  assert.ok(j.devices["tab-4"].split > 0 && j.devices["node-3"].split > 0, `weak devices' splits: ${JSON.stringify(j.devices)}`);
  for (const id of Object.keys(FLEET)) {
    const mine = j.reports.filter((r) => r.device === id && r.phase === "train");
    assert.deepEqual(mine.map((r) => [r.round, r.accepted]).sort((a, b) => a[0] - b[0]),
      Array.from({ length: ROUNDS }, (_, r) => [r + 1, 1]), `${id} reported every round, accepted`);
  }
  const cohorts = j.rounds.map((r) => Math.max(...Object.values(r.metrics.secure.blocks).map((b) => b.cohort)));
  assert.deepEqual(cohorts, Array(ROUNDS).fill(all), "the last blocks summed over all six devices, the tab's included");
  const reveals = secure.tabResult.events.filter((e) => e.event === "secure_reveal");
  assert.deepEqual(reveals.map((e) => [e.round, e.survivors, e.dropped]), Array.from({ length: ROUNDS }, (_, r) => [r + 1, all, 0]),
    "the tab answered each round's unmasking request");
}
