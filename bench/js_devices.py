"""The JavaScript device against the Python ONNX Runtime device (docs/js-device.md).

1. Conformance over every exportable split of the zoo models: the Python device exports the
   chunks, training graph, state and a batch and trains (edge_sdk_js/test/reference.py); the
   JavaScript SDK runs the same in onnxruntime-node, onnxruntime-web under Node and (where Debian's
   chromium is installed) a headless Chromium tab; the worst relative errors per runtime.
2. Speed and memory for one tail and batch (default ResNet20 split 7, batch 32): ms per local
   step after an untimed first round (`--warmup` steps: sessions, and WebAssembly's optimised code,
   which V8 compiles in the background while the first steps run on baseline code) and peak resident
   memory of the Python ORT device, the Node devices and the browser tab (its renderer process,
   sampled every 20 ms, with the largest reading of each phase), each in a fresh process, with
   ratios to the Python device; the same ONNX Runtime threads everywhere (`--threads`).
3. Runtime memory: a Node process and a Chromium renderer with ONNX Runtime loaded and one tiny
   session run (the planner's `onnxruntime-node` / `onnxruntime-web` entries), beside Python's.
4. Kernel profile (`--parts profile`, not run by default): ONNX Runtime's profiler on the timed
   tail's training graph (one batch, `--steps` runs after `--warmup`), Python's device settings
   against a Chromium tab, milliseconds per run by operator type (each node's median over the runs):
   where a tab's time goes.
5. Accuracy (`--parts accuracy`, not run by default: minutes per fleet): digits_mlp on six devices
   against one orchestrator, the same shards and server seed, as an all-Python fleet and as a mixed
   fleet (two Python devices, a moderate and a weak Node device, two Chromium tabs: a moderate one
   on WebGPU, a weak one on WebAssembly), for each of `--seeds`; the all-Python runs over the seeds
   give the workload's chance spread.
6. WebGPU (`--webgpu`, beside the parts run): a Chromium tab training on its GPU (onnxruntime-web's
   WebGPU build, the WebGPU backend): conformance rows, a speed row (`--gpu-steps` after
   `--gpu-warmup`, one run: each step is slow on a CPU emulation), its memory (renderer and GPU
   process) per phase and as a runtime, naming the adapter; and `--parts placements`: which of each
   graph's operators ONNX Runtime puts on WebAssembly, and why. Headless Chromium's adapter here is
   SwiftShader, a CPU emulation of a GPU: its times say nothing of a GPU's. On a machine with a GPU
   (Linux with Vulkan drivers), `--chromium-flags=--enable-features=Vulkan` may be needed for
   Chromium to pick it; the adapter the rows name says which ran.

    PYTHONPATH=. python bench/js_devices.py [--models digits_mlp,resnet20] [--steps 30] [--no-browser] [--webgpu]

Needs `npm ci` and `npm run build` in edge_sdk_js/ first (make test-js does both).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, interleave, parse_list  # noqa: E402

JS = ROOT / "edge_sdk_js"
MODELS = ("digits_mlp", "mnist_cnn", "leaf_cnn", "resnet20")

_PY_STEP = r"""
import json, re, sys, time
import numpy as np
from pathlib import Path
from edge_sdk.forward import multi_step_forward
from edge_sdk.ort_trainer import OrtTail, TrainGraph, train_tail_ort
from edge_sdk.protocol import decode_tensors
from edge_sdk.training import TrainConfig
folder, steps, warm, threads = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
hwm = lambda: int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024
s = json.loads((folder / "expected.json").read_text())
data = decode_tensors((folder / "data.bin").read_bytes())
state = decode_tensors((folder / "state.bin").read_bytes())
chunks = [(folder / f"chunk-{i}.onnx").read_bytes() for i in range(s["chunks"])]
x = np.asarray(data["x"])
if chunks:
    x = multi_step_forward(chunks, x, batch_size=s["train"]["batch_size"], threads=threads).array
y = np.asarray(data["y"])
tail = OrtTail(TrainGraph.from_bytes((folder / "graph.bin").read_bytes()), threads=threads)
cfg = dict(batch_size=s["train"]["batch_size"], lr=s["train"]["lr"], seed=1, eval_samples=s["train"]["batch_size"])
t0 = time.perf_counter()
train_tail_ort(tail, state, x, y, TrainConfig(local_steps=warm, **cfg))
first = (time.perf_counter() - t0) * 1000 / warm
t0 = time.perf_counter()
train_tail_ort(tail, state, x, y, TrainConfig(local_steps=steps, **cfg))
ms = (time.perf_counter() - t0) * 1000 / steps
print(json.dumps({"runtime": "python onnxruntime", "threads": threads, "msPerStep": ms, "firstRoundMsPerStep": first,
                  "peakRss": hwm()}))
"""

_PY_PROFILE = r"""
import collections, json, os, sys, tempfile
import numpy as np
import onnxruntime as ort
from pathlib import Path
from edge_sdk.forward import multi_step_forward
from edge_sdk.ort_trainer import TrainGraph
from edge_sdk.protocol import decode_tensors
folder, runs, warm = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
s = json.loads((folder / "expected.json").read_text())
batch = s["train"]["batch_size"]
data = decode_tensors((folder / "data.bin").read_bytes())
state = decode_tensors((folder / "state.bin").read_bytes())
chunks = [(folder / f"chunk-{i}.onnx").read_bytes() for i in range(s["chunks"])]
x = np.asarray(data["x"])
x = (multi_step_forward(chunks, x, batch_size=batch).array if chunks else x)[:batch]
graph = TrainGraph.from_bytes((folder / "graph.bin").read_bytes())
feeds = {"input": x, "target": np.asarray(data["y"])[:batch],
         **{n: np.asarray(state[n], dtype=np.float32) for n in (*graph.params, *graph.buffers)}}
durations = collections.defaultdict(list)
with tempfile.TemporaryDirectory() as tmp:
    for profiled in (False, True):
        options = ort.SessionOptions()  # the device's settings (edge_sdk.ort_trainer)
        options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
        options.execution_mode, options.enable_mem_pattern = ort.ExecutionMode.ORT_SEQUENTIAL, False
        options.enable_profiling, options.profile_file_prefix = profiled, os.path.join(tmp, "p")
        session = ort.InferenceSession(graph.train_onnx, options, providers=["CPUExecutionProvider"])
        for _ in range(runs if profiled else warm):
            session.run(None, feeds)
    for e in json.loads(Path(session.end_profiling()).read_text()):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            durations[(e["name"], e["args"]["op_name"])].append(e["dur"])
ms = collections.Counter()
for (_, op), us in durations.items():  # each node's median over the runs, summed by operator type
    ms[op] += sorted(us)[len(us) // 2] / 1000
print(json.dumps({"runtime": "python onnxruntime", "runs": runs, "warm": warm, "msPerOp": ms}))
"""

_PY_RUNTIME = r"""
import json, re
from pathlib import Path
import psutil
bare = psutil.Process().memory_info().rss
from edge_sdk.ort_trainer import warm_up
warm_up()
print(json.dumps({"runtime": "python onnxruntime", "bareRss": bare, "rss": psutil.Process().memory_info().rss,
                  "peakRss": int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024}))
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "EDGETRAIN_PYTHON": sys.executable}


def _json(cmd: list[str], extra_env: dict[str, str] | None = None, **kw) -> object:
    env = {**_env(), **(extra_env or {})}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=ROOT, **kw).stdout
    return json.loads(out.strip().splitlines()[-1])


def _cases(out: Path, cases: list[str], *extra: str) -> tuple[list[Path], list[dict]]:
    """Export and run the Python device on each case; (folders made, refused splits)."""
    lines = subprocess.run([sys.executable, str(JS / "test" / "reference.py"), "--out", str(out), *extra, *cases],
                           check=True, capture_output=True, text=True, env=_env(), cwd=ROOT).stdout.splitlines()
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    refused = [r for r in rows if "refused" in r]
    folders = [out / f"{r['model']}-{r['split']}" for r in rows if "refused" not in r]
    return folders, refused


def _splits(models: list[str]) -> list[str]:
    from edge_sdk.models.zoo import build_model

    return [f"{m}:{k}" for m in models for k in range(len(build_model(m)))]


def _conformance(args: argparse.Namespace, tmp: Path, run: list[str], browser: bool) -> dict[str, object]:
    """Every exportable split of the models, in every runtime."""
    if args.cases is not None:
        folders = sorted(p for p in args.cases.iterdir() if (p / "expected.json").exists())
        refused: list[dict] = []
    else:
        folders, refused = _cases(tmp / "conformance", _splits(args.models.split(",")))
    flags = [*(["--browser"] if browser else []), *(["--webgpu"] if browser and args.webgpu else [])]
    rows = _json([*run, "conformance", *map(str, folders), *flags], timeout=4 * 7200)
    return {"refused": refused, "conformance": rows}


def _speed(args: argparse.Namespace, tmp: Path, run: list[str], browser: bool) -> dict[str, object]:
    """ms per local step and peak memory on one tail, each runtime in fresh processes."""
    (case,), _ = _cases(tmp / "speed", [args.case], "--samples", str(args.samples), "--batch", str(args.batch))
    times = [str(args.steps), str(args.warmup), str(args.threads)]
    commands = [[sys.executable, "-c", _PY_STEP, str(case), *times]]
    commands += [[*run, "step", str(case), kind, *times] for kind in ("node", "web", *(["browser"] if browser else []))]
    env = {"EDGETRAIN_BENCH_CHROMIUM_FLAGS": args.chromium_flags}
    runs: list[list[dict]] = [[] for _ in commands]  # per runtime, its runs in the order they ran
    for _, i in interleave(range(len(commands)), args.repeats):  # every runtime once a repeat, the first rotating
        runs[i].append(_json(commands[i], extra_env=env))
    speed = [min(r, key=lambda row: row["msPerStep"]) for r in runs]
    for i, row in enumerate(speed):
        row["msPerStepRuns"] = [r["msPerStep"] for r in runs[i]]
    if browser and args.webgpu:  # one run of a few steps: on a CPU emulation each step takes seconds
        gpu = _json([*run, "step", str(case), "webgpu", str(args.gpu_steps), str(args.gpu_warmup), str(args.threads)],
                    extra_env=env, timeout=7200)
        speed.append({**gpu, "msPerStepRuns": [gpu["msPerStep"]]})
    for row in speed:
        row["timeRatio"] = row["msPerStep"] / speed[0]["msPerStep"]
        row["memoryRatio"] = row["peakRss"] / speed[0]["peakRss"]
    return {"case": args.case, "batch": args.batch, "samples": args.samples, "steps": args.steps,
            "warmup": args.warmup, "threads": args.threads, "chromium_flags": args.chromium_flags, "rows": speed,
            **({"gpu_steps": args.gpu_steps, "gpu_warmup": args.gpu_warmup} if browser and args.webgpu else {})}


def _placements(args: argparse.Namespace, tmp: Path, run: list[str]) -> list[dict]:
    """Which operators of each graph ONNX Runtime Web runs on WebAssembly beside WebGPU, and why."""
    if args.cases is not None:
        folders = sorted(p for p in args.cases.iterdir() if (p / "expected.json").exists())
    else:
        folders, _ = _cases(tmp / "placements", _splits(args.models.split(",")))
    return _json([*run, "placements", *map(str, folders)], timeout=7200)


def _profile(args: argparse.Namespace, tmp: Path, run: list[str]) -> dict[str, object]:
    """Kernel time per operator type of the timed tail's training graph: Python ORT against a tab."""
    (case,), _ = _cases(tmp / "profile", [args.case], "--samples", str(args.samples), "--batch", str(args.batch))
    runs = [str(args.steps), str(args.warmup)]
    rows = [_json([sys.executable, "-c", _PY_PROFILE, str(case), *runs]), _json([*run, "profile", str(case), *runs])]
    return {"case": args.case, "batch": args.batch, "runs": args.steps, "warm": args.warmup, "rows": rows}


def _accuracy(args: argparse.Namespace, browser: bool) -> dict[str, object]:
    """Final accuracy of an all-Python and a mixed fleet per seed, with the all-Python spread."""
    fleet = ["node", str(JS / "bench" / "fleet-accuracy.mjs")]
    runs = []
    for seed in parse_list(args.seeds):
        for kind in ("python", "mixed"):
            runs.append(_json([*fleet, kind, seed, str(args.rounds), *([] if browser else ["--no-browser"])], timeout=3600))
            print(json.dumps({k: runs[-1][k] for k in ("kind", "seed", "accuracy", "wall_s")}), flush=True)
    final = {(r["kind"], r["seed"]): r["accuracy"][-1] for r in runs}
    python = [v for (kind, _), v in final.items() if kind == "python"]
    gaps = [final[("mixed", s)] - final[("python", s)] for (kind, s) in final if kind == "python" and ("mixed", s) in final]
    return {"rounds": args.rounds, "runs": runs, "python_spread": max(python) - min(python),
            "mixed_minus_python": gaps}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--case", default="resnet20:7", help="the tail timed (model:split)")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=15,
                    help="speed: steps of the untimed first round (sessions; WebAssembly's optimised code tier)")
    ap.add_argument("--threads", type=int, default=1, help="speed: ONNX Runtime's threads in every runtime")
    ap.add_argument("--chromium-flags", default="",
                    help="speed: extra Chromium switches, for diagnosis only (a page cannot set them)")
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--webgpu", action="store_true",
                    help="also a Chromium tab training on its GPU (WebGPU): conformance, speed and memory rows")
    ap.add_argument("--gpu-steps", type=int, default=5, help="speed: timed steps of the WebGPU tab")
    ap.add_argument("--gpu-warmup", type=int, default=2, help="speed: steps of the WebGPU tab's untimed first round")
    ap.add_argument("--parts", default="conformance,speed,memory", help="which measurements to run")
    ap.add_argument("--cases", type=Path, default=None, help="reuse the conformance cases exported into this folder")
    ap.add_argument("--rounds", type=int, default=5, help="accuracy: rounds per fleet")


def run(ctx: Context) -> dict:
    args = ctx.args
    browser = not args.no_browser and any(Path(p).exists() for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser"))
    if not args.no_browser and not browser:
        print("chromium is not installed (apt-get install chromium): the browser tab is not measured")
    node = ["node", str(JS / "bench" / "run.mjs")]
    result: dict[str, object] = {"browser": browser}
    parts = set(parse_list(args.parts))
    with tempfile.TemporaryDirectory(prefix="edgetrain-js-bench-") as tmp:
        if "conformance" in parts:
            result.update(_conformance(args, Path(tmp), node, browser))
        if "speed" in parts:
            result["speed"] = _speed(args, Path(tmp), node, browser)
        if "profile" in parts and browser:
            result["profile"] = _profile(args, Path(tmp), node)
        if "placements" in parts and browser:
            result["placements"] = _placements(args, Path(tmp), node)
        if "memory" in parts:
            memory = [_json([sys.executable, "-c", _PY_RUNTIME])]
            for kind in ("node", "web", *(["browser"] if browser else []), *(["webgpu"] if browser and args.webgpu else [])):
                memory.append(_json([*node, "runtime", kind]))
            result["runtime_memory"] = memory
        if "accuracy" in parts:
            result["accuracy"] = _accuracy(args, browser)
    _print(result)
    speed = (result.get("speed") or {}).get("rows", [])
    runs = [{"part": "speed", "lane": row["runtime"], "repeat": i, "ms_per_step": ms}
            for row in speed for i, ms in enumerate(row["msPerStepRuns"])]
    runs += [{"part": "accuracy", **r} for r in (result.get("accuracy") or {}).get("runs", [])]
    return ctx.write(runs, result)


CASE = Case("js_devices", __doc__, run, arguments=arguments, repeats=3, seeds="0,1,2",
            quick={"models": "digits_mlp", "case": "digits_mlp:1", "steps": 3, "warmup": 1, "repeats": 1,
                   "parts": "conformance,speed", "no_browser": True})


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


def _print(result: dict) -> None:
    mib = 1 << 20
    worst: dict[str, dict[str, float]] = {}
    for row in result.get("conformance", []):
        w = worst.setdefault(row["runtime"], {})
        for key, value in row["err"].items():
            w[key] = max(w.get(key, 0.0), value)
    if "conformance" in result:
        refused = [f"{r['model']}:{r['split']}" for r in result["refused"]]
        print(f"conformance over {len(result['conformance'])} case-runtime pairs (refused splits: {refused})")
        for runtime, w in worst.items():
            print(f"  {runtime:28s} " + "  ".join(f"{k} {v:.2g}" for k, v in w.items()))
    if "speed" in result:
        s = result["speed"]
        print(f"speed, {s['case']} batch {s['batch']}, {s['steps']} steps after a first round of {s['warmup']}, "
              f"{s['threads']} thread(s)")
        for row in s["rows"]:
            print(f"  {row['runtime']:28s} {row['msPerStep']:8.2f} ms/step ({row['timeRatio']:.2f}x; first round "
                  f"{row['firstRoundMsPerStep']:.0f})  peak {row['peakRss'] / mib:7.1f} MiB ({row['memoryRatio']:.2f}x)"
                  + (f"  GPU process peak {row['gpuProcessPeak'] / mib:.1f} MiB" if "gpuProcessPeak" in row else "")
                  + (f"  adapter {_adapter(row['adapter'])}" if "adapter" in row else ""))
            for phase in row.get("phases", []):
                print(f"    {phase['name']:14s} largest {phase['maxRss'] / mib:7.1f} MiB, at its end {phase['rss'] / mib:7.1f} MiB"
                      f"; GPU process largest {phase.get('gpuMaxRss', 0) / mib:7.1f} MiB")
    if "profile" in result:
        _print_profile(result["profile"])
    if "placements" in result:
        _print_placements(result["placements"])
    if "accuracy" in result:
        a = result["accuracy"]
        print(f"accuracy after {a['rounds']} rounds: all-Python spread over seeds {a['python_spread']:.4f}, "
              f"mixed - all-Python per seed {[round(g, 4) for g in a['mixed_minus_python']]}")
    if "runtime_memory" in result:
        print("runtime memory (one tiny session run)")
        for row in result["runtime_memory"]:
            print(f"  {row['runtime']:36s} rss {row['rss'] / mib:7.1f} MiB  peak {row['peakRss'] / mib:7.1f} MiB"
                  + (f"  pss {row['pss'] / mib:7.1f} MiB  idle page {row['idleRendererRss'] / mib:7.1f} MiB" if "pss" in row else "")
                  + (f"  GPU process {row['gpuProcessIdleRss'] / mib:.1f} -> {row['gpuProcessRss'] / mib:.1f} MiB"
                     if "gpuProcessRss" in row else "")
                  + (f"  adapter {_adapter(row['adapter'])}" if "adapter" in row else ""))


def _adapter(adapter: dict | None) -> str:
    """The adapter a WebGPU row ran on, labelled where it is SwiftShader (a CPU emulation of a GPU)."""
    if not adapter:
        return "none"
    name = " ".join(v for v in (adapter.get("vendor"), adapter.get("architecture"), adapter.get("device")) if v)
    return f"{name} (SwiftShader: a CPU emulation, not a GPU's speed)" if adapter.get("architecture") == "swiftshader" else name


def _print_placements(rows: list[dict]) -> None:
    print("WebGPU placements: nodes on the GPU, and operators on WebAssembly (count: why)")
    for row in rows:
        for graph, p in row["graphs"].items():
            cpu = "; ".join(f"{op} {e['nodes']} ({', '.join(e['why'])})" for op, e in sorted(p["cpu"].items()))
            print(f"  {row['case']:16s} {graph:8s} GPU {p['gpu']:4d}  WebAssembly: {cpu or 'none'}")


def _print_profile(p: dict) -> None:
    python, tab = (row["msPerOp"] for row in p["rows"])
    top = sorted(tab, key=lambda op: -tab[op])[:6]
    rest = [op for op in set(tab) | set(python) if op not in top]
    print(f"kernel ms per run, {p['case']} batch {p['batch']} ({p['runs']} profiled runs after {p['warm']}), 1 thread")
    print(f"  {'operator':24s} {'tab':>8s} {'python':>8s} {'ratio':>6s}")
    groups = [(op, tab.get(op, 0.0), python.get(op, 0.0)) for op in top]
    groups.append(("other", sum(tab.get(op, 0.0) for op in rest), sum(python.get(op, 0.0) for op in rest)))
    groups.append(("all kernels", sum(tab.values()), sum(python.values())))
    for name, t, py in groups:
        print(f"  {name:24s} {t:8.1f} {py:8.1f} {t / py if py else float('inf'):6.2f}")


if __name__ == "__main__":
    main()
