// The heavy tier's secure mixed fleet (`make test-heavy`, not CI; test/secagg-fleet.mjs): the same fleet,
// shards and server seed run plain (no secure aggregation; the sample-weighted mean per block without the
// defences a masked update cannot take, as a secure round aggregates) and secure: both finish every round,
// the secure run holds every claim CI's test/secagg-fleet.test.mjs checks of it, and its final accuracy is the
// plain run's within TOLERANCE. A measured margin over two fleets of six devices: CI keeps the secure run
// (with an accuracy floor) and the run with a third of the fleet killed.
import assert from "node:assert/strict";
import { test } from "node:test";
import { CHROMIUM } from "./browser.mjs";
import { TOLERANCE, checkRounds, checkSecure, runFleet } from "./secagg-fleet.mjs";

test("a mixed fleet with a Chromium tab trains under secure aggregation as it does without",
  { timeout: 1_800_000, skip: CHROMIUM === undefined && "chromium is not installed (apt-get install chromium)" }, async () => {
    const plain = await runFleet("plain", { secure: false });
    checkRounds(plain, null);
    const secure = await runFleet("secure", { secure: true });
    checkSecure(secure);
    const [a, b] = [secure.journal.rounds.at(-1).metrics.accuracy, plain.journal.rounds.at(-1).metrics.accuracy];
    console.log(`# secure ${a.toFixed(4)}, plain ${b.toFixed(4)}, difference ${(a - b).toFixed(4)}`);
    assert.ok(Math.abs(a - b) <= TOLERANCE, `final accuracy: secure ${a}, plain ${b}, apart by more than ${TOLERANCE}`);
  });
