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
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Case, Context, parse_list, report_of, runs_of  # noqa: E402
from bench.prioritized_report import markdown, summarise  # noqa: E402
from bench.prioritized_runner import ALGORITHMS, included_kinds, run_algorithm, strategy_options  # noqa: E402
from bench.prioritized_tasks import add_task_arguments, choices, instance  # noqa: E402

def options(algorithm: str, args: argparse.Namespace, seed: int) -> dict[str, object]:
    """The strategy options of ``algorithm``: its defaults, but for what the command line set."""
    if algorithm == "fedalign":
        return strategy_options(algorithm, seed, warmup=args.warmup, eval_samples=args.eval_samples,
                                epsilon=args.epsilon, relative_epsilon=args.relative_epsilon)
    if algorithm == "varsel":
        return strategy_options(algorithm, seed, budget_fraction=args.budget_fraction)
    return strategy_options(algorithm, seed)


async def main_async(ctx: Context) -> dict:
    """Every choice, seed and algorithm; the results written after every run (a long run keeps what it did)."""
    args, out = ctx.args, ctx.out
    runs: list[dict] = []
    report: dict = {"task": args.task, "seeds": args.seeds}
    previous = 0.0
    if args.append and out.exists():  # add these runs (other algorithms, seeds or choices) to the file's
        old = json.loads(out.read_text())
        previous = float(report_of(old).get("wall_seconds", 0.0))
        runs = [r for r in runs_of(old)
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
                    runs.append(run)
                    report["training"] = vars(inst.training)
                    print(f"{choice:24s} seed {seed} {algorithm:16s} {run['final']:.4f} ({run['seconds']:.0f} s)",
                          flush=True)
                    report["summary"] = summarise(runs)
                    report["wall_seconds"] = previous + time.monotonic() - started
                    ctx.write(runs, report, quiet=True)
    report["summary"] = summarise(runs)
    report["wall_seconds"] = previous + time.monotonic() - started
    return ctx.write(runs, report, quiet=True)


def table_of(doc: dict) -> str:
    """The table of a results document (written as ``.md`` beside it)."""
    report = report_of(doc)
    metric = ("C-index on the region's test patients" if report["task"] == "tcga"
              else "Accuracy on the priority group's held-out data")
    return markdown(report["summary"], metric)


def merge(ctx: Context, files: list[Path]) -> dict:
    """One result of the runs of several files (runs of other algorithms made by separate commands)."""
    parts = [json.loads(f.read_text()) for f in files]
    runs = [r for p in parts for r in runs_of(p)]
    return ctx.write(runs, {**report_of(parts[0]), "task": ctx.args.task, "summary": summarise(runs),
                            "merged_from": [str(f) for f in files],
                            "wall_seconds": sum(float(report_of(p).get("wall_seconds", 0.0)) for p in parts)})


def arguments(ap: argparse.ArgumentParser) -> None:
    add_task_arguments(ap)
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
    ap.add_argument("--append", action="store_true", help="keep the runs already in --out (other algorithms ...)")
    ap.add_argument("--merge", nargs="+", type=Path, default=None,
                    help="run nothing: merge these result files into --out and print the table")


def results_name(args: argparse.Namespace) -> str:
    """natural-<task>[-swapped][-defaults]"""
    variant = ("-swapped" if args.priority_labels == "swapped" else "") + ("-defaults" if args.server_defaults else "")
    return f"natural-{args.task}{variant}"


def run(ctx: Context) -> dict:
    args = ctx.args
    args.seeds = ctx.seeds
    args.algorithms = parse_list(args.algorithms)
    logging.basicConfig(level=logging.WARNING)
    doc = merge(ctx, args.merge) if args.merge else asyncio.run(main_async(ctx))
    table = table_of(doc)
    ctx.out.with_suffix(".md").write_text(table)
    print(table)
    print(f"wall {report_of(doc)['wall_seconds']:.0f} s; wrote {ctx.out}")
    return doc


CASE = Case("natural_groups", __doc__, run, arguments=arguments, seeds="0,1,2", results=results_name,
            quick={"seeds": "0", "rounds": 2, "algorithms": "fedavg-priority,fedalign", "roles": 2,
                   "score_samples": 200})


def build_parser() -> argparse.ArgumentParser:
    return CASE.parser()


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
