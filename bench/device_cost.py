"""Device-side cost per role: EmbracingFL's layer split against width reduction (EmbracingFL Table 8).

For ResNet20 on one CIFAR-10 batch of 32, per role (strong, moderate, weak) and training backend,
the forward time, the backward time and the peak memory of a device process:

- **EmbracingFL** (partial training by layers): the strong device trains the whole model (split 0),
  the moderate and the weak device freeze the input-side blocks and train blocks [split, 11)
  (``--splits``, default the paper's 4 and 7, capacity 0.45 / 0.17 against Table 1's 0.42 / 0.16).
  The frozen prefix runs in ONNX Runtime as the device runs it (edge_sdk.forward.ChunkRunner on the
  chunk the server exports): a device runs it once per round over its local data and then trains
  on the cached activations, so per batch it costs one prefix forward ("prefix", the counterpart
  of the paper's I/O column: the extra work of the multi-step forward pass), beside the tail's
  forward and backward.
- **Width reduction** (static HeteroFL / FjORD): every device trains the whole depth at width ratio
  1.0 / 0.45 / 0.2 (appendix 6.4), built by the zoo (``build_model("resnet20", width=...)``).

Each configuration runs in a fresh Python process (``--worker``), so its peak RSS (VmHWM) is that
configuration's own: the device's modules (edge_sdk.client), its training runtime, the prefix
session, the tail and one batch. Backends:

- ``torch``: the device's torch trainer (edge_sdk.trainer.build_tail / load_tail_state, its
  MomentumSGD); forward = the tail's train-mode forward and loss, backward = ``loss.backward()``,
  update = the SGD step, each timed on its own.
- ``onnxruntime``: the tail's training graph (exporters.train_export: exported and verified
  against torch autograd; edge_sdk.ort_trainer.OrtTail), in a process that never imports torch.
  The graph computes forward and backward in one run, so the step (forward + backward) is timed,
  the forward is the evaluation graph's run on the same batch (the same convolutions; BatchNorm on
  running statistics instead of batch statistics) and backward = step - forward. A tail whose
  graph the export check refuses is still timed (its cost does not depend on the check) and marked
  refused with the reason: no device is ever sent it.

Times are medians over ``--iters`` batches after ``--warmup`` (the paper averages 10), one thread
(``--threads``), measured as the CPU time of the computing thread (robust to other jobs on the
machine; the wall times are in the JSON too). Peak memory is per batch, as the paper's timings
are: a real EmbracingFL device also holds its local data's cached activations (on disk for an
ONNX Runtime device, edge_sdk.forward.take_rows), which bench/memory_ratio.py measures. Not a test: run it on a quiet machine,
``python bench/device_cost.py [--iters 10] [--backends torch,onnxruntime] [--data-root DIR]``.
Writes ``bench/results/device_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, interleave, parse_list  # noqa: E402

MiB = float(1 << 20)
ROLES = ("strong", "moderate", "weak")
METHODS = ("embracingfl", "width")
#: EmbracingFL appendix 6.4 / Table 10: the width ratios of width reduction's roles.
WIDTHS = {"strong": 1.0, "moderate": 0.45, "weak": 0.2}
#: EmbracingFL Table 1's moderate and weak ResNet20 models (this repo's profiles/accounting test).
SPLITS = {"strong": 0, "moderate": 4, "weak": 7}
BATCH = 32

#: EmbracingFL Table 8 (OnePlus 9 Pro, MNN, batch 32, ms): per role, EmbracingFL's feed-forward
#: computation, I/O and end-to-end, its backpropagation, and width reduction's feed-forward and
#: backpropagation. The paper reports no memory.
PAPER = {
    "strong": {"efl_fwd": 2095.4, "efl_io": 0.0, "efl_fwd_total": 2095.4, "efl_bwd": 419643.8,
               "width_fwd": 2010.7, "width_bwd": 421047.5},
    "moderate": {"efl_fwd": 2095.4, "efl_io": 678.4, "efl_fwd_total": 2773.8, "efl_bwd": 197265.0,
                 "width_fwd": 1431.0, "width_bwd": 317669.7},
    "weak": {"efl_fwd": 2095.4, "efl_io": 1316.8, "efl_fwd_total": 3412.2, "efl_bwd": 85448.3,
             "width_fwd": 936.7, "width_bwd": 187580.4},
}


# -- the device process ---------------------------------------------------------------------------
def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _median_ms(values: list[float]) -> float:
    return 1000 * statistics.median(values)


class _Clock:
    """Wall time and this thread's CPU time. With one intra-op thread both runtimes compute in the
    calling thread, so its CPU time is the computation, even on a machine other jobs load."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float]] = []

    def mark(self) -> None:
        self.marks.append((time.perf_counter(), time.thread_time()))

    def spans(self) -> list[tuple[float, float]]:
        """(wall, cpu) of each interval between consecutive marks."""
        return [(b[0] - a[0], b[1] - a[1]) for a, b in zip(self.marks, self.marks[1:])]


def worker(spec: dict) -> dict:
    """One configuration in this (fresh) process; returns its timings and memory."""
    import numpy as np

    import edge_sdk.client  # noqa: F401  (what a device process holds: its modules and their imports)
    from edge_sdk.memory import release_memory, tune_allocator
    from edge_sdk.protocol import decode_tensors

    tune_allocator()
    backend, split, threads = spec["backend"], int(spec["split"]), int(spec["threads"])
    iters, warmup = int(spec["iters"]), int(spec["warmup"])
    if backend == "torch":
        import torch

        from edge_sdk.trainer import MomentumSGD, build_tail, load_tail_state

        torch.set_num_threads(threads)
    else:
        from edge_sdk.ort_trainer import OrtTail, TrainGraph
    # The runtime, as profiles.runtime counts it: the libraries loaded and warmed up (a first ONNX
    # Runtime session, a first torch training step: what they keep stays for the process's life),
    # before any model or data. ONNX Runtime is part of it when the device runs a prefix or a graph.
    if split > 0 or backend == "onnxruntime":
        from edge_sdk.forward import warm_up as ort_warm_up

        ort_warm_up(threads)
    if backend == "torch":
        from edge_sdk.trainer import warm_up as torch_warm_up

        torch_warm_up()
    out: dict = {"runtime_rss_bytes": _vm("VmRSS")}
    data = np.load(spec["batch"])
    x, y = np.ascontiguousarray(data["x"]), np.ascontiguousarray(data["y"])
    h = x
    if split > 0:  # the frozen prefix, in ONNX Runtime, as the device runs its chunks
        from edge_sdk.forward import ChunkRunner

        t = time.perf_counter()
        runner = ChunkRunner(Path(spec["chunk"]).read_bytes(), threads=threads)
        out["prefix_open_ms"] = 1000 * (time.perf_counter() - t)
        times = []
        for i in range(warmup + iters):
            clock = _Clock()
            clock.mark()
            h = runner.run(x)
            clock.mark()
            if i >= warmup:
                times.append(clock.spans()[0])
        out["prefix_ms"] = _median_ms([c for _, c in times])
        out["prefix_wall_ms"] = _median_ms([w for w, _ in times])
        runner.close()
        del runner
        release_memory()
    state = decode_tensors(Path(spec["state"]).read_bytes())
    fwd, bwd, upd = [], [], []
    if backend == "torch":
        tail = build_tail("resnet20", split, width=float(spec["width"]))
        load_tail_state(tail, split, state)
        tail.train()
        params = [p for i in range(split, len(tail)) for p in tail.block(i).parameters()]
        sgd = MomentumSGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4)
        hb, yb = torch.from_numpy(h), torch.from_numpy(y)
        for i in range(warmup + iters):
            sgd.zero_grad()
            clock = _Clock()
            clock.mark()
            loss = tail.loss(tail(hb, start=split), yb)
            clock.mark()
            loss.backward()
            clock.mark()
            sgd.step()
            clock.mark()
            if i >= warmup:
                f, b, u = clock.spans()
                fwd.append(f)
                bwd.append(b)
                upd.append(u)
        out["update_ms"] = _median_ms([c for _, c in upd])
        out["torch_loaded"] = True
    else:
        t = time.perf_counter()
        tail = OrtTail(TrainGraph.from_bytes(Path(spec["graph"]).read_bytes()), threads=threads)
        out["graph_open_ms"] = 1000 * (time.perf_counter() - t)
        weights = {n: np.array(state[n], dtype=np.float32) for n in tail.names}
        steps = []
        for i in range(warmup + iters):
            clock = _Clock()
            clock.mark()
            tail.forward(h, weights)
            clock.mark()
            tail.step(h, y, weights)
            clock.mark()
            if i >= warmup:
                f, st = clock.spans()
                fwd.append(f)
                steps.append(st)
        out["step_ms"] = _median_ms([c for _, c in steps])
        out["step_wall_ms"] = _median_ms([w for w, _ in steps])
        out["torch_loaded"] = "torch" in sys.modules
    out["forward_ms"] = _median_ms([c for _, c in fwd])
    out["forward_wall_ms"] = _median_ms([w for w, _ in fwd])
    if backend == "torch":
        out["backward_ms"] = _median_ms([c for _, c in bwd])
        out["backward_wall_ms"] = _median_ms([w for w, _ in bwd])
    else:  # the graph runs forward and backward at once: backward is the step less the forward
        out["backward_ms"] = out["step_ms"] - out["forward_ms"]
        out["backward_wall_ms"] = out["step_wall_ms"] - out["forward_wall_ms"]
    out["peak_rss_bytes"] = _vm("VmHWM")
    return out


# -- the parent: artifacts, one process per configuration, the tables ------------------------------
def _batch(data_root: str | None) -> tuple[object, object, str]:
    """32 CIFAR-10 training images and labels (random ones if the dataset is not there)."""
    import numpy as np

    from edge_sdk.data import DatasetUnavailable, load_dataset

    try:
        d = load_dataset("cifar10", root=data_root, split="train", limit=BATCH)
        return np.asarray(d.x[:BATCH], np.float32), np.asarray(d.y[:BATCH], np.int64), "cifar10"
    except DatasetUnavailable:
        rng = np.random.default_rng(0)
        return (rng.standard_normal((BATCH, 3, 32, 32), dtype=np.float32), rng.integers(0, 10, BATCH),
                "random (CIFAR-10 not found)")


def prepare(tmp: Path, backends: list[str], splits: dict[str, int], console, data_root: str | None = None
            ) -> tuple[list[dict], str]:
    """Per configuration, the files its device process reads: the batch, the tail's state, the
    prefix chunk (EmbracingFL) and the training graph (onnxruntime), and the graph's verdict."""
    import numpy as np

    from bench.memory_ratio import GRAPH_DIR
    from edge_sdk.models.zoo import build_model
    from edge_sdk.protocol import encode_tensors
    from edge_sdk.trainer import tail_state
    from exporters.onnx_export import ExportError, export_chunk
    from exporters.train_export import TrainGraphCache, export_train_graph

    cache = TrainGraphCache(GRAPH_DIR)
    x, y, source = _batch(data_root)
    np.savez(tmp / "batch.npz", x=x, y=y)
    configs = []
    for method in METHODS:
        for role in ROLES:
            width = WIDTHS[role] if method == "width" else 1.0
            split = splits[role] if method == "embracingfl" else 0
            if method == "width" and role == "strong":
                continue  # the same configuration as EmbracingFL's strong device (whole model, full width)
            model = build_model("resnet20", seed=0, width=width)
            tag = f"{method}-{role}"
            spec = {"method": method, "role": role, "split": split, "width": width, "batch": str(tmp / "batch.npz"),
                    "state": str(tmp / f"{tag}.state"), "capacity": None,
                    "params_trained": sum(p.numel() for i in range(split, len(model))
                                          for p in model.block(i).parameters())}
            (tmp / f"{tag}.state").write_bytes(encode_tensors(tail_state(model, split)))
            if split > 0:
                (tmp / f"{tag}.chunk").write_bytes(export_chunk(model, 0, split))
                spec["chunk"] = str(tmp / f"{tag}.chunk")
            if "onnxruntime" in backends:
                console.print(f"  training graph of {tag} (split {split}, width {width})")
                try:
                    _, data = cache.get_or_export(model, split)
                    spec["graph_refused"] = None
                except ExportError as exc:
                    spec["graph_refused"] = str(exc)
                    data = export_train_graph(model, split, verify=False)  # timed anyway, never shipped
                (tmp / f"{tag}.graph").write_bytes(data)
                spec["graph"] = str(tmp / f"{tag}.graph")
            configs.append(spec)
    return configs, source


def run_worker(spec: dict, timeout_s: float) -> dict:
    """``spec`` in a fresh process; its JSON result, or an error."""
    from emulator.localfleet import device_env

    env = device_env()  # one thread per library, as the emulated devices run
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
                          capture_output=True, text=True, timeout=timeout_s, env=env, cwd=str(ROOT))
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"rc {proc.returncode}"]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.1f}")


def rows_for(results: list[dict], backend: str) -> dict[tuple[str, str], dict]:
    out = {}
    for r in results:
        if r["backend"] == backend:
            out[(r["method"], r["role"])] = r
    # Width reduction's strong device is EmbracingFL's (whole model, full width).
    if ("embracingfl", "strong") in out:
        out[("width", "strong")] = out[("embracingfl", "strong")]
    return out


def markdown_tables(results: list[dict], backends: list[str]) -> list[str]:
    """Per backend, the paper's Table 8 shape (feed-forward and backpropagation per role, EmbracingFL
    against width reduction) with the paper's figures beside ours, and the peak RSS per role."""
    lines: list[str] = []
    for backend in backends:
        rows = rows_for(results, backend)
        lines += [f"**Backend {backend}** (ms per batch of 32, CPU time of the computing thread; paper: OnePlus 9 Pro, MNN)",
                  "",
                  "| workload | role | EFL split | EFL tail | EFL prefix (ORT) | EFL end-to-end | paper EFL comp. / I/O / e2e "
                  "| width ratio | width red. | paper width red. | width / EFL (ours) | width / EFL (paper) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for workload, key in (("feed-forward", "forward_ms"), ("backpropagation", "backward_ms")):
            for role in ROLES:
                e, w, p = rows.get(("embracingfl", role), {}), rows.get(("width", role), {}), PAPER[role]
                if workload == "feed-forward":
                    prefix = e.get("prefix_ms", 0.0) if e.get(key) is not None else None
                    e2e = None if e.get(key) is None else e[key] + (prefix or 0.0)
                    paper_e = f"{p['efl_fwd']:,.0f} / {p['efl_io']:,.0f} / {p['efl_fwd_total']:,.0f}"
                    paper_w, paper_ratio = p["width_fwd"], p["width_fwd"] / p["efl_fwd_total"]
                else:
                    prefix, e2e = None, e.get(key)
                    paper_e = f"{p['efl_bwd']:,.0f}"
                    paper_w, paper_ratio = p["width_bwd"], p["width_bwd"] / p["efl_bwd"]
                ratio = (w[key] / e2e) if w.get(key) is not None and e2e else None
                lines.append(f"| {workload} | {role} | {e.get('split', '-')} | {_ms(e.get(key))} | "
                             f"{'-' if prefix is None else _ms(prefix)} | {_ms(e2e)} | {paper_e} | {w.get('width', '-')} | "
                             f"{_ms(w.get(key))} | {paper_w:,.0f} | {'-' if ratio is None else f'{ratio:.2f}'} | "
                             f"{paper_ratio:.2f} |")
        for role in ROLES:
            e, w = rows.get(("embracingfl", role), {}), rows.get(("width", role), {})

            def peak(r: dict) -> str:
                if r.get("peak_rss_bytes") is None:
                    return "-"
                return f"{r['peak_rss_bytes'] / MiB:.0f} (+{(r['peak_rss_bytes'] - r['runtime_rss_bytes']) / MiB:.0f})"

            lines.append(f"| peak RSS MiB (+ above runtime) | {role} | {e.get('split', '-')} | {peak(e)} | | | | "
                         f"{w.get('width', '-')} | {peak(w)} | | | |")
        notes = []
        for r in results:
            if r["backend"] == backend and r.get("graph_refused"):
                notes.append(f"{r['method']} {r['role']}: training graph refused by the export check, timed anyway "
                             f"({r['graph_refused'].split(': ', 1)[-1][:140]})")
            if r["backend"] == backend and r.get("error"):
                notes.append(f"{r['method']} {r['role']}: failed: {r['error']}")
        lines += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    return lines


def check(results: list[dict], backends: list[str]) -> dict[str, dict]:
    """The issue's check: weak devices' backward time and peak memory far below strong devices'."""
    out = {}
    for backend in backends:
        rows = rows_for(results, backend)
        for method in METHODS:
            s, w = rows.get((method, "strong"), {}), rows.get((method, "weak"), {})
            if s.get("backward_ms") and w.get("backward_ms"):
                out[f"{backend}/{method}"] = {
                    "weak_over_strong_backward": w["backward_ms"] / s["backward_ms"],
                    "weak_over_strong_peak_rss": w["peak_rss_bytes"] / s["peak_rss_bytes"],
                    "weak_over_strong_peak_above_runtime":
                        (w["peak_rss_bytes"] - w["runtime_rss_bytes"]) / (s["peak_rss_bytes"] - s["runtime_rss_bytes"]),
                }
    return out


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--backends", default="torch,onnxruntime", help="comma-separated: torch, onnxruntime")
    ap.add_argument("--iters", type=int, default=10, help="timed batches per configuration (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed batches first")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads of every runtime")
    ap.add_argument("--splits", default="4,7", help="EmbracingFL's moderate and weak splits")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per device process")


def run(ctx: Context) -> dict | None:
    args, ap = ctx.args, ctx.parser
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return None
    from rich.console import Console

    console = Console(width=200)
    backends = parse_list(args.backends)
    if not backends or set(backends) - {"torch", "onnxruntime"}:
        ap.error("--backends: torch and/or onnxruntime")
    moderate, weak = parse_list(args.splits, int)
    splits = {"strong": 0, "moderate": moderate, "weak": weak}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        console.print("exporting prefixes and training graphs (verified against torch)")
        configs, source = prepare(Path(tmp), backends, splits, console, args.data_root)
        for i, backend in interleave(backends, len(configs)):  # a configuration's backends side by side
            spec = configs[i]
            one = {**spec, "backend": backend, "iters": args.iters, "warmup": args.warmup, "threads": args.threads}
            console.print(f"  {spec['method']} {spec['role']} (split {spec['split']}, width {spec['width']}) on {backend}")
            res = run_worker(one, args.timeout)
            results.append({k: v for k, v in one.items() if k not in ("batch", "state", "chunk", "graph")} | res)
    for line in markdown_tables(results, backends):
        print(line)
    verdict = check(results, backends)
    for key, v in verdict.items():
        console.print(f"{key}: weak / strong backward {v['weak_over_strong_backward']:.2f}, peak RSS "
                      f"{v['weak_over_strong_peak_rss']:.2f} (above the runtime {v['weak_over_strong_peak_above_runtime']:.2f})")
    return ctx.write(results, {"model": "resnet20", "batch": BATCH, "data": source, "splits": splits, "widths": WIDTHS,
                               "check": verdict, "paper_table8_ms": PAPER})


CASE = Case("device_cost", __doc__, run, arguments=arguments, data_root=True,
            quick={"backends": "torch", "iters": 1, "warmup": 0})


def main(argv: list[str] | None = None) -> dict | None:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
