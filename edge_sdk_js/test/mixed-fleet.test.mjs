// A mixed fleet trains every round (test/mixed-fleet.mjs): one orchestrator, six devices: two Python devices
// (torch), two onnxruntime-node devices (400 MiB, strong; 185 MiB, weak) and two headless Chromium tabs on
// WebAssembly (710 MiB, moderate; 400 MiB, a tight budget that buys only the head), train digits_mlp for five
// rounds (a tab training on its GPU is the buffered fleet's and the budget tests': on SwiftShader its rounds
// take minutes, and here it would set every round's pace). From the journal: each device's runtime and split,
// every device's report accepted in every round, every round finished, and the model learns: its final
// accuracy is above FLOOR. During the run the status page (`serve --web`), open in a third headless Chromium,
// shows every device, what each trained on, and the round count the journal has (its DOM).
// Its accuracy against an all-Python fleet's (a measured margin, a second fleet of six) is the heavy tier's
// (test/mixed-fleet-accuracy.test.mjs). In `make test-slow`.
import assert from "node:assert/strict";
import { test } from "node:test";
import { CHROMIUM } from "./browser.mjs";
import { runFleet } from "./fleet.mjs";
import { ROUNDS, SEED, checkEveryRound, checkMixed, watchStatus } from "./mixed-fleet.mjs";

/**
 * The mixed fleet's final accuracy is above this: 10 classes, chance is 0.1; seed 0's mixed fleet ended at 0.883
 * (docs/js-device.md, "Tests and measurements"), and with the JavaScript devices' updates zeroed at 0.749.
 */
const FLOOR = 0.8;

test("a mixed fleet (Python, Node, Chromium tabs) trains every round and learns",
  { timeout: 1_800_000, skip: CHROMIUM === undefined && "chromium is not installed (apt-get install chromium)" }, async () => {
    const started = performance.now();
    const mixed = await runFleet({ kind: "mixed", seed: SEED, rounds: ROUNDS, tabs: true, gpuTab: false, web: true, during: watchStatus() });
    checkEveryRound(mixed);
    checkMixed(mixed);
    const a = mixed.accuracy.at(-1);
    console.log(`# seed ${SEED}: mixed ${a.toFixed(4)}; status page matched the journal at ${mixed.seen.roundsDone} rounds; `
      + `splits ${JSON.stringify(mixed.devices)}; ${Math.round((performance.now() - started) / 1000)} s`);
    assert.ok(a > FLOOR, `final accuracy: mixed ${a}, not above ${FLOOR}`);
  });
