"""Privacy against utility: central and distributed DP (``--dp``, and ``--dp --secure-aggregation``) on a
fleet of 1,000 emulated devices.

Each run is the emulator's lightweight mode (``emulator.lightweight``: the real
:class:`edge_sdk.client.DeviceClient` over websockets on 127.0.0.1, devices as asyncio tasks in a
few worker processes) against the real orchestrator with
:class:`orchestrator.aggregation.privacy.gaussian.CentralGaussian` (``--noise central``) or
:class:`orchestrator.aggregation.privacy.distributed.DistributedDiscreteGaussian` (``--noise distributed``:
secure rounds whose devices, enrolled with credentials, add discrete Gaussian noise):
``mnist_2nn`` (784-64-10, two blocks, 51k parameters) on MNIST split IID across the devices, 10% of
them (fixed-size cohorts) sampled per round, EmbracingFL. For each fleet (``mixed``: a quarter strong,
three quarters training the head only, EmbracingFL's partial training; ``allstrong``: every device
trains both blocks) it runs the non-private baseline (no clip, no noise; the server's norm bound and
validation off in both, so only DP differs) and one run per target epsilon (delta 1e-5), the noise
multiplier calibrated by the ledger to spend the target in the planned rounds. It reports the
final test accuracy, the model's and each block's epsilon, the noise multiplier and the noise per
coordinate of each block's mean, and the wall time.

Not a test: accuracy after a few rounds on a loaded machine. ``python bench/dp_utility.py`` writes
``bench/results/dp_utility.json`` and ``.md``; ``--devices``, ``--rounds``, ``--epsilons``, ``--fleets``,
``--noise`` size it (central noise alone finishes in about a quarter of an hour on the shared 2-core
machine; a secure round of 100 emulated devices takes about 18 s there).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, parse_list  # noqa: E402
from bench.harness.fleets import build_fleet, group  # noqa: E402


def case_fleet(name: str, fleet: str, devices: int, rounds: int, fraction: float, epsilon: float | None, clip: float,
              noise: str = "central", expected_survivors: float | None = None, *, seed: int = 0,
              dp_options: dict[str, object] | None = None):
    """The fleet of one run: ``epsilon`` None is the non-private baseline; ``noise`` "distributed" runs the
    rounds secure, the devices adding the noise (orchestrator.aggregation.privacy.distributed), their shares
    sized for ``expected_survivors`` of each block's cohort (None: the server's default); ``dp_options``:
    more DP settings (a mechanism, an allocation); ``seed``: the fleet's (data split, model, cohorts)."""
    strong = devices if fleet == "allstrong" else devices // 4
    dp: dict[str, object] = {} if epsilon is None else {"dp": True, "dp_target_epsilon": epsilon, "dp_delta": 1e-5,
                                                        "dp_clip": clip, **(dp_options or {})}
    if epsilon is not None and noise == "distributed":
        dp["secure_aggregation"] = True
        if expected_survivors is not None:
            dp["dp_expected_survivors"] = expected_survivors
    groups = [group("mid-phone", strong, "strong")]
    if devices > strong:
        groups.append(group("mid-phone", devices - strong, "head-only", force_split=1))
    return build_fleet(
        name, model="mnist_2nn", dataset="mnist", seed=seed,
        training={"strategy": "embracingfl", "rounds": rounds, "fraction": fraction, "local_steps": 5, "batch_size": 16,
                  "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "norm_bound": 0.0, "direction_trust": False,
                  "max_loss_rise": 0.0, **dp},
        strategy={"max_weight_share": 1.0}, partition={"scheme": "iid"},
        emulation={"mode": "lightweight", "memory_cap": "none", "timeout_s": 900, "throttle_cpu": False},
        groups=groups)


def run_one(fleet_kind: str, epsilon: float | None, args: argparse.Namespace, tmp: Path, noise: str = "central") -> dict:
    from emulator.runner import run_emulation
    from emulator.schedule import server_config

    name = f"{fleet_kind}-{'nonprivate' if epsilon is None else f'eps{epsilon:g}-{noise}'}"
    fleet = case_fleet(name, fleet_kind, args.devices, args.rounds, args.fraction, epsilon, args.clip, noise,
                      args.expected_survivors)
    config = server_config(fleet, store_dir=tmp / name, data_root=args.data_root, deadline_s=300)
    config = dataclasses.replace(config, eval_every=args.rounds, eval_limit=args.eval_limit, keep_checkpoints=1,
                                 validation_samples=0)
    t0 = time.monotonic()

    def on_event(kind: str, data: dict) -> None:
        if kind == "round_end":
            eps = (data.get("privacy") or {}).get("epsilon")
            print(f"[{name}] round {data['round']}: {time.monotonic() - t0:.0f} s"
                  + (f", epsilon {eps:.3f}" if eps is not None else ""), flush=True)

    run = asyncio.run(run_emulation(fleet, config, on_event=on_event, data_root=args.data_root,
                                    stderr_dir=tmp / name / "logs", workers=args.workers))
    last = run.history[-1]
    privacy = last.get("privacy") or {}
    return {"run": name, "fleet": fleet_kind, "target_epsilon": epsilon, "noise": None if epsilon is None else noise,
            "rounds": last["round"],
            "accuracy": last.get("accuracy"), "epsilon": privacy.get("epsilon"),
            "block_epsilons": privacy.get("blocks"), "noise_multiplier": privacy.get("noise_multiplier"),
            "noise_per_coordinate": privacy.get("noise_stddev"), "expected_cohorts": privacy.get("expected_cohorts"),
            "block_multipliers": privacy.get("multipliers"),
            "expected_survivors": args.expected_survivors if noise == "distributed" and epsilon is not None else None,
            "wall_s": round(time.monotonic() - t0, 1)}


def markdown(results: list[dict], args: argparse.Namespace) -> str:
    lines = ["| fleet | noise | target epsilon | accuracy | model epsilon | block epsilons (fc1, head) | z | "
             "noise per coordinate of the mean (fc1, head) | wall s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        blocks = r["block_epsilons"] or {}
        noise = r["noise_per_coordinate"] or {}
        acc = "-" if r["accuracy"] is None else f"{r['accuracy']:.4f}"
        lines.append(
            f"| {r['fleet']} | {r.get('noise') or '-'} | "
            f"{'non-private' if r['target_epsilon'] is None else r['target_epsilon']:} | {acc} | "
            f"{'-' if r['epsilon'] is None else format(r['epsilon'], '.3f')} | "
            f"{', '.join(format(v, '.3f') for v in blocks.values()) or '-'} | "
            f"{'-' if r['noise_multiplier'] is None else format(r['noise_multiplier'], '.3f')} | "
            f"{', '.join(format(v, '.2e') for v in noise.values()) or '-'} | {r['wall_s']} |")
    head = (f"`python bench/dp_utility.py --devices {args.devices} --rounds {args.rounds} --fraction {args.fraction} "
            f"--epsilons {args.epsilons} --fleets {args.fleets} --noise {args.noise}"
            + (f" --expected-survivors {args.expected_survivors}" if args.expected_survivors is not None else "")
            + "`: mnist_2nn on MNIST (IID), "
            f"{args.devices} devices, {round(args.fraction * args.devices)} per round, {args.rounds} rounds, "
            f"clip {args.clip}, delta 1e-5, fixed-size cohorts (RDP).")
    return head + "\n\n" + "\n".join(lines) + "\n"


def workload_arguments(ap: argparse.ArgumentParser) -> None:
    """The workload's options (:func:`case_fleet`), shared with ``bench/dp_ftrl.py``."""
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--epsilons", default="1,2,4,8")
    ap.add_argument("--fleets", default="mixed,allstrong")
    ap.add_argument("--eval-limit", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=None)


def keep(ctx: Context, results: list[dict], result: dict, table: Callable[[list[dict]], str]) -> dict:
    """Add one run's ``result`` and write them all (json, and ``table``'s markdown) after every run: a
    stopped invocation keeps what it measured."""
    results.append(result)
    print(json.dumps(result), flush=True)
    doc = ctx.write(results, quiet=True)
    ctx.out.with_suffix(".md").write_text(table(results))
    return doc


def arguments(ap: argparse.ArgumentParser) -> None:
    workload_arguments(ap)
    ap.add_argument("--noise", default="central,distributed",
                    help="who adds the noise: central (the server) and/or distributed (the devices, in secure rounds)")
    ap.add_argument("--expected-survivors", type=float, default=None,
                    help="distributed: the share of each block's cohort the devices' noise is sized for "
                         "(dp_expected_survivors; default: the server's, dp_min_survivors)")


def run(ctx: Context) -> dict:
    args = ctx.args
    epsilons = [None, *parse_list(args.epsilons, float)]
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="dp-utility-") as tmp:
        for fleet_kind in parse_list(args.fleets):
            for eps in epsilons:
                for noise in (["central"] if eps is None else parse_list(args.noise)):
                    doc = keep(ctx, results, run_one(fleet_kind, eps, args, Path(tmp), noise),
                               lambda rs: markdown(rs, args))
    print(markdown(results, args))
    return doc


CASE = Case("dp_utility", __doc__, run, arguments=arguments, data_root=True,
            quick={"devices": 20, "rounds": 1, "fraction": 0.5, "epsilons": "8", "fleets": "mixed",
                   "noise": "central", "eval_limit": 200})


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
