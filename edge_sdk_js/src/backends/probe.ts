/**
 * The hello's probe step (docs/protocol.md, `Hello.probe_step_s`): the seconds one SGD step of a fixed
 * tiny model took on this device, which the server seeds the device's pace with until it has timed a
 * round of it (straggler pacing). The same step as the Python SDK's (edge_sdk/backends/base.py,
 * `probe_sgd_step`): a dense layer from 64 inputs to 10 classes, softmax cross-entropy, on a batch of
 * 32 fixed rows.
 */
import { PROBE_STEP_MAX_S } from "../messages.js";
import type { TrainingBackend } from "./backend.js";

export const PROBE_SHAPE = [32, 64, 10] as const;
const WARM_STEPS = 5;

let probe: { x: Float32Array; y: Int32Array; w: Float32Array } | undefined;

/** One local SGD step on the probe batch: forward, softmax cross-entropy's gradient, the update. */
export function probeSgdStep(lr = 0.1): void {
  const [batch, inputs, classes] = PROBE_SHAPE;
  if (!probe) {
    let seed = 1;  // fixed rows, any values: only the arithmetic's time matters
    const x = Float32Array.from({ length: batch * inputs }, () => ((seed = (seed * 48271) % 2147483647) / 2147483647) * 2 - 1);
    probe = { x, y: Int32Array.from({ length: batch }, (_, i) => i % classes), w: new Float32Array(inputs * classes) };
  }
  const { x, y, w } = probe;
  const grad = new Float32Array(batch * classes);
  for (let b = 0; b < batch; b++) {
    let max = -Infinity;
    for (let c = 0; c < classes; c++) {
      let z = 0;
      for (let i = 0; i < inputs; i++) z += x[b * inputs + i]! * w[i * classes + c]!;
      grad[b * classes + c] = z;
      max = Math.max(max, z);
    }
    let sum = 0;
    for (let c = 0; c < classes; c++) sum += (grad[b * classes + c] = Math.exp(grad[b * classes + c]! - max));
    for (let c = 0; c < classes; c++) grad[b * classes + c]! /= sum;
    grad[b * classes + y[b]!]! -= 1;
  }
  for (let i = 0; i < inputs; i++) {
    for (let c = 0; c < classes; c++) {
      let g = 0;
      for (let b = 0; b < batch; b++) g += x[b * inputs + i]! * grad[b * classes + c]!;
      w[i * classes + c]! -= (lr / batch) * g;
    }
  }
}

/** The seconds one probe step takes with `backend` (its own `probeStep` where it has one), after
 * `WARM_STEPS` untimed steps (the engine compiles the loops first: on the project's machine, Node,
 * a step timed after one untimed step took 2.0-2.1 ms, after five 0.11-0.13 ms); held within
 * (0, PROBE_STEP_MAX_S] so the hello carries a valid claim. */
export async function measureProbe(backend: TrainingBackend): Promise<number> {
  for (let i = 0; i < WARM_STEPS; i++) probeSgdStep();
  const start = performance.now();
  if (backend.probeStep) await backend.probeStep();
  else probeSgdStep();
  const elapsed = (performance.now() - start) / 1000;
  return Number.isFinite(elapsed) ? Math.min(PROBE_STEP_MAX_S, Math.max(elapsed, 1e-6)) : PROBE_STEP_MAX_S;
}
