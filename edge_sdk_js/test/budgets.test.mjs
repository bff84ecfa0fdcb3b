// JavaScript devices keep the budget they declare (docs/js-device.md, "Memory"; test/budgets.mjs):
// a Node device under a hard memory cap equal to its budget, weak and strong (and strong in secure
// rounds), and a Chromium tab at a weak and a moderate budget each train three rounds of digits_mlp
// against a real orchestrator, every round's report accepted, in the role their budget buys, and
// their resident peak (the device's own, as reported; the tab's renderer's) stays under the budget. A tab
// training on its GPU (onnxruntime-web's WebGPU build; SwiftShader here) is held to a weak budget (530 MiB)
// and a moderate one (710 MiB) the same way, its GPU process (which a page can neither see nor bound) read
// and reported beside its renderer: the planner charges a digits_mlp tab on its GPU what its renderer
// holds while it trains there (profiles/runtime.py, WEBGPU_RUNTIME_BYTES), weak from 526 MiB, moderate
// from 706 MiB. On a 2-core machine the weak tab's three rounds take about 20 s, the moderate's 85 s.
// Skipped with one line where there is no cgroup memory controller to cap with (not root) or no
// Chromium. In `make test-slow`. Three rounds: the first (whole payloads downloaded), the second (a
// delta against the payload kept) and a third on the second's path.
import assert from "node:assert/strict";
import { test } from "node:test";
import { CHROMIUM } from "./browser.mjs";
import { assertKept, cappedDevice, gpuTabTest, tabDevice } from "./budgets.mjs";

const ROUNDS = 3;
const MiB = 2 ** 20;

for (const [budget, role] of [[185, "weak"], [400, "strong"]]) {
  test(`a ${role} Node device under a hard cap of its ${budget} MiB budget trains ${ROUNDS} rounds`, { timeout: 600_000 }, async (t) => {
    const r = await cappedDevice("node", "digits_mlp", budget, ROUNDS);
    if (r.skipped) { t.skip(r.skipped); return; }
    assert.equal(r.cap.returncode, 0, `exit ${r.cap.returncode}, OOM-killed: ${r.cap.oom_killed} (logs in ${r.logs})`);
    assert.ok(!r.cap.oom_killed && r.cap.cgroup_peak_bytes <= r.budget);
    assert.ok(r.reportedPeak > 0 && r.reportedPeak <= r.budget, `the device reported a peak of ${r.reportedPeak} bytes`);
    console.log(`# ${role} Node device at ${budget} MiB: resident peak ${(r.peak / MiB).toFixed(1)} MiB`);
    assertKept(r, role, ROUNDS);
  });
}

/**
 * The same strong Node device in secure rounds (a Python device its partner in every block's cohort):
 * it masks its 8.5M trained parameters a slice at a time (src/secagg/round.ts), so its secure rounds
 * stay inside the budget that holds its plain ones.
 */
test(`a strong Node device under a hard cap of its 400 MiB budget trains ${ROUNDS} secure rounds`, { timeout: 600_000 }, async (t) => {
  const r = await cappedDevice("node", "digits_mlp", 400, ROUNDS, { secure: true });
  if (r.skipped) { t.skip(r.skipped); return; }
  assert.equal(r.cap.returncode, 0, `exit ${r.cap.returncode}, OOM-killed: ${r.cap.oom_killed} (logs in ${r.logs})`);
  assert.ok(!r.cap.oom_killed && r.cap.cgroup_peak_bytes <= r.budget);
  assert.deepEqual(r.masked, Array(ROUNDS).fill(2), `two masked uploads a round (logs in ${r.logs})`);
  console.log(`# strong Node device at 400 MiB, secure rounds: resident peak ${(r.peak / MiB).toFixed(1)} MiB`);
  assertKept(r, "strong", ROUNDS);
});

/**
 * A tab's budgets: the planner charges onnxruntime-web's tab for the copies of the trainable parameters
 * its WebAssembly heap and its uncollected gradient arrays hold (profiles/runtime.py, WEB_TRAINING_COPIES),
 * so at 400 MiB a digits_mlp tab gets the weak plan (split 3, 367 MiB) and the moderate one (split 2,
 * 547 MiB) from 547 MiB.
 */
for (const [budget, role] of [[400, "weak"], [580, "moderate"]]) {
  test(`a ${role} Chromium tab at ${budget} MiB trains ${ROUNDS} rounds under its budget`, { timeout: 600_000 }, async (t) => {
    if (CHROMIUM === undefined) { t.skip("no Chromium: set CHROMIUM or install Debian's chromium"); return; }
    const r = await tabDevice("digits_mlp", budget, ROUNDS, { trace: true });
    console.log(`# ${role} tab at ${budget} MiB: split ${r.split}, renderer peak ${(r.peak / MiB).toFixed(1)} MiB`);
    assertKept(r, role, ROUNDS);
  });
}

gpuTabTest(530, "weak");
gpuTabTest(710, "moderate");
