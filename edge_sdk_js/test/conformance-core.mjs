// One conformance case in one runtime: the multi-step forward pass, one training step's loss,
// gradients and new buffers, tau steps of momentum SGD (deltas) and an evaluation, each compared
// with what the Python ONNX Runtime device computed. Runs in Node and in a browser page.
import { OrtTail, evaluateTail, multiStepForward, parseTrainGraph, takeRows, trainTail } from "../dist/index.js";

/**
 * Relative tolerances (max |js - python| / max |python|), stated in docs/protocol.md, "Conformance".
 * `loss`: the received state's (one step's, and the evaluation before training); `lossAfter`: after tau steps.
 */
export const TOLERANCE = { activations: 1e-5, loss: 1e-5, grads: 1e-4, deltas: 1e-3, lossAfter: 1e-5, eval: 1e-5 };

function rel(a, b) {
  let worst = 0, scale = 0;
  for (let i = 0; i < b.length; i++) {
    worst = Math.max(worst, Math.abs(Number(a[i]) - Number(b[i])));
    scale = Math.max(scale, Math.abs(Number(b[i])));
  }
  return scale === 0 ? worst : worst / scale;
}

function planOf(c) {
  const ints = (t) => Int32Array.from(t.data, Number);
  const batches = [];
  for (let t = 0; `batch:${t}` in c.plan; t++) batches.push(ints(c.plan[`batch:${t}`]));
  return { evalIdx: ints(c.plan.eval), batches };
}

/**
 * Worst relative error per quantity for case `c` (see test/cases.mjs loadCase): the frozen chunks
 * in `runtime`, the tail in `tailRuntime` (default the same; a WebGPU backend's GPU runtime).
 */
export async function runConformance(runtime, c, tailRuntime = runtime) {
  const s = c.summary;
  const cfg = { localSteps: s.train.local_steps, batchSize: s.train.batch_size, lr: s.train.lr, momentum: s.train.momentum,
    weightDecay: s.train.weight_decay, seed: s.train.seed, evalSamples: s.train.eval_samples, proxMu: 0, threads: 1 };
  const x = c.data.x, y = c.data.y;
  const started = performance.now();
  const acts = await multiStepForward(runtime, c.chunks, x, cfg.batchSize);
  const forwardMs = performance.now() - started;
  const err = { activations: rel(acts.data, c.expected.activations.data) };
  const graph = parseTrainGraph(c.graph);
  const tail = new OrtTail(tailRuntime, graph);
  const plan = planOf(c);
  const weights = {}, shapes = {};
  for (const n of tail.names) { weights[n] = Float32Array.from(c.state[n].data); shapes[n] = c.state[n].shape; }
  const step = await tail.step(takeRows(acts, plan.batches[0]), takeRows(y, plan.batches[0]), weights, shapes);
  err.loss = Math.abs(step.loss - s.step_loss) / Math.max(1, Math.abs(s.step_loss));
  err.grads = 0;
  for (const n of graph.params) err.grads = Math.max(err.grads, rel(step.grads[n], c.expected[`grad:${n}`].data));
  for (const n of graph.buffers) err.grads = Math.max(err.grads, rel(step.fresh[n], c.expected[`new:${n}`].data));
  const t0 = performance.now();
  const result = await trainTail(tail, c.state, acts, y, cfg, plan);
  const trainMs = performance.now() - t0;
  err.deltas = 0;
  for (const [n, d] of Object.entries(result.deltas)) err.deltas = Math.max(err.deltas, rel(d.data, c.expected[`delta:${n}`].data));
  err.loss = Math.max(err.loss, Math.abs(result.lossBefore - s.loss_before) / Math.max(1, s.loss_before));
  err.lossAfter = Math.abs(result.lossAfter - s.loss_after) / Math.max(1, s.loss_after);
  const all = Int32Array.from({ length: x.shape[0] }, (_, i) => i);
  const ev = await evaluateTail(tail, c.state, acts, y, { ...cfg, evalSamples: 512 }, all);
  err.eval = Math.abs(ev.loss - s.eval.loss) / Math.max(1, s.eval.loss) + Math.abs(ev.accuracy - s.eval.accuracy);
  await tail.release();
  return { err, forwardMs, msPerStep: trainMs / cfg.localSteps, deltaNames: Object.keys(result.deltas).sort() };
}
