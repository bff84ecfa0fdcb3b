// A mixed fleet under secure aggregation (test/secagg-fleet.mjs: Python devices on torch and on ONNX Runtime,
// two Node devices and a headless Chromium tab, each with its enrolled credential, EmbracingFL's nested block
// cohorts, `serve --secure-aggregation --require-credentials`). Two runs of the same fleet, shards and seed:
//
// - secure: every round finished, every block of every round revealed with all six masked uploads, the tab's
//   reports accepted and its unmasking answers given, and the model learns (chance is 0.1);
// - secure with two of the six devices (a third: the Python ONNX Runtime device and the tab) killed
//   as soon as the server has their round-2 masked upload: round 2 still reveals every block (their
//   self masks rebuilt from their neighbours' shares, their pairwise masks from theirs), round 3
//   trains with the four left, and every round completes.
//
// The secure run's accuracy against the same fleet's plain run (a measured margin, a third fleet) is the heavy
// tier's (test/secagg-fleet-accuracy.test.mjs). In `make test-slow`.
import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";
import { CHROMIUM } from "./browser.mjs";
import { FLEET, KILLED, KILL_ROUND, ROUNDS, checkRounds, checkSecure, events, runFleet } from "./secagg-fleet.mjs";

test("a mixed fleet with a Chromium tab trains under secure aggregation; with a third killed after upload, every round completes",
  { timeout: 1_800_000, skip: CHROMIUM === undefined && "chromium is not installed (apt-get install chromium)" }, async () => {
    const secure = await runFleet("secure", { secure: true });
    checkSecure(secure);
    // 10 classes: chance is 0.1 (the heavy tier holds it to the plain run's within TOLERANCE).
    const learnt = secure.journal.rounds.at(-1).metrics.accuracy;
    console.log(`# secure ${learnt.toFixed(4)}`);
    assert.ok(learnt > 0.5, `the secure fleet learns: accuracy ${learnt}`);

    const all = Object.keys(FLEET).length;
    const dropped = await runFleet("dropped", { secure: true, kill: KILLED });
    const masked = Array.from({ length: ROUNDS }, (_, r) => (r + 1 <= KILL_ROUND ? all : all - KILLED.length));
    checkRounds(dropped, masked);
    // Whether a killed device had answered its unmasking request first depends on when it was killed:
    // a survivor's reveal event says how many of the round's uploaders it answered for as survivors.
    const seen = events(join(dropped.dir, "node-2.log")).filter((e) => e.event === "secure_reveal" && e.round === KILL_ROUND);
    console.log(`# killed ${KILLED.join(", ")} after their round-${KILL_ROUND} upload: node-2 revealed for `
      + `${JSON.stringify(seen.map((e) => ({ survivors: e.survivors, dropped: e.dropped })))}; `
      + `accuracy ${dropped.journal.rounds.map((r) => r.metrics.accuracy.toFixed(4)).join(", ")}`);
    for (const id of KILLED) {
      const mine = dropped.journal.reports.filter((r) => r.device === id && r.phase === "train").map((r) => r.round);
      assert.deepEqual(mine, Array.from({ length: KILL_ROUND }, (_, r) => r + 1), `${id} reported until it was killed`);
    }
    assert.equal(dropped.codes["py-1"], "SIGKILL");
    // 10 classes: chance is 0.1.
    assert.ok(dropped.journal.rounds.at(-1).metrics.accuracy > 0.5, "the fleet trained on after the kills");
  });
