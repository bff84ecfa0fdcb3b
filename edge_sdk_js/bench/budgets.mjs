// One device held to its budget, as JSON on stdout (bench/js_budgets.py runs it; test/budgets.mjs does
// the work): `node bench/budgets.mjs node|python|tab|gputab MODEL BUDGET_MIB ROUNDS [--trace]` (--trace: a tab's
// memory per round and phase as well, test/budgets.mjs `tabDevice`).
import { cappedDevice, tabDevice } from "../test/budgets.mjs";

const [kind, model, budget, rounds, flag] = process.argv.slice(2);
const r = kind === "tab" || kind === "gputab"
  ? await tabDevice(model, Number(budget), Number(rounds), { trace: flag === "--trace", webgpu: kind === "gputab" })
  : await cappedDevice(kind, model, Number(budget), Number(rounds));
console.log(JSON.stringify(r));
