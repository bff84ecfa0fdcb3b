"""Reference cases for the JavaScript device's conformance tests: what the Python ONNX Runtime
device computes, written to files the JavaScript tests read.

For each ``model:split`` (or ``model:split:adapters``: the tail trained through its LoRA adapters,
their B factors drawn away from zero so every adapter has a gradient) it writes, into
``<out>/<model>-<split>[-adapters]/``:

- ``chunk-<i>.onnx``: the frozen blocks [0, split) as ONNX chunks (none at split 0);
- ``graph.bin``: the tail's training-graph payload (docs/protocol.md, "Training graphs");
- ``state.bin``: the tail's state as a ``model`` payload (``encode_tensors``);
- ``data.bin``: the device's raw samples ``x`` and labels ``y`` (``encode_tensors``);
- ``plan.bin``: the sample plan the Python device drew (``eval``, ``batch:<t>``);
- ``expected.bin``: the activations at the split, the first step's gradients and new buffers
  (``grad:<name>``, ``new:<name>``) and the deltas after tau steps (``delta:<name>``);
- ``expected.json``: the losses, the evaluation metrics and the training settings.

    PYTHONPATH=. python edge_sdk_js/test/reference.py --out /tmp/cases digits_mlp:2 resnet20:7
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from edge_sdk.forward import multi_step_forward
from edge_sdk.ort_trainer import OrtTail, TrainGraph, evaluate_tail_ort, train_tail_ort
from edge_sdk.protocol import encode_tensors
from edge_sdk.training import TrainConfig, sample_plan


def write_case(out: Path, name: str, split: int, *, samples: int, steps: int, batch: int, seed: int,
               lr: float = 0.05, adapters: bool = False, graph_cache: Path | None = None) -> dict:
    """Export one model split and run the Python device on it; returns the case's summary.

    ``graph_cache``: a training-graph folder (``exporters.train_export.TrainGraphCache``, the one the
    Python tests keep under pytest's cache): a graph exported and verified there before is read, not
    exported again (a graph depends on the architecture and split, not the weights)."""
    import torch

    from edge_sdk.models.zoo import build_model
    from exporters.bundle import tail_arrays
    from exporters.onnx_export import export_chunk
    from exporters.train_export import TrainGraphCache, export_train_graph

    started = time.monotonic()
    model = build_model(name, seed=0)
    if adapters:
        with torch.no_grad():
            for n, param in model.named_parameters():
                if n.endswith(".lora_b"):
                    param.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(seed))
    folder = out / f"{name}-{split}{'-adapters' if adapters else ''}"
    folder.mkdir(parents=True, exist_ok=True)
    chunks = []
    if split > 0:
        chunks.append(export_chunk(model, 0, split))
        (folder / "chunk-0.onnx").write_bytes(chunks[0])
    if graph_cache is not None:
        graph_bytes = TrainGraphCache(graph_cache).get_or_export(model, split, adapters)[1]
    else:
        graph_bytes = export_train_graph(model, split, adapters=adapters)
    (folder / "graph.bin").write_bytes(graph_bytes)
    state = tail_arrays(model, split)
    (folder / "state.bin").write_bytes(encode_tensors(state))
    g = torch.Generator().manual_seed(seed)
    x = model.sample_input(samples, generator=g).numpy()
    y = np.random.default_rng(seed).integers(0, model.num_outputs, samples).astype(np.int64)
    (folder / "data.bin").write_bytes(encode_tensors({"x": x, "y": y}))

    acts = multi_step_forward(chunks, x, batch_size=batch).array if chunks else x
    config = TrainConfig(local_steps=steps, batch_size=batch, lr=lr, momentum=0.9, weight_decay=1e-4, seed=seed,
                         eval_samples=batch)
    eval_idx, batches = sample_plan(len(x), config)
    plan = {"eval": eval_idx.astype(np.int64), **{f"batch:{t}": b.astype(np.int64) for t, b in enumerate(batches)}}
    (folder / "plan.bin").write_bytes(encode_tensors(plan))

    graph = TrainGraph.from_bytes(graph_bytes)
    tail = OrtTail(graph)
    loss, grads, new = tail.step(acts[batches[0]], y[batches[0]], state)
    result = train_tail_ort(OrtTail(graph), state, acts, y, config)
    eval_config = TrainConfig(batch_size=batch, seed=seed, eval_samples=512)
    metrics = evaluate_tail_ort(OrtTail(graph), state, acts, y, eval_config)
    expected = {"activations": np.ascontiguousarray(acts, np.float32),
                **{f"grad:{n}": v for n, v in grads.items()}, **{f"new:{n}": v for n, v in new.items()},
                **{f"delta:{n}": v for n, v in result.deltas.items()}}
    (folder / "expected.bin").write_bytes(encode_tensors(expected))
    summary = {"model": name, "split": split, "adapters": adapters, "chunks": len(chunks), "samples": samples,
               "step_loss": loss, "loss_before": result.loss_before, "loss_after": result.loss_after,
               "eval": metrics, "eval_seed": seed, "eval_samples": 512,
               "train": {"local_steps": steps, "batch_size": batch, "lr": config.lr, "momentum": config.momentum,
                         "weight_decay": config.weight_decay, "seed": seed, "eval_samples": config.eval_samples},
               "export_s": round(time.monotonic() - started, 2)}
    (folder / "expected.json").write_text(json.dumps(summary, indent=1))
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", help="model:split, e.g. digits_mlp:2")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=96)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--graph-cache", type=Path, default=os.environ.get("EDGETRAIN_TRAIN_GRAPH_CACHE") or None,
                    help="training-graph cache folder (default $EDGETRAIN_TRAIN_GRAPH_CACHE; none: export each)")
    args = ap.parse_args()
    from exporters.onnx_export import ExportError

    for case in args.cases:
        name, _, rest = case.partition(":")
        split, _, how = rest.partition(":")
        if how not in ("", "adapters"):
            raise SystemExit(f"{case}: expected model:split or model:split:adapters")
        try:
            summary = write_case(args.out, name, int(split), samples=args.samples, steps=args.steps,
                                 batch=args.batch, seed=args.seed, lr=args.lr, adapters=how == "adapters",
                                 graph_cache=args.graph_cache)
        except ExportError as exc:  # the server would not ship this split to a device without torch
            print(json.dumps({"model": name, "split": int(split), "refused": str(exc)[:300]}), flush=True)
            continue
        print(json.dumps({k: summary[k] for k in ("model", "split", "adapters", "step_loss", "loss_after", "export_s")}),
              flush=True)


if __name__ == "__main__":
    main()
