// A tab's renderer while it trains a model's tail through onnxruntime-web, no server: the training graph the
// server would send (exporters.train_export) and the model's state, trainTail a round at a time, and after each
// round the renderer's resident memory, its high-water mark and its anonymous mappings (MiB), as JSON lines:
//   node bench/tab-steps.mjs MODEL SPLIT ROUNDS [--adapters] [--liftoff-only]
// --liftoff-only: V8 runs WebAssembly on its baseline compiler alone (a switch a page cannot set), to measure
// what its optimising tier holds while it compiles ONNX Runtime's hot kernels (profiles/runtime.py,
// WEB_ATTENTION_COMPILE_BYTES). MODEL: a character model (char_transformer*, 40-token windows, Tiny
// Shakespeare's 65 characters); its inputs are 495 random windows and next characters, as many as the
// language-model fleet's tab trains on (test/lm-fleet.test.mjs).
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { openPage, rendererMemory, servePage } from "../test/browser.mjs";
import { REPO, python, pythonEnv } from "../test/cases.mjs";
import { tempDir } from "../test/fleet.mjs";

const [model, split, rounds, ...flags] = process.argv.slice(2);
const MiB = 2 ** 20;
const dir = tempDir("edgetrain-tab-steps-");
const EXPORT = `
import sys, msgpack, numpy as np
from edge_sdk.models import build_model
from edge_sdk.protocol.tensors import encode_tensors
from exporters.train_export import TrainGraphCache
model, split, adapters, out = build_model(sys.argv[1], seed=0), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
_, data = TrainGraphCache(None).get_or_export(model, split, adapters)
g = msgpack.unpackb(data, raw=False)
state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
tensors = {n: state[n] for n in g["params"] + g["buffers"] + g.get("frozen", [])}
rng = np.random.default_rng(0)
tensors["__x"] = rng.integers(0, 65, size=(495, 40)).astype(np.int64)
tensors["__y"] = rng.integers(0, 65, size=(495,)).astype(np.int64)
open(out + "/graph.bin", "wb").write(data)
open(out + "/state.bin", "wb").write(encode_tensors(tensors))
`;
execFileSync(python(), ["-c", EXPORT, model, split, flags.includes("--adapters") ? "1" : "0", dir], { cwd: REPO, env: pythonEnv() });

function anonymous(pid) {
  let anon = 0, counted = false;
  for (const line of readFileSync(`/proc/${pid}/smaps`, "utf8").split("\n")) {
    const m = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ (\d+)\s*(.*)$/.exec(line);
    if (m) { counted = m[1] === "0" || m[2].startsWith("["); continue; }
    const r = /^Rss:\s+(\d+) kB/.exec(line);
    if (r && counted) anon += Number(r[1]) * 1024;
  }
  return anon;
}

const site = await servePage({ steps: dir });
const { browser, page } = await openPage(site.url, { flags: flags.includes("--liftoff-only") ? ["--js-flags=--liftoff-only"] : [] });
const mib = (b) => Math.round(b / MiB * 10) / 10;
await page.exposeFunction("report", (round) => {
  const r = rendererMemory(browser).sort((a, b) => b.rss - a.rss)[0];
  console.log(JSON.stringify({ round, rss: mib(r.rss), peak: mib(r.peak), anon: mib(anonymous(r.pid)) }));
});
try {
  await page.evaluate(async (rounds) => {
    const { OrtTail, trainTail, parseTrainGraph, decodeTensors, makeRuntime, DEFAULT_TRAIN_CONFIG } = window.sdk;
    const graph = parseTrainGraph(new Uint8Array(await (await fetch("/steps/graph.bin")).arrayBuffer()));
    const state = decodeTensors(new Uint8Array(await (await fetch("/steps/state.bin")).arrayBuffer()));
    const { __x: x, __y: y } = state;
    const runtime = makeRuntime("onnxruntime-web", window.ort, 1);
    await window.report("start");
    for (let r = 0; r < rounds; r++) {
      await trainTail(new OrtTail(runtime, graph, 1), state, x, y, { ...DEFAULT_TRAIN_CONFIG, localSteps: 5, seed: r });
      await window.report(r);
    }
  }, Number(rounds));
} finally {
  await browser.close();
  await site.close();
}
