// The heavy tier's mixed fleet (`make test-heavy`, not CI; test/mixed-fleet.mjs): the mixed fleet of CI's
// test/mixed-fleet.test.mjs, every claim that test checks, and an all-Python fleet (six Python devices, the same
// shards, the same server seed) beside it: the mixed fleet's final accuracy is the all-Python fleet's within
// TOLERANCE. A measured margin over a second fleet of six; CI keeps the mixed fleet with an accuracy floor.
import assert from "node:assert/strict";
import { test } from "node:test";
import { CHROMIUM } from "./browser.mjs";
import { WORKLOAD, runFleet } from "./fleet.mjs";
import { ROUNDS, SEED, TOLERANCE, checkEveryRound, checkMixed, watchStatus } from "./mixed-fleet.mjs";

test("a mixed fleet (Python, Node, Chromium tabs) trains every round and reaches the all-Python fleet's accuracy",
  { timeout: 1_800_000, skip: CHROMIUM === undefined && "chromium is not installed (apt-get install chromium)" }, async () => {
    const started = performance.now();
    // The all-Python fleet starts once the mixed fleet's devices are planned: the two servers' start-up
    // (exports for every split the mixed fleet's budgets buy) does not compete for the CPU.
    let startReference;
    const referenceStarts = new Promise((resolve) => { startReference = resolve; });
    const [mixed, python] = await Promise.all([
      runFleet({ kind: "mixed", seed: SEED, rounds: ROUNDS, tabs: true, gpuTab: false, web: true, during: watchStatus(startReference) }),
      referenceStarts.then(() => runFleet({ kind: "python", seed: SEED, rounds: ROUNDS })),
    ]);
    for (const run of [mixed, python]) checkEveryRound(run);
    assert.equal(Object.keys(python.journal.devices).length, WORKLOAD.devices);
    checkMixed(mixed);
    const [a, b] = [mixed.accuracy.at(-1), python.accuracy.at(-1)];
    console.log(`# seed ${SEED}: mixed ${a.toFixed(4)}, all-Python ${b.toFixed(4)}, difference ${(a - b).toFixed(4)}; `
      + `status page matched the journal at ${mixed.seen.roundsDone} rounds; splits ${JSON.stringify(mixed.devices)}; `
      + `${Math.round((performance.now() - started) / 1000)} s`);
    assert.ok(Math.abs(a - b) <= TOLERANCE, `final accuracy: mixed ${a}, all-Python ${b}, apart by more than ${TOLERANCE}`);
  });
