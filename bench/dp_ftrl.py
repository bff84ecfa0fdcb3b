"""DP without a sampling assumption, and noise that fits nested cohorts: DP-SGD with sampling (the
``gaussian`` mechanism, fixed-size cohorts accounted with RDP), DP-FTRL (``--dp-mechanism ftrl``: tree
aggregation, each device once per tree, no sampling assumed) and DP-FTRL with the per-block
allocation (``dp_allocation = "utility"``), against non-private, on the emulated fleets of
``bench/dp_utility.py``.

The workload is ``bench/dp_utility.py``'s (:func:`bench.dp_utility.case_fleet`): ``mnist_2nn`` on MNIST
split IID over the devices, 10% a round, 10 rounds, EmbracingFL, clip 1.0, delta 1e-5; ``mixed`` (a
quarter strong, three quarters training the head only) and ``allstrong``. With 1,000 devices, 100 a
round and 10 rounds, DP-FTRL's default tree is the whole run (floor(N / K) = 10 rounds): every device
takes part once. Each variant is one run per target epsilon and seed (the fleet's seed: its data
split, its model and its cohorts; the noise is the OS's either way). It reports the final test accuracy,
the model's epsilon, the multipliers and the noise per coordinate of each block's mean.

Not a test: ``python bench/dp_ftrl.py`` writes ``bench/results/dp_ftrl.json`` and ``.md``; ``--devices``,
``--rounds``, ``--epsilons``, ``--fleets``, ``--variants``, ``--seeds`` size it (a central run of 1,000
devices takes about half a minute on the shared 2-core machine).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.dp_utility import case_fleet, keep, workload_arguments  # noqa: E402
from bench.harness import Case, Context, parse_list  # noqa: E402
from bench.intervals import interval, seed_draws  # noqa: E402

#: The variants, by name: their DP settings (beyond the target, delta and clip).
VARIANTS: dict[str, dict[str, object]] = {
    "dpsgd": {},
    "dpsgd-alloc": {"dp_allocation": "utility"},
    "ftrl": {"dp_mechanism": "ftrl"},
    "ftrl-alloc": {"dp_mechanism": "ftrl", "dp_allocation": "utility"},
}


def run_one(fleet_kind: str, epsilon: float | None, variant: str, seed: int, args: argparse.Namespace,
            tmp: Path) -> dict:
    from emulator.runner import run_emulation
    from emulator.schedule import server_config

    name = f"{fleet_kind}-{'nonprivate' if epsilon is None else f'eps{epsilon:g}-{variant}'}-s{seed}"
    fleet = case_fleet(name, fleet_kind, args.devices, args.rounds, args.fraction, epsilon, args.clip, seed=seed,
                       dp_options=VARIANTS[variant] if epsilon is not None else None)
    config = server_config(fleet, store_dir=tmp / name, data_root=args.data_root, deadline_s=300)
    config = dataclasses.replace(config, eval_every=args.rounds, eval_limit=args.eval_limit, keep_checkpoints=1,
                                 validation_samples=0, wait_devices_s=900)  # a loaded machine connects slowly
    t0 = time.monotonic()
    run = asyncio.run(run_emulation(fleet, config, data_root=args.data_root, stderr_dir=tmp / name / "logs",
                                    workers=args.workers))
    last = run.history[-1]
    privacy = last.get("privacy") or {}
    return {"run": name, "fleet": fleet_kind, "target_epsilon": epsilon, "variant": None if epsilon is None else variant,
            "seed": seed, "rounds": last["round"], "accuracy": last.get("accuracy"), "epsilon": privacy.get("epsilon"),
            "block_epsilons": privacy.get("blocks"), "noise_multiplier": privacy.get("noise_multiplier"),
            "block_multipliers": privacy.get("multipliers"), "noise_per_coordinate": privacy.get("noise_stddev"),
            "wall_s": round(time.monotonic() - t0, 1)}


def markdown(results: list[dict], args: argparse.Namespace) -> str:
    """One row per (fleet, variant, target): the accuracy's mean over seeds with its 95% bootstrap
    interval (seeds and test images resampled; one seed: the test images only)."""
    rows: dict[tuple, list[dict]] = {}
    for r in results:
        rows.setdefault((r["fleet"], r["variant"] or "-", r["target_epsilon"]), []).append(r)
    lines = ["| fleet | variant | target epsilon | accuracy (mean, 95% CI) | seeds | model epsilon | "
             "block multipliers (fc1, head) | noise per coordinate of the mean (fc1, head) |",
             "|---|---|---|---|---|---|---|---|"]
    for (fleet, variant, eps), runs in rows.items():
        accs = [r["accuracy"] for r in runs if r["accuracy"] is not None]
        # Seeds resampled, each seed's accuracy redrawn over the eval_limit test images (bench/intervals.py).
        acc = interval(seed_draws(accs, args.eval_limit), statistics.fmean(accs)).text(4) if accs else "-"
        last = runs[-1]
        mult = last["block_multipliers"] or {}
        noise = last["noise_per_coordinate"] or {}
        lines.append(f"| {fleet} | {variant} | {'non-private' if eps is None else eps} | {acc} | {len(accs)} | "
                     f"{'-' if last['epsilon'] is None else format(last['epsilon'], '.3f')} | "
                     f"{', '.join(format(v, '.3g') for v in mult.values()) or '-'} | "
                     f"{', '.join(format(v, '.2e') for v in noise.values()) or '-'} |")
    head = (f"`python bench/dp_ftrl.py --devices {args.devices} --rounds {args.rounds} --fraction {args.fraction} "
            f"--epsilons {args.epsilons} --fleets {args.fleets} --variants {args.variants} --seeds {args.seeds}`")
    return head + "\n\n" + "\n".join(lines) + "\n"


def arguments(ap: argparse.ArgumentParser) -> None:
    workload_arguments(ap)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"some of {', '.join(VARIANTS)}")


def run(ctx: Context) -> dict:
    args = ctx.args
    epsilons = [None, *parse_list(args.epsilons, float)]
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="dp-ftrl-") as tmp:
        for seed in ctx.seeds:
            for fleet_kind in parse_list(args.fleets):
                for eps in epsilons:
                    for variant in (["dpsgd"] if eps is None else parse_list(args.variants)):
                        keep(ctx, results, run_one(fleet_kind, eps, variant, seed, args, Path(tmp)),
                                   lambda rs: markdown(rs, args))
    print(markdown(results, args))
    return ctx.write(results, quiet=True)


CASE = Case("dp_ftrl", __doc__, run, arguments=arguments, seeds="0", data_root=True,
            quick={"devices": 20, "rounds": 2, "fraction": 0.5, "epsilons": "8", "fleets": "mixed",
                   "variants": "ftrl-alloc", "eval_limit": 200})


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
