// Conformance: the same state and batch give the same loss, gradients and deltas after tau steps
// in the Python ONNX Runtime device and in this SDK on onnxruntime-node and onnxruntime-web
// (WebAssembly, under Node). Every exportable split runs in bench/js_devices.py.
import assert from "node:assert/strict";
import { test } from "node:test";
import { loadRuntime } from "../dist/index.js";
import { loadCase, referenceCases } from "./cases.mjs";
import { TOLERANCE, runConformance } from "./conformance-core.mjs";

// The splits the planner gives a moderate device of the MLP (fc3 and the head) and a weak device of
// ResNet20 on ONNX Runtime (stage 3 and the head; 119 MiB at batch 32).
const CASES = (process.env.EDGETRAIN_JS_CONFORMANCE ?? "digits_mlp:2,resnet20:7").split(",");
const folders = referenceCases(CASES);

for (const kind of ["node", "web"]) {
  for (const [i, name] of CASES.entries()) {
    test(`${name} trains in onnxruntime-${kind} as in the Python device`, async () => {
      const c = loadCase(folders[i]);
      const runtime = await loadRuntime(kind);
      const { err, deltaNames } = await runConformance(runtime, c);
      console.log(`# ${name} onnxruntime-${kind}: ${JSON.stringify(err)}`);
      const expectedNames = Object.keys(c.expected).filter((k) => k.startsWith("delta:")).map((k) => k.slice(6)).sort();
      assert.deepEqual(deltaNames, expectedNames);
      for (const [key, limit] of Object.entries(TOLERANCE)) assert.ok(err[key] <= limit, `${key} off by ${err[key]} > ${limit}`);
    });
  }
}
