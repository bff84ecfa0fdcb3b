"""Prioritized / selfish FL where the priority group is a natural one: FedALIGN and VaRSeL against
FedAvg over the priority devices and FedAvg over all devices, for every priority choice of a task,
over several seeds (tasks: ``bench/prioritized_tasks.py``; runs: ``bench/prioritized_runner.py``).

- ``--task shakespeare``: priority = the roles of one play (each of 3 plays in turn), next
  character prediction, scored by accuracy on the priority roles' held-out text (the Selfish FL
  paper's Section 5.2 setting, scaled down).
- ``--task tcga``: priority = one region of Fed-TCGA-BRCA (each of the 6 in turn), a linear Cox
  model, scored by the C-index on the region's test patients (FLamby's task).

Every algorithm runs at ``make_strategy``'s defaults (``bench/validated.toml``) unless a command
line option says otherwise. The seed changes the initial model and every device's mini-batches; the
devices' data is the natural one (``--priority-labels swapped``: the priority group's labels made to
differ from the others', ``bench/prioritized_tasks.py``). ``--server-defaults`` keeps the server's
defences on, as ``edgetrain serve`` has them.

Writes ``bench/results/natural-<task>[-swapped][-defaults].json`` (after every run, so a cut run
keeps what it did) and ``.md``: each final score and FedALIGN's and VaRSeL's differences to both
baselines with 95 % bootstrap intervals over seeds and held-out examples (``bench/prioritized_report.py``).

Usage: ``python bench/natural_groups.py --task shakespeare [--seeds 0,1,2] [--choices ...]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.prioritized_report import markdown, summarise  # noqa: E402
from bench.prioritized_runner import ALGORITHMS, included_kinds, run_algorithm, strategy_options  # noqa: E402
from bench.prioritized_tasks import add_task_arguments, choices, instance  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def options(algorithm: str, args: argparse.Namespace, seed: int) -> dict[str, object]:
    """The strategy options of ``algorithm``: its defaults, but for what the command line set."""
    if algorithm == "fedalign":
        return strategy_options(algorithm, seed, warmup=args.warmup, eval_samples=args.eval_samples,
                                epsilon=args.epsilon, relative_epsilon=args.relative_epsilon)
    if algorithm == "varsel":
        return strategy_options(algorithm, seed, budget_fraction=args.budget_fraction)
    return strategy_options(algorithm, seed)


async def main_async(args: argparse.Namespace, out: Path) -> dict:
    results: dict = {"task": args.task, "seeds": args.seeds, "settings": {k: v for k, v in vars(args).items()
                                                                         if k not in ("seeds",)}, "runs": []}
    previous = 0.0
    if args.append and out.exists():  # add these runs (other algorithms, seeds or choices) to the file's
        old = json.loads(out.read_text())
        previous = float(old.get("wall_seconds", 0.0))
        results["runs"] = [r for r in old["runs"]
                           if not (r["algorithm"] in args.algorithms and r["seed"] in args.seeds
                                   and r["choice"] in (args.choices or choices(args.task, args)))]
    started = time.monotonic()
    with TemporaryDirectory() as tmp:
        for choice in args.choices or choices(args.task, args):
            for seed in args.seeds:
                inst = instance(args.task, choice, seed, "test", args)
                for algorithm in args.algorithms:
                    run = await run_algorithm(algorithm, inst.devices, inst.training, options(algorithm, args, seed),
                                              seed, Path(tmp) / f"{choice}-{seed}", inst.scorer,
                                              server_defaults=args.server_defaults)
                    run["choice"] = choice
                    run["included_per_round"] = included_kinds(run, inst.devices)
                    results["runs"].append(run)
                    results["training"] = vars(inst.training)
                    print(f"{choice:24s} seed {seed} {algorithm:16s} {run['final']:.4f} ({run['seconds']:.0f} s)",
                          flush=True)
                    results["summary"] = summarise(results["runs"])
                    results["wall_seconds"] = previous + time.monotonic() - started
                    out.write_text(json.dumps(results, indent=1, default=str))
    return results


def report(results: dict, out: Path) -> None:
    """Write the results and their table (``.md`` beside them) and print the table."""
    out.write_text(json.dumps(results, indent=1, default=str))
    metric = ("C-index on the region's test patients" if results["task"] == "tcga"
              else "Accuracy on the priority group's held-out data")
    table = markdown(results["summary"], metric)
    out.with_suffix(".md").write_text(table)
    print(table)
    print(f"wall {results['wall_seconds']:.0f} s; wrote {out}")


def merge(task: str, files: list[Path], out: Path) -> dict:
    """One result of the runs of several files (runs of other algorithms made by separate commands)."""
    parts = [json.loads(f.read_text()) for f in files]
    runs = [r for p in parts for r in p["runs"]]
    return {**parts[0], "task": task, "runs": runs, "summary": summarise(runs), "merged_from": [str(f) for f in files],
            "wall_seconds": sum(float(p.get("wall_seconds", 0.0)) for p in parts)}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_task_arguments(ap)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--choices", type=lambda s: [c.strip() for c in s.split(";") if c.strip()], default=None,
                    help="priority choices separated by ';' (default: every one)")
    ap.add_argument("--warmup", type=int, default=None, help="FedALIGN's warm-up rounds (default: its default)")
    ap.add_argument("--epsilon", type=float, default=None, help="FedALIGN's threshold as a loss gap")
    ap.add_argument("--relative-epsilon", type=float, default=None, help="FedALIGN's c of epsilon_t = c F(w_t)")
    ap.add_argument("--eval-samples", type=int, default=None, help="FedALIGN's samples per loss (0: all)")
    ap.add_argument("--budget-fraction", type=float, default=None, help="VaRSeL's K / N (default: its default)")
    ap.add_argument("--server-defaults", action="store_true",
                    help="keep the server's defences on (norm bound, validation before commit, FedAvg's weight cap)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--append", action="store_true", help="keep the runs already in --out (other algorithms ...)")
    ap.add_argument("--merge", nargs="+", type=Path, default=None,
                    help="run nothing: merge these result files into --out and print the table")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.algorithms = [a for a in args.algorithms.split(",") if a]
    logging.basicConfig(level=logging.WARNING)
    variant = ("-swapped" if args.priority_labels == "swapped" else "") + ("-defaults" if args.server_defaults else "")
    out = Path(args.out or RESULTS / f"natural-{args.task}{variant}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.merge:
        report(merge(args.task, args.merge, out), out)
        return
    results = asyncio.run(main_async(args, out))
    results["machine"] = {"cores": os.cpu_count(), "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    report(results, out)


if __name__ == "__main__":
    main()
