"""Buffered against synchronous rounds: time to a target accuracy under a heavy-tailed fleet.

N device processes on 127.0.0.1 train FedAvg (MNIST's 2-layer MLP by default) through the real
server, once with synchronous rounds (the server's defaults: every idle device each round, the
straggler grace after half answered) and once with buffered rounds (FedBuff: all N training at
once, a buffer of K updates, 1/sqrt(1 + staleness)). Each device is slowed by a factor drawn from a
Pareto distribution (emulator/speeds.py: its report held back (f - 1) x --base-round-s), the same
factors in both lanes. Every model version is evaluated on the held-out set; the target accuracy is
what the synchronous lane reached at its last round (or --target), and each lane's time to it is the
first wall-clock time after the first round opened that its accuracy reached it. Wasted updates:
a synchronous round's stragglers (cut, their work dropped) and refused reports; a buffered run's
updates refused as too stale, refused, or lost with their device.

--base-round-s is the delay's unit: set it to what a factor-1 device's round takes on the machine
(about 0.5 s for the default workload on the shared 2-core machine: with a 2 s unit a buffered run's
first version, the updates of the K = 3 fastest devices, factors 1.11-1.12 and so held back 0.24 s, came
0.6 s after the first buffer opened), or the fleet is not the distribution drawn: a unit far below the
real round dilutes the tail (a factor-30 device is then only a few times slower), one far above
stretches it (a factor-1.6 device several times slower). A buffer folds
exactly K updates (the K-th closes it; on a loaded server several reports arriving together were all
folded into one buffer, and the buffered lane ran as synchronous rounds of more devices), and a run ends
when its last version is made (a report then waiting for a buffer is answered: before, it kept the server
from closing and the buffered lane never finished).

    python bench/buffered.py --data-root "$EDGETRAIN_DATA" [--devices 12 --rounds 8 --seeds 0 --base-round-s 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context  # noqa: E402
from bench.harness.timeline import AccuracyTimeline, time_to_target  # noqa: E402
from emulator.faults import Faults  # noqa: E402
from emulator.localfleet import DeviceLaunch, run_local_fleet  # noqa: E402
from emulator.speeds import report_delays, speed_factors  # noqa: E402
from orchestrator.config import ServerConfig  # noqa: E402

LANES = ("synchronous", "buffered")


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="mnist_2nn")
    ap.add_argument("--data", default="mnist")
    ap.add_argument("--devices", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=8, help="synchronous rounds (buffered: as many updates)")
    ap.add_argument("--buffer-size", type=int, default=3)
    ap.add_argument("--local-steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--base-round-s", type=float, default=1.0, help="a factor-1 device's round (the delay's unit)")
    ap.add_argument("--pareto-shape", type=float, default=1.5)
    ap.add_argument("--cap", type=float, default=30.0, help="largest slowdown factor")
    ap.add_argument("--target", type=float, default=None, help="target accuracy (default: synchronous final)")
    ap.add_argument("--logs", type=Path, default=None, help="folder for the devices' stderr, per lane and seed")


def _config(args: argparse.Namespace, lane: str, store: Path, seed: int, data_root: str | None) -> ServerConfig:
    common = dict(model=args.model, eval_data=args.data, data_root=data_root, strategy="fedavg", min_devices=args.devices,
                  local_steps=args.local_steps, lr=args.lr, seed=seed, store_dir=store, deadline_s=600,
                  wait_devices_s=600, eval_every=1)
    if lane == "synchronous":
        return ServerConfig(rounds=args.rounds, **common)
    updates = args.rounds * args.devices
    return ServerConfig(rounds=math.ceil(updates / args.buffer_size), round_mode="buffered",
                        concurrency=args.devices, buffer_size=args.buffer_size, **common)


def _lane(args: argparse.Namespace, lane: str, seed: int, data_root: str | None) -> dict:
    """One run: its accuracy over wall-clock time and the updates it wasted."""
    budget = 1 << 30  # every device strong: FedAvg trains the whole model (its shard of MNIST counted)
    ids = [f"d{i:03d}" for i in range(args.devices)]
    delays = report_delays(speed_factors(ids, shape=args.pareto_shape, seed=seed, cap=args.cap), args.base_round_s)
    launches = [DeviceLaunch(d, budget, client=i, num_clients=args.devices, data=args.data, seed=seed,
                             faults=Faults(delay_s=delays[d])) for i, d in enumerate(ids)]
    recorder = AccuracyTimeline(f"{lane} seed {seed} (rounds are versions)")
    timeline = recorder.points

    with tempfile.TemporaryDirectory() as tmp:
        run = asyncio.run(run_local_fleet(_config(args, lane, Path(tmp) / "store", seed, data_root), launches,
                                          on_event=recorder.on_event, data_root=data_root,
                                          stderr_dir=args.logs / f"{lane}-{seed}" if args.logs else None))
    wasted = sum(len(r.get("stragglers", [])) + int(r.get("rejected", 0)) for r in run.history) \
        if lane == "synchronous" else sum(int(r.get("wasted_total", 0)) for r in run.history)
    folded = sum(int(r.get("buffered" if lane == "buffered" else "reported", 0)) for r in run.history)
    return {"lane": lane, "seed": seed, "timeline": timeline, "final_accuracy": timeline[-1][1] if timeline else None,
            "wall_s": timeline[-1][0] if timeline else None, "versions": len(run.history), "wasted_updates": wasted,
            "folded_updates": folded, "slowest_factor": max(1 + d / args.base_round_s for d in delays.values())}


def run(ctx: Context) -> dict:
    args = ctx.args
    runs = [_lane(args, lane, seed, ctx.data_root) for seed in ctx.seeds for lane in LANES]
    for r in runs:
        sync = next(x for x in runs if x["seed"] == r["seed"] and x["lane"] == "synchronous")
        target = args.target if args.target is not None else sync["final_accuracy"]
        r["target"] = target
        r["time_to_target_s"] = time_to_target(r["timeline"], target)
    report = {}
    for seed in ctx.seeds:
        s, b = (next(x for x in runs if x["seed"] == seed and x["lane"] == lane) for lane in LANES)
        ratio = b["time_to_target_s"] / s["time_to_target_s"] if b["time_to_target_s"] and s["time_to_target_s"] else None
        report[f"seed {seed}"] = {"target": s["target"], "buffered_over_synchronous_time": ratio}
        print(f"seed {seed}: target {s['target']:.4f}; synchronous {s['time_to_target_s']} s "
              f"(final {s['final_accuracy']:.4f}, {s['wasted_updates']} wasted), buffered {b['time_to_target_s']} s "
              f"(final {b['final_accuracy']:.4f}, {b['wasted_updates']} wasted); ratio {ratio}", flush=True)
    ctx.write(runs, report)
    return report


CASE = Case("buffered", __doc__, run, arguments=arguments, seeds="0", data_root=True,
            quick={"model": "digits_mlp", "data": "digits", "devices": 4, "rounds": 2, "buffer_size": 2,
                   "local_steps": 5, "base_round_s": 0.5},
            metrics=("time_to_target_s", "final_accuracy", "wasted_updates", "wall_s"), group_by=("lane",))


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
