"""Pacing slow devices against cutting them: whose updates a synchronous run folds, and its accuracy.

N device processes on 127.0.0.1 train FedAvg (the digits MLP by default) through the real server under
the default straggler policy (grace: once half the cohort answered, 10 s more). --slow of them take
--slow-step-s per local step (the emulator's step_delay_s fault: their backend sleeps per step, so
fewer steps finish sooner), the rest --fast-step-s; --local-steps at the slow pace take longer than
the grace. The slow devices hold the classes the others lack (--slow-classes), so whether their
updates are folded shows in the accuracy. Two lanes, the same fleet: ``paced`` (the server's default,
``straggler_pacing`` on: a device measured too slow is asked for the steps that fit) and ``cut``
(``--no-straggler-pacing``: the grace cuts it every round it is selected). Per lane: rounds in which
a slow device's update was folded and in which one was cut, the accuracy after every round, the
final accuracy, the run's wall time from its first round, and the time to the target accuracy (the
``cut`` lane's final, or --target).

    python bench/pacing.py [--devices 6 --slow 2 --rounds 10 --seeds 0]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, parse_list  # noqa: E402
from bench.harness.timeline import AccuracyTimeline, time_to_target  # noqa: E402
from emulator.faults import Faults  # noqa: E402
from emulator.localfleet import DeviceLaunch, run_local_fleet  # noqa: E402
from orchestrator.config import ServerConfig  # noqa: E402

LANES = ("paced", "cut")


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="digits_mlp")
    ap.add_argument("--data", default="digits")
    ap.add_argument("--devices", type=int, default=6)
    ap.add_argument("--slow", type=int, default=2, help="how many of the devices are slow")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--fast-step-s", type=float, default=0.1, help="seconds a fast device's local step is slowed by")
    ap.add_argument("--slow-step-s", type=float, default=2.0, help="seconds a slow device's local step is slowed by")
    ap.add_argument("--slow-classes", default="8,9", help="the classes only the slow devices hold")
    ap.add_argument("--target", type=float, default=None, help="target accuracy (default: the cut lane's final)")


def _launches(args: argparse.Namespace, seed: int) -> list[DeviceLaunch]:
    slow_classes = parse_list(args.slow_classes, int)
    fast_classes = tuple(c for c in range(10) if c not in slow_classes)
    out = []
    for i in range(args.devices):
        slow = i >= args.devices - args.slow
        out.append(DeviceLaunch(f"{'slow' if slow else 'fast'}-{i}", 1 << 30, client=i, num_clients=args.devices,
                                data=args.data, seed=seed, classes=tuple(slow_classes) if slow else fast_classes,
                                faults=Faults(step_delay_s=args.slow_step_s if slow else args.fast_step_s)))
    return out


def _lane(args: argparse.Namespace, lane: str, seed: int, data_root: str | None) -> dict:
    """One run: which rounds folded or cut a slow device, and the accuracy over wall-clock time."""
    recorder = AccuracyTimeline(f"{lane} seed {seed}",
                                lambda d: f"stragglers {d.get('stragglers')}, paced {d.get('paced', {})}")
    timeline = recorder.points

    with tempfile.TemporaryDirectory() as tmp:
        config = ServerConfig(model=args.model, eval_data=args.data, data_root=data_root, strategy="fedavg",
                              rounds=args.rounds, min_devices=args.devices, local_steps=args.local_steps, lr=args.lr,
                              seed=seed, store_dir=Path(tmp) / "store", wait_devices_s=600, eval_every=1,
                              straggler_pacing=lane == "paced")
        run = asyncio.run(run_local_fleet(config, _launches(args, seed), on_event=recorder.on_event, data_root=data_root))
    slow_ids = {d for d in run.device_events if d.startswith("slow")}
    folded = sorted({e["round"] for d in slow_ids for e in run.device_events[d]
                     if e.get("event") == "round_done" and e.get("accepted")})
    cut = [r["round"] for r in run.history if slow_ids & set(r.get("stragglers", []))]
    return {"lane": lane, "seed": seed, "timeline": timeline, "final_accuracy": timeline[-1][1] if timeline else None,
            "wall_s": timeline[-1][0] if timeline else None, "slow_folded_rounds": folded,
            "slow_cut_rounds": cut, "rounds_folding_slow": len(folded), "rounds_cutting_slow": len(cut),
            "paced": {r["round"]: r["paced"] for r in run.history if r.get("paced")}}


def run(ctx: Context) -> dict:
    args = ctx.args
    runs = [_lane(args, lane, seed, ctx.data_root) for seed in ctx.seeds for lane in LANES]
    report = {}
    for seed in ctx.seeds:
        p, c = (next(x for x in runs if x["seed"] == seed and x["lane"] == lane) for lane in LANES)
        target = args.target if args.target is not None else c["final_accuracy"]
        for r in (p, c):
            r["target"] = target
            r["time_to_target_s"] = time_to_target(r["timeline"], target)
        report[f"seed {seed}"] = {
            "target": target, **{f"{r['lane']}_{k}": r[k] for r in (p, c)
                                 for k in ("final_accuracy", "wall_s", "time_to_target_s", "rounds_folding_slow",
                                           "rounds_cutting_slow")}}
        print(f"seed {seed}: paced final {p['final_accuracy']:.4f} in {p['wall_s']:.1f} s (slow folded in "
              f"{p['rounds_folding_slow']} rounds, cut in {p['rounds_cutting_slow']}); cut final "
              f"{c['final_accuracy']:.4f} in {c['wall_s']:.1f} s (slow folded in {c['rounds_folding_slow']}, cut in "
              f"{c['rounds_cutting_slow']}); paced reached {target:.4f} at {p['time_to_target_s']} s, "
              f"cut at {c['time_to_target_s']} s", flush=True)
    ctx.write(runs, report)
    return report


CASE = Case("pacing", __doc__, run, arguments=arguments, seeds="0", data_root=True,
            quick={"devices": 3, "slow": 1, "rounds": 3, "local_steps": 5, "slow_step_s": 3.0},
            metrics=("final_accuracy", "wall_s", "time_to_target_s", "rounds_folding_slow", "rounds_cutting_slow"),
            group_by=("lane",))


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
