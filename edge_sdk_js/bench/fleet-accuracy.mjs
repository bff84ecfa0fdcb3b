// One fleet run for bench/js_devices.py's accuracy part, one JSON object on stdout:
//
//   node bench/fleet-accuracy.mjs python|mixed SEED ROUNDS [--no-browser]
//
// The workload and the two fleets are test/fleet.mjs's (WORKLOAD, runFleet): digits_mlp on six
// devices, the same shards in both fleets, one orchestrator started with --seed SEED; `python` is
// six Python devices, `mixed` two Python devices, two onnxruntime-node devices (one weak) and two
// headless Chromium tabs on onnxruntime-web (one weak; without chromium, or with --no-browser,
// onnxruntime-web devices under Node). The final accuracy and each device's runtime and split come
// from the journal.
import { CHROMIUM } from "../test/browser.mjs";
import { runFleet } from "../test/fleet.mjs";

const [kind, seed, rounds, ...flags] = process.argv.slice(2);
const tabs = CHROMIUM !== undefined && !flags.includes("--no-browser");
const { journal, seen, ...run } = await runFleet({ kind, seed: Number(seed), rounds: Number(rounds), tabs });
console.log(JSON.stringify(run));
