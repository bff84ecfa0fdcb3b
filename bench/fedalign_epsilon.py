"""Choose FedALIGN's epsilon as its paper does: try a small grid and keep the value that does best on
the priority devices' held-out data (FedALIGN Section 4: the selection parameter "was set" per
dataset after trying values; Section 3.1 allows a constant or a per-round epsilon).

For every grid value, every priority choice of the task (or ``--choices``) and every seed, FedALIGN
runs through the real orchestrator and devices (``bench/prioritized_runner.py``) with a validation
part of the priority devices' data kept off the devices, and the final model is scored on it
(``bench/prioritized_tasks.py``, ``held_out="validation"``): the test data the benchmarks report
is never seen. Grid values: ``rel:c`` (epsilon_t = c F(w_t), the ``relative_epsilon`` option) and
``abs:e`` (a constant loss gap, the ``epsilon`` option; ``abs:inf`` is FedAvg on all, ``abs:0``
FedAvg on the priority devices). The chosen value is the best mean over choices and seeds.

Writes ``bench/results/fedalign-epsilon-<task>.json`` and prints the table and the chosen value.

Usage: ``python bench/fedalign_epsilon.py --task tcga [--grid rel:0.05,rel:0.1,abs:0.5] [--seeds 0]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import platform
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.prioritized_runner import run_algorithm  # noqa: E402
from bench.prioritized_tasks import add_task_arguments, choices, instance  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_GRID = "rel:0.02,rel:0.05,rel:0.1,rel:0.2,rel:0.5,abs:0.1,abs:0.5"


def parse_grid(text: str) -> list[tuple[str, float]]:
    """``rel:0.1,abs:0.5`` -> [("relative_epsilon", 0.1), ("epsilon", 0.5)]."""
    out = []
    for item in text.split(","):
        form, _, value = item.strip().partition(":")
        if form not in ("rel", "abs") or not value:
            raise ValueError(f"a grid value is rel:<c> or abs:<gap>, got {item!r}")
        out.append(("relative_epsilon" if form == "rel" else "epsilon", float(value)))
    return out


def label(option: str, value: float) -> str:
    return f"{'rel' if option == 'relative_epsilon' else 'abs'}:{value:g}"


async def grid_search(args: argparse.Namespace) -> dict:
    grid = parse_grid(args.grid)
    scores: dict[str, list[float]] = {label(o, v): [] for o, v in grid}
    per_choice: dict[str, dict[str, list[float]]] = {}
    with TemporaryDirectory() as tmp:
        for choice in args.choices or choices(args.task, args):
            for seed in args.seeds:
                inst = instance(args.task, choice, seed, "validation", args)
                for option, value in grid:
                    opts = {"warmup": args.warmup, "eval_samples": args.eval_samples, option: value}
                    run = await run_algorithm("fedalign", inst.devices, inst.training, opts, seed,
                                              Path(tmp) / f"{choice}-{seed}-{label(option, value)}", inst.scorer)
                    key = label(option, value)
                    scores[key].append(run["final"])
                    per_choice.setdefault(choice, {}).setdefault(key, []).append(run["final"])
                    print(f"{choice:24s} seed {seed} {key:10s} validation {run['final']:.4f} ({run['seconds']:.0f} s)",
                          flush=True)
    means = {k: float(np.nanmean(v)) for k, v in scores.items() if v}
    best = max(means, key=lambda k: means[k] if math.isfinite(means[k]) else -math.inf)
    return {"task": args.task, "grid": list(scores), "seeds": args.seeds, "scores": scores, "per_choice": per_choice,
            "mean": means, "std": {k: float(np.nanstd(v)) for k, v in scores.items() if v}, "chosen": best}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_task_arguments(ap)
    ap.add_argument("--grid", default=DEFAULT_GRID)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--choices", type=lambda s: [c.strip() for c in s.split(";") if c.strip()], default=None)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--eval-samples", type=int, default=256)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    logging.basicConfig(level=logging.WARNING)
    started = time.monotonic()
    result = asyncio.run(grid_search(args))
    result["wall_seconds"] = time.monotonic() - started
    result["machine"] = {"cores": os.cpu_count(), "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    out = Path(args.out or RESULTS / f"fedalign-epsilon-{args.task}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print("| epsilon | validation score (mean ± std) |\n|---|---|")
    for k in result["grid"]:
        print(f"| {k} | {result['mean'][k]:.4f} ± {result['std'][k]:.4f} |")
    print(f"chosen: {result['chosen']} (wall {result['wall_seconds']:.0f} s; wrote {out})")


if __name__ == "__main__":
    main()
