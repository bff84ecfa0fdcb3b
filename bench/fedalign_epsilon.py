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

Every grid value runs with FedALIGN's default warm-up (``--warmup`` to change it), and the grid
always holds the default threshold (rel:0.5), so the table says how the shipped default compares.

**Your own task.** ``--fleet FILE --held-out DATA`` runs the grid on a fleet file of yours (its
groups, data, model and ``[training]`` settings; the groups with ``priority = true`` are FedALIGN's
priority devices) through the emulator (``edgetrain emulate``'s code, the fleet's emulation mode),
and scores each run's final model on ``DATA``: a held-out set of the priority devices' own kind of
data that no device trains on (a ``.npz``/``.npy``/``.csv`` file, or ``package.module:function``,
as ``edgetrain serve --eval-data`` takes it). The score is the accuracy, or, for a model without
classes, the negated test loss (higher is better either way).

Writes ``bench/results/fedalign-epsilon-<task>.json`` (``-<fleet name>`` for a fleet) and prints the
table and the chosen value.

Usage: ``python bench/fedalign_epsilon.py --task tcga [--grid rel:0.05,rel:0.1,abs:0.5] [--seeds 0]``;
``python bench/fedalign_epsilon.py --fleet my-fleet.toml --held-out priority-holdout.npz [--rounds 20]``
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Case, Context  # noqa: E402
from bench.harness.fleets import derive  # noqa: E402
from bench.prioritized_runner import run_algorithm, strategy_options  # noqa: E402
from bench.prioritized_tasks import add_task_arguments, choices, instance  # noqa: E402

#: The grid: FedALIGN's default threshold (rel:0.5, ``DEFAULT_RELATIVE_EPSILON``) among smaller and
#: larger ones, relative and absolute.
DEFAULT_GRID = "rel:0.02,rel:0.05,rel:0.1,rel:0.2,rel:0.5,rel:1,abs:0.1,abs:0.5"


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


def grid_options(args: argparse.Namespace, option: str, value: float) -> dict[str, object]:
    """FedALIGN's options for one grid value: the value, and what the command line set."""
    return strategy_options("fedalign", 0, warmup=args.warmup, eval_samples=args.eval_samples, **{option: value})


async def fleet_run(args: argparse.Namespace, option: str, value: float, seed: int, store: Path) -> float:
    """One FedALIGN run of the user's fleet at one grid value: the final model's score on --held-out."""
    import dataclasses

    from emulator.fleet import load_fleet
    from emulator.runner import run_emulation
    from emulator.schedule import server_config
    from orchestrator.strategies import FedALIGN
    from orchestrator.strategies.options import option_specs

    fleet = load_fleet(args.fleet)
    if not any(g.priority for g in fleet.groups):
        raise SystemExit(f"{args.fleet}: no group has priority = true; FedALIGN needs priority devices")
    fleet = derive(fleet, fleet={"seed": seed}, partition={"seed": seed})
    config = server_config(fleet, rounds=args.rounds or None, store_dir=store, data_root=args.data_root)
    # The fleet's own FedALIGN options (priority label, warm-up ...) stay, but for the threshold.
    kept = {k: v for k, v in fleet.strategy_options.items()
            if k in option_specs(FedALIGN) and k not in ("epsilon", "relative_epsilon")}
    config = dataclasses.replace(config, strategy="fedalign", eval_source=args.held_out, eval_every=config.rounds,
                                 strategy_options={**kept, **grid_options(args, option, value)}, seed=seed)
    run = await run_emulation(fleet, config, data_root=args.data_root)
    last = run.history[-1] if run.history else {}
    if "accuracy" in last:
        return float(last["accuracy"])
    if "test_loss" in last:
        return -float(last["test_loss"])
    raise SystemExit(f"{args.fleet}: the last round has no score on {args.held_out} (did every round fail?)")


async def grid_search(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """Every grid value's runs (each one's validation score), and the grid's table."""
    if args.fleet:
        return await fleet_grid(args)
    grid = parse_grid(args.grid)
    scores: dict[str, list[float]] = {label(o, v): [] for o, v in grid}
    per_choice: dict[str, dict[str, list[float]]] = {}
    runs = []
    with TemporaryDirectory() as tmp:
        for choice in args.choices or choices(args.task, args):
            for seed in args.seeds:
                inst = instance(args.task, choice, seed, "validation", args)
                for option, value in grid:
                    run = await run_algorithm("fedalign", inst.devices, inst.training, grid_options(args, option, value),
                                              seed, Path(tmp) / f"{choice}-{seed}-{label(option, value)}", inst.scorer)
                    key = label(option, value)
                    scores[key].append(run["final"])
                    per_choice.setdefault(choice, {}).setdefault(key, []).append(run["final"])
                    runs.append({"choice": choice, "seed": seed, "epsilon": key, "score": run["final"],
                                 "seconds": run["seconds"]})
                    print(f"{choice:24s} seed {seed} {key:10s} validation {run['final']:.4f} ({run['seconds']:.0f} s)",
                          flush=True)
    return runs, choose(args.task, scores, args.seeds, per_choice)


def choose(task: str, scores: dict[str, list[float]], seeds: list[int], per_choice: dict | None = None) -> dict:
    """The grid's table: mean and std per value, and the value of the best mean."""
    means = {k: float(np.nanmean(v)) for k, v in scores.items() if v}
    best = max(means, key=lambda k: means[k] if math.isfinite(means[k]) else -math.inf)
    return {"task": task, "grid": list(scores), "seeds": seeds, "scores": scores, "per_choice": per_choice or {},
            "mean": means, "std": {k: float(np.nanstd(v)) for k, v in scores.items() if v}, "chosen": best}


async def fleet_grid(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """The grid on the user's fleet (``--fleet``), scored on ``--held-out``."""
    grid = parse_grid(args.grid)
    scores: dict[str, list[float]] = {label(o, v): [] for o, v in grid}
    runs = []
    with TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for option, value in grid:
                key = label(option, value)
                scores[key].append(await fleet_run(args, option, value, seed, Path(tmp) / f"{seed}-{key}"))
                runs.append({"seed": seed, "epsilon": key, "score": scores[key][-1]})
                print(f"seed {seed} {key:10s} held-out score {scores[key][-1]:.4f}", flush=True)
    return runs, choose(Path(args.fleet).stem, scores, args.seeds)


def arguments(ap: argparse.ArgumentParser) -> None:
    add_task_arguments(ap, required=False)
    ap.add_argument("--fleet", default=None, help="your own task: a fleet file whose priority groups are FedALIGN's")
    ap.add_argument("--held-out", default=None,
                    help="with --fleet: held-out data of the priority devices' kind (.npz/.npy/.csv or module:function)")
    ap.add_argument("--grid", default=DEFAULT_GRID)
    ap.add_argument("--choices", type=lambda s: [c.strip() for c in s.split(";") if c.strip()], default=None)
    ap.add_argument("--warmup", type=int, default=None, help="warm-up rounds (default: FedALIGN's default)")
    ap.add_argument("--eval-samples", type=int, default=None, help="samples per loss (default: FedALIGN's default)")


def results_name(args: argparse.Namespace) -> str:
    """fedalign-epsilon-<task or fleet>"""
    return f"fedalign-epsilon-{args.task or Path(args.fleet or 'fleet').stem}"


def run(ctx: Context) -> dict:
    args, ap = ctx.args, ctx.parser
    if bool(args.fleet) == bool(args.task):
        ap.error("give --task (a built-in task) or --fleet with --held-out (your own), not both")
    if args.fleet and not args.held_out:
        ap.error("--fleet needs --held-out: the priority devices' held-out data the grid is scored on")
    args.seeds = ctx.seeds
    logging.basicConfig(level=logging.WARNING)
    runs, result = asyncio.run(grid_search(args))
    doc = ctx.write(runs, result, quiet=True)
    print("| epsilon | validation score (mean ± std) |\n|---|---|")
    for k in result["grid"]:
        print(f"| {k} | {result['mean'][k]:.4f} ± {result['std'][k]:.4f} |")
    print(f"chosen: {result['chosen']} (wall {doc['wall_s']:.0f} s; wrote {ctx.out})")
    return doc


CASE = Case("fedalign_epsilon", __doc__, run, arguments=arguments, seeds="0", data_root=True, results=results_name,
            quick={"rounds": 2, "grid": "rel:0.5,abs:0.5"})


def build_parser() -> argparse.ArgumentParser:
    return CASE.parser()


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
