// One fleet run for bench/js_devices.py's accuracy part and bench/round_bytes.py's mixed fleet, one JSON
// object on stdout:
//
//   node bench/fleet-accuracy.mjs python|mixed SEED ROUNDS [--no-browser] [--no-gpu]
//        [--serve-args "ARGS"] [--device-args "ARGS"]
//
// The workload and the two fleets are test/fleet.mjs's (WORKLOAD, runFleet): digits_mlp on six
// devices, the same shards in both fleets, one orchestrator started with --seed SEED; `python` is
// six Python devices, `mixed` two Python devices, two onnxruntime-node devices (one weak) and two
// headless Chromium tabs on onnxruntime-web (one weak, the other on the GPU unless --no-gpu; without
// chromium, or with --no-browser, onnxruntime-web devices under Node). --serve-args and --device-args
// (space-separated) are more options of the server and of the Python and Node devices. The final
// accuracy, each device's runtime and split, and each round's bytes per device (`bytes`: the round
// metrics' by device and payload kind) come from the journal.
import { CHROMIUM } from "../test/browser.mjs";
import { runFleet } from "../test/fleet.mjs";

const [kind, seed, rounds, ...flags] = process.argv.slice(2);
const words = (name) => {
  const at = flags.indexOf(name);
  return at < 0 ? [] : flags[at + 1].split(" ").filter(Boolean);
};
const tabs = CHROMIUM !== undefined && !flags.includes("--no-browser");
const { journal, seen, ...run } = await runFleet({ kind, seed: Number(seed), rounds: Number(rounds), tabs,
  gpuTab: !flags.includes("--no-gpu"), serveArgs: words("--serve-args"), deviceArgs: words("--device-args") });
console.log(JSON.stringify({ ...run, bytes: journal.rounds.map((r) => r.metrics.bytes ?? null) }));
