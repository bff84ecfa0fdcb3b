"""Where the runtimes' one-step gradients differ: ReLU inputs within float32 rounding of zero.

For each ResNet20 split, the conformance case's first batch (edge_sdk_js/test/reference.py: 96
samples from seed 3, batch 16, the activations from the exported chunk) runs one training step in
Python ONNX Runtime, onnxruntime-node and onnxruntime-web (under Node), and with ``--runtimes
...,webgpu`` on a Chromium tab's GPU (onnxruntime-web's WebGPU build), with every ``Relu`` output
added to the graph's outputs. Each runtime's gradients are compared with float64 torch autograd
twice: with float64's own side at every ReLU, and with the runtime's own side where the float64
input is within float32 rounding of zero (the export check's rule, exporters.train_export). Also
counted: ReLU units where each JavaScript runtime and Python ONNX Runtime take different sides.

    PYTHONPATH=. python bench/relu_sides.py [--splits 0,1,2,3,4,5,6,7,8,9,10] [--runtimes node,web,webgpu]

Needs `npm ci` and `npm run build` in edge_sdk_js/ (make test-js does both). Results in
bench/results/relu_sides.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

from bench.harness import Case, Context, parse_list  # noqa: E402
from edge_sdk.forward import multi_step_forward  # noqa: E402
from edge_sdk.models import build_model  # noqa: E402
from edge_sdk.protocol import decode_tensors, encode_tensors  # noqa: E402
from edge_sdk.training import TrainConfig, sample_plan  # noqa: E402
from exporters.onnx_export import export_chunk  # noqa: E402
from exporters.train_export import ReluSides, TrainGraphCache, state_name, tail_names, task_loss, torch_step  # noqa: E402


def _batch(model, split: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The conformance case's first training batch at the split (as reference.py draws it)."""
    g = torch.Generator().manual_seed(3)
    xs = model.sample_input(96, generator=g).numpy()
    ys = np.random.default_rng(3).integers(0, model.num_outputs, 96).astype(np.int64)
    acts = multi_step_forward([export_chunk(model, 0, split)], xs, batch_size=16).array if split else xs
    config = TrainConfig(local_steps=5, batch_size=16, lr=0.05, momentum=0.9, weight_decay=1e-4, seed=3, eval_samples=16)
    first = sample_plan(96, config)[1][0]
    return torch.from_numpy(np.ascontiguousarray(acts[first])), torch.from_numpy(ys[first])


def _run(folder: Path, proto: onnx.ModelProto, feed: dict[str, np.ndarray],
         kinds: tuple[str, ...] = ("node", "web")) -> dict[str, dict[str, np.ndarray]]:
    (folder / "graph.onnx").write_bytes(proto.SerializeToString())
    (folder / "feed.bin").write_bytes(encode_tensors(feed))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = {"python": dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))}
    for kind in kinds:
        subprocess.run(["node", str(ROOT / "edge_sdk_js" / "bench" / "graph-run.mjs"), str(folder), kind], check=True)
        outs[kind] = {k: np.asarray(v.data).reshape(v.shape)
                      for k, v in decode_tensors((folder / f"out-{kind}.bin").read_bytes()).items()}
    return outs


def measure(model, split: int, cache: TrainGraphCache, folder: Path, kinds: tuple[str, ...] = ("node", "web")) -> dict:
    from edge_sdk.ort_trainer import TrainGraph

    graph = TrainGraph.from_bytes(cache.get_or_export(model, split)[1])
    proto = onnx.load_from_string(graph.train_onnx)
    relus = [n.output[0] for n in proto.graph.node if n.op_type == "Relu"]
    proto.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in relus)
    x, y = _batch(model, split)
    tail = model.chunk(split, len(model))
    params, buffers = tail_names(tail)
    named = dict(tail.named_parameters()) | dict(tail.named_buffers())
    feed = {"input": x.numpy(), "target": y.numpy(),
            **{state_name(model, split, n): named[n].detach().numpy().copy() for n in params + buffers}}
    outs = _run(folder, proto, feed, kinds)
    loss = lambda o, t: task_loss(model.task, o, t)  # noqa: E731
    with ReluSides() as float32:
        torch_step(copy.deepcopy(tail), loss, x, y, params, [])

    def reference(sides: ReluSides) -> dict[str, np.ndarray]:
        with sides:
            return torch_step(copy.deepcopy(tail).double(), loss, x.double(), y, params, [])

    def worst(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
        return max(float(np.abs(got["grad:" + state_name(model, split, n)] - ref["grad:" + n]).max())
                   / max(1.0, float(np.abs(ref["grad:" + n]).max())) for n in params)

    own = reference(ReluSides())
    row: dict = {"split": split, "relu_units": int(sum(outs["python"][r].size for r in relus))}
    for runtime, got in outs.items():
        sides = ReluSides([got[r] for r in relus], float32.inputs)
        row[runtime] = {"float64_sides": worst(got, own), "own_sides": worst(got, reference(sides)),
                        "sides_taken": sides.taken}
    for kind in kinds:
        row[f"{kind}_python_side_differences"] = int(sum(((outs[kind][r] > 0) != (outs["python"][r] > 0)).sum()
                                                         for r in relus))
    return row


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--splits", default="0,1,2,3,4,5,6,7,8,9,10")
    ap.add_argument("--runtimes", default="node,web",
                    help="JavaScript runtimes beside Python: node, web (under Node), webgpu (a Chromium tab's GPU)")


def run(ctx: Context) -> dict:
    model = build_model("resnet20", seed=0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="relu-sides-") as tmp:
        cache = TrainGraphCache(Path(tmp) / "graphs")
        for split in parse_list(ctx.args.splits, int):
            folder = Path(tmp) / f"s{split}"
            folder.mkdir()
            rows.append(measure(model, split, cache, folder, tuple(parse_list(ctx.args.runtimes))))
            print(json.dumps(rows[-1]), flush=True)
    return ctx.write(rows, {"model": "resnet20"})


CASE = Case("relu_sides", __doc__, run, arguments=arguments, quick={"splits": "9"})


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
