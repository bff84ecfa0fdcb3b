// The device's registry of phases, report hooks and selection kinds (src/phases.ts), the
// algorithms' entries in it (src/algorithms/), the table of training backends (src/backends/), and
// the module layout they keep: the device's connection holds no phase or algorithm of its own, and
// src/ imports without cycles. A registry extended with a phase of a test's own runs through a real
// orchestrator in test/phases.test.mjs.
import assert from "node:assert/strict";
import { readFileSync, readdirSync, statSync } from "node:fs";
import { dirname, join, normalize, relative } from "node:path";
import { test } from "node:test";
import { BACKENDS, BUILTIN_REGISTRY, DEFAULT_REGISTRY, GraphBackend, ProtocolError, WebGpuBackend, fedalign, loadRuntime, makeBackend,
  width } from "../dist/index.js";
import { HERE } from "./cases.mjs";

const SRC = join(HERE, "..", "src");

const census = async (ctx) => ({ metrics: { classes: new Set(ctx.y.data).size } });
const note = (name) => (ctx, metrics) => { metrics[name] = 1; ctx.notes[name] = 1; };

/** A round's phase context without a connection, for the registry's own rules. */
function context(phase, config = {}, metrics = {}) {
  const events = [];
  return {
    events, instruction: { t: "instruction", round: 3, phase, config }, deviceId: "d", notes: {},
    x: null, y: { data: BigInt64Array.of(0n, 1n, 1n) },
    evaluate: async () => ({ ...metrics }), trained: async () => { throw new Error("not in this test"); },
    usage: () => ({}), event: (kind, data) => events.push([kind, data]),
  };
}

test("extending a registry leaves the original as it was, and a registry cannot be changed", () => {
  const extended = BUILTIN_REGISTRY.extended({ phases: { census }, selections: { odd: { trainsGraph: true } } });
  assert.ok(extended.phases.has("census") && !BUILTIN_REGISTRY.phases.has("census"));
  assert.ok(extended.selections.has("odd") && !BUILTIN_REGISTRY.selections.has("odd"));
  assert.deepEqual([...BUILTIN_REGISTRY.phases.keys()].sort(), ["compare", "evaluate", "train"]);
  assert.deepEqual([...BUILTIN_REGISTRY.selections.keys()].sort(), ["adapters", "rows", "tail"]);
  assert.throws(() => BUILTIN_REGISTRY.phases.set("x", census), TypeError);
  assert.throws(() => DEFAULT_REGISTRY.hooks.get("evaluate").push(note("x")), TypeError);
  assert.throws(() => { BUILTIN_REGISTRY.phases = new Map(); }, TypeError);
});

test("a registered name is not replaced silently, and a name is a non-empty string", () => {
  assert.throws(() => DEFAULT_REGISTRY.extended({ phases: { train: census } }), /phase 'train' is already registered/);
  assert.throws(() => DEFAULT_REGISTRY.extended({ selections: { channels: { trainsGraph: true } } }),
    /selection 'channels' is already registered/);
  assert.throws(() => DEFAULT_REGISTRY.extended({ phases: { "": census } }), /non-empty string/);
});

test("hooks run after their phase, in the order they were added", async () => {
  const first = DEFAULT_REGISTRY.hooks.get("evaluate");
  const registry = DEFAULT_REGISTRY.extended({ after: { evaluate: note("a") } }).extended({ after: { evaluate: note("b") } });
  assert.deepEqual(registry.hooks.get("evaluate").slice(0, first.length), [...first]);
  assert.equal(registry.hooks.get("evaluate").length, first.length + 2);
  assert.equal(DEFAULT_REGISTRY.hooks.get("evaluate").length, first.length);
  const order = [];
  const tracing = BUILTIN_REGISTRY.extended({ phases: { census }, after: { census: () => order.push("one") } })
    .extended({ after: { census: (ctx, metrics) => order.push(`two saw ${metrics.classes}`) } });
  const result = await tracing.run(context("census"));
  assert.deepEqual(result.metrics, { classes: 2 });
  assert.deepEqual(order, ["one", "two saw 2"]);
});

test("unknown phases and selections are refused by name with the protocol's `unexpected`", async () => {
  await assert.rejects(DEFAULT_REGISTRY.run(context("label_census")), (exc) => exc instanceof ProtocolError
    && exc.code === "unexpected" && /does not know the phase 'label_census' \(it knows compare, evaluate, train\)/.test(exc.message));
  assert.throws(() => DEFAULT_REGISTRY.selection("diagonal"), (exc) => exc instanceof ProtocolError
    && exc.code === "unexpected" && /does not know the selection 'diagonal'/.test(exc.message));
});

test("the default registry holds FedALIGN's check and width reduction's channels as entries", async () => {
  assert.ok(DEFAULT_REGISTRY.hooks.get("evaluate").includes(fedalign.checkAfterEvaluate));
  assert.ok(DEFAULT_REGISTRY.hooks.get("train").includes(fedalign.verdictAfterTrain));
  assert.equal(DEFAULT_REGISTRY.selection("channels"), width.CHANNELS);
  assert.equal(width.CHANNELS.trainsGraph, false);
  const slice = { config: { width: 0.5 } };
  assert.equal(width.instructionWidth(slice), 0.5);
  for (const bad of [0, 1.5, true, "0.5", undefined]) {
    assert.throws(() => width.CHANNELS.check({ config: { width: bad } }), (exc) => exc.code === "malformed");
  }
  // FedALIGN Section 3.1 through the registry: |F_k(w) - F(w)| <= epsilon, reported after evaluate
  // and remembered for the round's train report; no check without global_loss and epsilon.
  for (const [loss, verdict] of [[0.9, 1], [1.6, 0]]) {
    const ctx = context("evaluate", { global_loss: 1.0, epsilon: 0.5 }, { loss });
    const { metrics } = await DEFAULT_REGISTRY.run(ctx);
    assert.equal(metrics[fedalign.VERDICT], verdict);
    assert.deepEqual(ctx.events, [["incentive_check", { device: "d", round: 3, within_epsilon: verdict === 1 }]]);
    const trainMetrics = { loss_before: 1 };
    for (const hook of DEFAULT_REGISTRY.hooks.get("train")) hook({ ...ctx, instruction: { phase: "train", config: {} } }, trainMetrics);
    assert.equal(trainMetrics[fedalign.VERDICT], verdict);
  }
  const plain = await DEFAULT_REGISTRY.run(context("evaluate", {}, { loss: 5 }));
  assert.ok(!(fedalign.VERDICT in plain.metrics));
  assert.equal(fedalign.incentiveCheck({ loss: "nan" }, { global_loss: 1, epsilon: 1 }), false);
});

test("the backend table: training graphs in ONNX Runtime, declared by the runtime's name", async () => {
  const runtime = await loadRuntime("node");
  const backend = makeBackend("onnxruntime", runtime, 2);
  assert.ok(backend instanceof GraphBackend && backend.needsGraph);
  assert.deepEqual([...backend.runtimes], ["onnxruntime-node"]);
  assert.equal(backend.name, "onnxruntime-node");
  assert.throws(() => backend.check({ config: {} }), (exc) => exc.code === "unexpected" && /training graphs only/.test(exc.message));
  assert.throws(() => makeBackend("tflite", runtime), /unknown training backend 'tflite' \(known: onnxruntime, onnxruntime-webgpu\)/);
  assert.deepEqual([...BACKENDS.keys()], ["onnxruntime", "onnxruntime-webgpu"]);
});

test("the WebGPU backend declares the GPU first, and WebAssembly alone where there is no GPU", async () => {
  const backend = makeBackend("onnxruntime-webgpu", await loadRuntime("web"), 1);
  assert.ok(backend instanceof WebGpuBackend && backend.needsGraph);
  assert.deepEqual(backend.gpu.executionProviders, ["webgpu", "wasm"]);
  assert.deepEqual(backend.wasm.executionProviders, ["wasm"]);
  // Before the probe the hello offers both (a server that does not know the GPU runtime plans WebAssembly).
  assert.deepEqual([...backend.runtimes], ["onnxruntime-webgpu", "onnxruntime-web"]);
  assert.equal(backend.name, "onnxruntime-webgpu");
  assert.throws(() => backend.check({ config: {} }), (exc) => exc.code === "unexpected" && /training graphs only/.test(exc.message));
  // Node has no navigator.gpu: the probe says so, and the device trains (and is planned) on WebAssembly.
  const probe = await backend.probe();
  assert.match(probe.off, /no WebGPU/);
  assert.deepEqual([...backend.runtimes], ["onnxruntime-web"]);
  assert.equal(backend.name, "onnxruntime-web");
  assert.deepEqual(backend.metrics(), { backend: "onnxruntime-web", webgpu_fallback: probe.off });
});

/** Every .ts file under src/ with the modules it imports (relative imports only). */
function imports() {
  const files = [];
  const walk = (dir) => {
    for (const f of readdirSync(dir)) {
      const p = join(dir, f);
      if (statSync(p).isDirectory()) walk(p);
      else if (p.endsWith(".ts")) files.push(p);
    }
  };
  walk(SRC);
  return new Map(files.map((f) => [relative(SRC, f), [...readFileSync(f, "utf8").matchAll(/from "(\.[^"]+)\.js"/g)]
    .map((m) => relative(SRC, normalize(join(dirname(f), `${m[1]}.ts`))))]));
}

test("src/ imports without cycles, and the connection holds no phase or algorithm of its own", () => {
  const graph = imports();
  const state = new Map(); // 1: on the path, 2: done
  const visit = (file, path) => {
    if (state.get(file) === 2) return;
    assert.notEqual(state.get(file), 1, `import cycle: ${[...path, file].join(" -> ")}`);
    state.set(file, 1);
    for (const dep of graph.get(file) ?? []) visit(dep, [...path, file]);
    state.set(file, 2);
  };
  for (const file of graph.keys()) visit(file, []);
  // The layers below the device import nothing of it.
  for (const low of ["phases.ts", "downloads.ts", "backends/backend.ts", "backends/onnxruntime.ts", "algorithms/fedalign.ts"]) {
    for (const dep of graph.get(low)) assert.ok(!["client.ts", "roundwork.ts", "algorithms/index.ts"].includes(dep), `${low} imports ${dep}`);
  }
  const client = readFileSync(join(SRC, "client.ts"), "utf8");
  for (const code of ["within_epsilon", "incentive", "channels", "phase ===", '"train"', '"evaluate"', '"compare"',
    "train_graph", "multiStepForward", "trainTail"]) {
    assert.ok(!client.includes(code), `client.ts holds ${code}`);
  }
});
