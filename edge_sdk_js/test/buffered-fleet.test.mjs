// Buffered asynchronous rounds (FedBuff, docs/buffered.md) train a mixed fleet through `edgetrain serve
// --round-mode buffered`: two Python devices (torch), two onnxruntime-node devices (400 MiB strong, 185
// MiB weak) and two headless Chromium tabs, the fleet of the mixed-fleet test (test/fleet.mjs). The slow
// device is the first tab, training its tail on WebGPU (SwiftShader's adapter: a CPU emulation of a GPU,
// many times slower than WebAssembly here, FACTS.md): while it trains, the five others fill buffers of
// BUFFER_SIZE and the model moves on, so each of its updates arrives on an older version and is folded
// with staleness >= 1, weighed (1 + s)^-1/2, not cut. digits_mlp, LOCAL_STEPS steps a round and VERSIONS
// versions keep the run within a few minutes. From the server's events and the journal: every version
// made, each buffer folding BUFFER_SIZE updates; every report accepted, no refusal, no late report (but
// those answered "the run is over" once the last version is made), no error frame on either side; the GPU tab reported, on the GPU, and every one of its updates was folded
// stale; each device planned for its budget (the roles and splits the mixed-fleet test checks), each
// tab's renderer peak and each process device's reported peak under its budget; accuracy and loss better at the end than after the first version.
// In `make test-slow`.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { CHROMIUM } from "./browser.mjs";
import { runFleet } from "./fleet.mjs";

const SEED = 0;
const VERSIONS = 12;
const BUFFER_SIZE = 3;
const LOCAL_STEPS = 3;
const MiB = 2 ** 20;
const RUNTIME = { "py-0": "torch", "py-1": "torch", "node-2": "onnxruntime-node", "node-3": "onnxruntime-node",
  "tab-4": "onnxruntime-webgpu", "tab-5": "onnxruntime-web" };
const BUDGET_MIB = { "tab-4": 710, "tab-5": 400 };
/** The process devices' budgets (test/fleet.mjs): each reports its resident peak with every update. */
const PROCESS_BUDGET_MIB = { "py-0": 2048, "py-1": 2048, "node-2": 400, "node-3": 185 };
/** Server events that would mean an update was refused, cut or lost. */
const REFUSALS = new Set(["late", "rejected", "device_error", "over_budget", "round_failed", "upload_cut", "train_graph_refused"]);
/** Device events that would mean an error frame or a broken run. */
const DEVICE_ERRORS = new Set(["error", "aborted"]);
/** A device error, but not a task the server's goodbye cut when the last version was made (the device's
 * instruction for version VERSIONS, its "aborted" the run's end, as the device itself says: not a drop). */
const deviceError = (e) => DEVICE_ERRORS.has(e.event) && !(e.event === "aborted" && e.round >= VERSIONS);

function jsonLines(path) {
  return readFileSync(path, "utf8").split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
}

test("buffered rounds train a mixed fleet, the slow WebGPU tab's updates folded stale, not cut",
  { timeout: 900_000, skip: CHROMIUM === undefined && "chromium is not installed (apt-get install chromium)" }, async () => {
    const started = performance.now();
    const run = await runFleet({ kind: "mixed", seed: SEED, rounds: VERSIONS, tabs: true, serveArgs: ["--round-mode", "buffered",
      "--concurrency", "6", "--buffer-size", String(BUFFER_SIZE), "--local-steps", String(LOCAL_STEPS), "--eval-every", "1"] });
    const j = run.journal;
    const where = `(logs in ${run.logs})`;
    const events = jsonLines(join(run.logs, "server.log"));

    // Every version made, each by a full buffer, the version it says.
    const ends = events.filter((e) => e.event === "round_end");
    assert.deepEqual(ends.map((e) => e.round), Array.from({ length: VERSIONS }, (_, i) => i + 1), `versions ${where}`);
    assert.ok(ends.every((e) => e.model_version === e.round && e.buffered === BUFFER_SIZE), `buffers ${where}`);
    assert.equal(j.rounds.length, VERSIONS);
    assert.ok(j.rounds.every((r) => r.finished), `every version committed ${where}`);

    // Every report accepted; nothing refused, late or lost; no error frame at either end.
    const train = j.reports.filter((r) => r.phase === "train");
    assert.equal(train.length, VERSIONS * BUFFER_SIZE, `every folded update journaled once ${where}`);
    assert.ok(train.every((r) => r.accepted === 1), `refused: ${JSON.stringify(train.filter((r) => r.accepted !== 1))} ${where}`);
    // A report still waiting for a buffer when the last version is made is answered "the run is over": the run's end, not a cut.
    assert.deepEqual(events.filter((e) => REFUSALS.has(e.event) && !(e.event === "late" && e.over)), [], `refusals ${where}`);
    assert.ok(ends.every((e) => (e.wasted_total ?? 0) === 0), `wasted updates ${where}`);
    for (const id of ["py-0", "py-1", "node-2", "node-3"]) {
      assert.deepEqual(jsonLines(join(run.logs, `${id}.log`)).filter(deviceError), [], `${id}'s errors`);
    }
    for (const id of ["tab-4", "tab-5"]) {
      assert.deepEqual(run.tabs[id].events.filter(deviceError), [], `${id}'s errors`);
    }

    // Each staleness as the versions say; the GPU tab's updates each folded stale, at its weight.
    for (const r of train) assert.equal(r.staleness, r.round - 1 - r.model_version, `${r.device} in buffer ${r.round}`);
    const gpu = train.filter((r) => r.device === "tab-4");
    assert.ok(gpu.length >= 1, `the GPU tab reported nothing before the run ended ${where}`);
    // Stale updates are folded: the GPU tab's after its first are stale (its first may meet the first buffer
    // still open when the other devices start slowly on a loaded machine: staleness 0, also folded).
    assert.ok(gpu.slice(1).every((r) => r.staleness >= 1) && gpu.some((r) => r.staleness >= 1),
      `the GPU tab's staleness ${gpu.map((r) => r.staleness)} ${where}`);
    assert.ok(gpu.every((r) => r.backend === "onnxruntime-webgpu"), "the GPU tab trained on the GPU");
    const folded = events.filter((e) => e.event === "update" && e.device === "tab-4");
    assert.deepEqual(folded.map((e) => [e.round, e.accepted, e.staleness]), gpu.map((r) => [r.round, true, r.staleness]));
    const devices = new Set(train.map((r) => r.device));
    assert.deepEqual([...devices].sort(), Object.keys(RUNTIME).sort(), "every device's updates were folded");

    // Each device planned for its budget, and its resident peak under it.
    for (const [id, runtime] of Object.entries(RUNTIME)) assert.equal(j.devices[id].backend, runtime, `${id} trains on ${runtime}`);
    for (const id of ["py-0", "py-1", "node-2"]) assert.equal(j.devices[id].split, 0, `${id} (strong) trains the whole model`);
    // The GPU tab at 710 MiB is planned moderate (test/budgets.test.mjs holds a lone one to it too).
    assert.equal(j.devices["tab-4"].role, "moderate", `tab-4 at 710 MiB on its GPU is moderate ${where}`);
    const deepest = Math.max(...Object.values(j.devices).map((d) => d.split));
    for (const id of ["node-3", "tab-5"]) {
      assert.equal(j.devices[id].role, "weak", `${id} on a tight budget is weak`);
      assert.equal(j.devices[id].split, deepest, `${id} trains the fewest blocks of the fleet`);
    }
    // Each process device's own reported peak (its resident high-water mark) under its budget. The weak Node
    // device's is the delta downloads of the chunks the strong devices move each version (a lone device's stay
    // held): rebuilt beside a second copy of the base read back and a third for the result, it reported 195.7 and
    // 199 MiB in two of three runs; rebuilt in the base's own bytes, read without a copy, it stays under 185 MiB.
    const reported = {};
    for (const r of train) reported[r.device] = Math.max(reported[r.device] ?? 0, r.peak_rss_bytes ?? 0);
    for (const [id, budget] of Object.entries(PROCESS_BUDGET_MIB)) {
      assert.ok(reported[id] > 50 * MiB && reported[id] <= budget * MiB,
        `${id}'s reported peak ${(reported[id] / MiB).toFixed(1)} MiB against its ${budget} MiB ${where}`);
    }
    for (const id of ["tab-4", "tab-5"]) {
      const { peak } = run.tabs[id];
      assert.ok(peak > 50 * MiB && peak <= BUDGET_MIB[id] * MiB, `${id}'s renderer peak ${(peak / MiB).toFixed(1)} MiB`);
    }

    // The model learnt: better accuracy and validation loss at the end than after the first version.
    const accuracy = j.rounds.map((r) => r.metrics.accuracy);
    const loss = j.rounds.map((r) => r.metrics.test_loss);
    assert.ok(accuracy.at(-1) > accuracy[0] && accuracy.at(-1) > 0.5, `accuracy ${accuracy} ${where}`);
    assert.ok(loss.at(-1) < loss[0], `test loss ${loss} ${where}`);
    console.log(`# buffered mixed fleet, seed ${SEED}: ${VERSIONS} versions of ${BUFFER_SIZE}; accuracy ${accuracy[0].toFixed(4)} -> `
      + `${accuracy.at(-1).toFixed(4)}; GPU tab folded in buffers ${gpu.map((r) => r.round)} at staleness ${gpu.map((r) => r.staleness)}; `
      + `tab renderer peaks ${Object.entries(run.tabs).map(([id, t]) => `${id} ${(t.peak / MiB).toFixed(0)} MiB`).join(", ")}; `
      + `reported peaks ${Object.entries(reported).map(([id, b]) => `${id} ${(b / MiB).toFixed(0)} MiB`).join(", ")}; `
      + `${Math.round((performance.now() - started) / 1000)} s`);
  });
