// Conformance on the GPU: every zoo model at every split the planner gives a tab on WebGPU
// (test/tab_splits.py), trained in a headless Chromium tab on the WebGPU backend (the frozen chunks
// on WebAssembly, the tail's training graph on SwiftShader's WebGPU adapter), against the Python
// device, within the WebAssembly tab's tolerances (TOLERANCE; docs/protocol.md, "Conformance").
// Where a unit sits within float32 rounding of a ReLU's or a MaxPool's branch point, runtimes may
// take different branches, and their trajectories part: ResNet20's tails that hold stage 1 or 2
// (splits below 7; as on WebAssembly) already at the first step, so there the activations, the
// received state's losses and the evaluation are compared with the Python device, and one step's
// gradients with float64 autograd taking the GPU's own sides (bench/relu_sides.py --runtimes
// webgpu); leaf_cnn's whole model (split 0) at this case's second step (from the same weights, the
// GPU's and WebAssembly's gradients differ in one of conv2's 64 bias entries, by 1.6e-2, and through
// it in the convolutions' weights; the dense layers agree within 5e-7), so there everything but the
// deltas and the loss after training is compared.
// Every split takes about 56 minutes here (SwiftShader runs the GPU's kernels on the CPU; 14 of them the
// cases' first export), so `make test-heavy` (not CI) runs two of them, the planner's moderate digits_mlp tab and its
// weak ResNet20 tab; EDGETRAIN_WEBGPU_CONFORMANCE=all runs every tab split (bench/README.md), or a list
// of model:split names those.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { CHROMIUM, conformanceInPage, openPage, servePage } from "./browser.mjs";
import { HERE, REPO, python, pythonEnv, referenceCases } from "./cases.mjs";
import { tempDir } from "./fleet.mjs";
import { TOLERANCE } from "./conformance-core.mjs";

const skip = CHROMIUM ? false : "chromium is not installed (apt-get install chromium): browser tests skipped";
// Smaller cases than the WebAssembly tab's (96 samples, 5 steps): each WebGPU run on SwiftShader takes seconds.
const SIZE = ["--samples", "32", "--steps", "2"];
/** Tails whose one-step gradients depend on ReLU sides within rounding of zero (docs/protocol.md, "Conformance"). */
const reluSensitive = (c) => c.startsWith("resnet20:") && Number(c.split(":")[1]) < 7;
/** What is compared with the Python device: everything, or what a branch taken the other way leaves determined. */
function compared(c) {
  if (reluSensitive(c)) return ["activations", "loss", "eval"];
  if (c === "leaf_cnn:0") return ["activations", "loss", "grads", "eval"];
  return Object.keys(TOLERANCE);
}

const SAMPLED = ["digits_mlp:2", "resnet20:7"];
const ALL = process.env.EDGETRAIN_WEBGPU_CONFORMANCE === "all";

function tabSplits() {
  if (process.env.EDGETRAIN_WEBGPU_CONFORMANCE && !ALL) return process.env.EDGETRAIN_WEBGPU_CONFORMANCE.split(",");
  const out = execFileSync(python(), [join(HERE, "tab_splits.py"), "--runtimes", "onnxruntime-webgpu"], { env: pythonEnv() });
  const every = JSON.parse(out.toString().trim().split("\n").at(-1));
  return ALL ? every : SAMPLED.filter((c) => every.includes(c));
}

const CASES = CHROMIUM ? tabSplits() : [];

test("every zoo model's tab splits train on WebGPU as in the Python device", { skip, timeout: 3 * 3600_000 }, async () => {
  const listed = Boolean(process.env.EDGETRAIN_WEBGPU_CONFORMANCE) && !ALL;
  assert.ok(listed || (CASES.includes("resnet20:7") && CASES.includes("digits_mlp:2") && (!ALL || CASES.length >= 10)), JSON.stringify(CASES));
  const folders = referenceCases(CASES, SIZE);
  const site = await servePage({ cases: dirname(folders[0]) });
  const { browser, page } = await openPage(site.url, { webgpu: true });
  const failed = [];
  try {
    for (const [i, name] of CASES.entries()) {
      const started = performance.now();
      const r = await conformanceInPage(page, folders[i], { webgpu: true });
      console.log(`# ${name} chromium onnxruntime-webgpu (${r.probe.adapter?.architecture}), ${Math.round((performance.now() - started) / 1000)} s: ${JSON.stringify(r.err)}`);
      assert.equal(r.backend, "onnxruntime-webgpu", `${name}: ${JSON.stringify(r.probe)}`);
      assert.deepEqual(r.deltaNames, r.expectedNames);
      for (const key of compared(name)) if (!(r.err[key] <= TOLERANCE[key])) failed.push(`${name}: ${key} off by ${r.err[key]} > ${TOLERANCE[key]}`);
    }
  } finally {
    await browser.close();
    await site.close();
  }
  assert.deepEqual(failed, []);
});

test("ResNet20's ReLU-sensitive tab splits: one step's gradients on WebGPU match float64 with the GPU's own ReLU sides",
  { skip, timeout: 2 * 3600_000 }, () => {
    const splits = CASES.filter(reluSensitive).map((c) => c.split(":")[1]);
    if (splits.length === 0) return;
    const out = join(tempDir("edgetrain-relu-sides-"), "relu_sides.json");
    execFileSync(python(), [join(REPO, "bench", "relu_sides.py"), "--splits", splits.join(","), "--runtimes", "webgpu", "--out", out],
      { env: pythonEnv(), stdio: ["ignore", "inherit", "inherit"] });
    const rows = JSON.parse(readFileSync(out, "utf8")).rows;
    assert.deepEqual(rows.map((r) => String(r.split)), splits);
    for (const row of rows) {
      console.log(`# resnet20:${row.split} webgpu: own sides ${row.webgpu.own_sides}, float64 sides ${row.webgpu.float64_sides}, `
        + `${row.webgpu_python_side_differences} of ${row.relu_units} ReLU units on the other side from Python`);
      assert.ok(row.webgpu.own_sides <= TOLERANCE.grads, `resnet20:${row.split}: ${row.webgpu.own_sides} > ${TOLERANCE.grads}`);
    }
  });
