"""Prioritized / selfish FL on MNIST: FedALIGN and VaRSeL against FedAvg on the priority devices
only and FedAvg on all devices (FedALIGN Section 4, VaRSeL Section 5.1), at small scale.

Setting (one seed; the class choices and shards are drawn from it):

- 3 priority (internal) devices, hello labels ``priority=1`` and ``internal=1``, each holding
  ``--priority-samples`` training images of 2-3 classes out of the 5 priority classes (skewed, as
  the papers' shard split; ``--priority-iid``: all 5 each, VaRSeL's identically distributed
  internals): their objective, and the test set everything is scored on, is those 5 classes
  (MNIST's test images of them).
- ``--aligned`` non-priority devices with clean images of the priority classes (helpful data: the
  priority devices' distribution, as FedALIGN's synthetic experiment hands its global data to the
  non-priority devices; ``--nonpriority-classes 3``: 3 of the 5 each, skewed helpers);
  every non-priority device holds ``--samples`` images (equal shards, as the papers);
- ``--noisy`` non-priority devices with images of the priority classes (as many as the aligned
  ones) whose labels are replaced by a random class with probability ``--noise`` (label noise,
  FedALIGN's synthetic experiment (1));
- ``--irrelevant`` non-priority devices with images of the other 5 classes (irrelevant data points
  from another distribution, FedALIGN's synthetic experiment (2)).
- ``--nonpriority-labels other``: the aligned and noisy devices, too, hold images of the other 5
  classes, so no non-priority device shares a label with the priority devices (a priority group on
  another label pair: the case a selection rule must not let in early).

Algorithms, all through the real orchestrator (``Orchestrator``, the strategies chosen by name with
options as ``edgetrain serve -O`` gives them) and the real device client (``DeviceClient``), every
device with its own websocket on 127.0.0.1, all in this one process (in-process clients, not the
emulator): ``fedavg-priority`` (FedAvg, only the priority devices connect), ``fedavg-all`` (FedAvg,
every device), ``fedalign`` and ``varsel``, each at ``make_strategy``'s defaults (``--epsilon``,
``--relative-epsilon``, ``--warmup``, ``--budget`` override them). Model: the zoo's ``mnist_2nn``
(784-64-10). Every round's global model is scored on the priority test set; the table gives each
final score and FedALIGN's and VaRSeL's differences to both baselines with 95 % bootstrap intervals
(``bench/prioritized_report.py``). ``--server-defaults`` keeps the server's defences on (norm bound,
validation before commit, FedAvg's weight cap), as ``edgetrain serve`` has them.

Writes ``bench/results/prioritized.json``, ``.md`` and ``.png``.

Usage: ``python bench/prioritized.py [--seeds 0,1,2] [--rounds 30] [--server-defaults]``
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import Case, Context, parse_list  # noqa: E402
from bench.prioritized_report import markdown, summarise  # noqa: E402
from bench.prioritized_runner import (  # noqa: E402
    Device, Scorer, Training, accuracy, included_kinds, run_algorithm, strategy_options,
)
from edge_sdk.data import load_dataset  # noqa: E402

ALGORITHMS = ("fedavg-priority", "fedavg-all", "fedalign", "varsel")
MODEL = "mnist_2nn"


def make_shards(args: argparse.Namespace, seed: int, train) -> tuple[list[tuple[str, str, np.ndarray, np.ndarray]],
                                                                     list[int], dict[str, np.ndarray]]:
    """The devices' data: (device id, kind, x, y) per device, the priority classes, and for each
    priority device the training images of its classes no device holds (its held-out data)."""
    rng = np.random.default_rng(seed)
    classes = rng.permutation(10)
    prio, other = sorted(classes[:5].tolist()), sorted(classes[5:].tolist())
    by_class = {c: rng.permutation(np.flatnonzero(train.y == c)) for c in range(10)}
    used = {c: 0 for c in range(10)}

    def take(cs: list[int], n: int) -> np.ndarray:
        per = np.array_split(np.arange(n), len(cs))
        out = []
        for c, part in zip(cs, per):
            out.append(by_class[c][used[c]: used[c] + len(part)])
            used[c] += len(part)
        return rng.permutation(np.concatenate(out))

    shards: list[tuple[str, str, np.ndarray, np.ndarray]] = []
    # Skewed priority devices: 2-3 classes each, together all 5 priority classes.
    prio_sets = [prio] * 3 if args.priority_iid else [prio[0:2], prio[2:4], [prio[4], prio[0], prio[2]]]
    for i, cs in enumerate(prio_sets):
        idx = take(cs, args.priority_samples)
        shards.append((f"prio-{i}", "priority", train.x[idx], train.y[idx]))
    spare_classes = {f"prio-{i}": cs for i, cs in enumerate(prio_sets)}
    helped = other if args.nonpriority_labels == "other" else prio  # the aligned and noisy devices' classes
    for i in range(args.aligned):
        cs = sorted(rng.choice(helped, size=args.nonpriority_classes, replace=False).tolist())
        idx = take(cs, args.samples)
        shards.append((f"aligned-{i}", "aligned", train.x[idx], train.y[idx]))
    for i in range(args.noisy):
        cs = sorted(rng.choice(helped, size=args.nonpriority_classes, replace=False).tolist())
        idx = take(cs, args.samples)
        y = train.y[idx].copy()
        flip = rng.random(len(y)) < args.noise
        y[flip] = rng.integers(0, 10, int(flip.sum()))
        shards.append((f"noisy-{i}", "noisy", train.x[idx], y))
    for i in range(args.irrelevant):
        cs = sorted(rng.choice(other, size=3, replace=False).tolist())
        idx = take(cs, args.samples)
        shards.append((f"irrelevant-{i}", "irrelevant", train.x[idx], train.y[idx]))
    spare = {d: np.random.default_rng([seed, i]).permutation(np.concatenate([by_class[c][used[c]:] for c in cs]))
             for i, (d, cs) in enumerate(spare_classes.items())}
    return shards, prio, spare


def bench_options(algorithm: str, args: argparse.Namespace, seed: int) -> dict[str, object]:
    """The strategy's options: its defaults, but for what the command line set."""
    if algorithm == "fedalign":
        return strategy_options(algorithm, seed, epsilon=args.epsilon, relative_epsilon=args.relative_epsilon,
                                warmup=args.warmup)
    if algorithm == "varsel":
        return strategy_options(algorithm, seed, budget=args.budget)
    return strategy_options(algorithm, seed)


async def run_one(algorithm: str, shards, args: argparse.Namespace, seed: int, tmp: Path,
                  test_x: np.ndarray, test_y: np.ndarray) -> dict:
    devices = [Device(d, kind, x, y, priority=kind == "priority") for d, kind, x, y in shards]
    training = Training(model=MODEL, rounds=args.rounds, local_steps=args.local_steps, batch_size=args.batch_size,
                        lr=args.lr, eval_data="mnist", eval_every=args.rounds)
    run = await run_algorithm(algorithm, devices, training, bench_options(algorithm, args, seed), seed, tmp,
                              Scorer(MODEL, test_x, test_y, accuracy), server_defaults=args.server_defaults)
    run["priority_accuracy"], run["final_priority_accuracy"] = run.pop("priority_score"), run.pop("final")
    return run


def plot(runs: list[dict], setting: dict, seeds: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for algorithm in ALGORITHMS:
        curves = np.array([r["priority_accuracy"] for r in runs if r["algorithm"] == algorithm])
        if not len(curves):
            continue
        mean = curves.mean(axis=0)
        rounds = np.arange(1, len(mean) + 1)
        ax.plot(rounds, mean, label=algorithm)
        ax.fill_between(rounds, curves.min(axis=0), curves.max(axis=0), alpha=0.15)
    s = setting
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy on the priority classes' test set")
    ax.set_title(f"MNIST, {s['priority']} priority + {s['aligned']} aligned + {s['noisy']} noisy + "
                 f"{s['irrelevant']} irrelevant devices ({len(seeds)} seeds)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


async def main_async(args: argparse.Namespace, seeds: list[int]) -> tuple[list[dict], dict]:
    """Every seed's runs of every algorithm; the runs, and how many of each kind the selections folded."""
    train = load_dataset("mnist", split="train")
    test = load_dataset("mnist", split="test")
    runs = []
    kinds: dict[str, dict] = {}
    with TemporaryDirectory() as tmp:
        for seed in seeds:
            shards, prio, _ = make_shards(args, seed, train)
            mask = np.isin(test.y, prio)
            test_x, test_y = test.x[mask], test.y[mask]
            for algorithm in args.algorithms:
                run = await run_one(algorithm, shards, args, seed, Path(tmp) / f"s{seed}", test_x, test_y)
                run["priority_classes"] = prio
                if algorithm in ("fedalign", "varsel"):
                    kinds[f"{algorithm}/{seed}"] = included_kinds(run, [Device(d, k, x, y) for d, k, x, y in shards])
                runs.append(run)
                print(f"seed {seed} {algorithm:16s} final priority accuracy {run['final_priority_accuracy']:.4f} "
                      f"({run['seconds']:.0f} s)", flush=True)
    return runs, kinds


def setting(args: argparse.Namespace) -> dict:
    return {"priority": 3, "priority_samples": args.priority_samples, "priority_iid": args.priority_iid,
            "nonpriority_classes": args.nonpriority_classes, "aligned": args.aligned,
            "noisy": args.noisy, "irrelevant": args.irrelevant, "samples": args.samples,
            "noise": args.noise, "rounds": args.rounds, "local_steps": args.local_steps,
            "batch_size": args.batch_size, "lr": args.lr, "epsilon": args.epsilon,
            "relative_epsilon": args.relative_epsilon,
            "warmup": args.warmup, "budget": args.budget, "model": MODEL,
            "nonpriority_labels": args.nonpriority_labels, "server_defaults": args.server_defaults}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--priority-samples", type=int, default=60, help="training images per priority device")
    ap.add_argument("--samples", type=int, default=60, help="training images per non-priority device (equal shards, as the papers)")
    ap.add_argument("--aligned", type=int, default=6)
    ap.add_argument("--noisy", type=int, default=6)
    ap.add_argument("--irrelevant", type=int, default=6)
    ap.add_argument("--noise", type=float, default=0.8, help="probability that a noisy device's label is random")
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--epsilon", type=float, default=None,
                    help="FedALIGN's threshold as a loss gap (default: its default, relative to the priority loss)")
    ap.add_argument("--relative-epsilon", type=float, default=None, help="FedALIGN's c of epsilon_t = c F(w_t)")
    ap.add_argument("--warmup", type=int, default=None, help="FedALIGN's warm-up rounds (default: its default)")
    ap.add_argument("--budget", type=float, default=None,
                    help="VaRSeL's K, expected externals per round (default: its default, 0.25 of the externals)")
    ap.add_argument("--nonpriority-labels", choices=("same", "other"), default="same",
                    help="other: the aligned and noisy devices hold the other 5 classes (no label shared with the "
                         "priority devices)")
    ap.add_argument("--server-defaults", action="store_true",
                    help="keep the server's defences on (norm bound, validation before commit, FedAvg's weight cap)")
    ap.add_argument("--nonpriority-classes", type=int, default=5, choices=range(1, 6),
                    help="priority classes each aligned or noisy device holds (5: the priority devices' whole "
                         "distribution, as FedALIGN's synthetic experiment)")
    ap.add_argument("--priority-iid", action="store_true",
                    help="priority devices hold all 5 priority classes (VaRSeL's identically distributed internals)")


def build_parser() -> argparse.ArgumentParser:
    return CASE.parser()


def default_args() -> argparse.Namespace:
    """The benchmark's default setting (what ``bench/fedalign_epsilon.py --task mnist`` scores)."""
    return build_parser().parse_args([])


def run(ctx: Context) -> dict:
    args = ctx.args
    args.algorithms = parse_list(args.algorithms)
    logging.basicConfig(level=logging.WARNING)
    runs, kinds = asyncio.run(main_async(args, ctx.seeds))
    summary = summarise([{**r, "final": r["final_priority_accuracy"]} for r in runs]).get("", {})
    doc = ctx.write(runs, {"setting": setting(args), "seeds": ctx.seeds, "summary": summary,
                           "included_per_round": kinds})
    plot(runs, setting(args), ctx.seeds, ctx.out.with_suffix(".png"))
    table = markdown({"MNIST, 5 priority classes": summary}, "Final accuracy on the priority test set")
    ctx.out.with_suffix(".md").write_text(table)
    print(table)
    print(f"wall {doc['wall_s']:.0f} s; and its .md and .png")
    return doc


CASE = Case("prioritized", __doc__, run, arguments=arguments, seeds="0,1,2",
            quick={"seeds": "0", "rounds": 2, "algorithms": "fedavg-priority,fedalign"},
            metrics=("final_priority_accuracy", "seconds"), group_by=("algorithm",))


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
