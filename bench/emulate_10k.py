"""A fleet of 10,000 training devices emulated on one machine (the emulator's lightweight mode).

The fleet: ``--devices`` (10,000) devices of one class, the real device client each over its own
websocket to one orchestrator in this process, dealt over ``--workers`` worker processes
(:mod:`emulator.lightweight`); ``--per-round`` (100) of them sampled per round, training
``mnist_cnn`` on IID shards of MNIST's training split (6 images each at 10,000 devices) for
``--steps`` local batches of ``--batch``; FedAvg with the server's default checks (the reference
update for the norm bound and direction trust, validation before commit).

It reports:

- creating the fleet: seconds from the emulator's start to the workers' runtimes and shards loaded,
  to the server listening, to the last device's registration (every device connected, planned and
  welcomed);
- memory: each worker's resident set with its runtimes loaded, once every device is connected, and
  its peak; per idle device ((connected - ready) / devices) and per training device ((peak -
  connected) / the tails a worker trains at once); the peak over the run of the sum of the resident
  sets and of the proportional sets (PSS: shared pages counted once) of every process of the run
  (the server and its workers), sampled every 2 s;
- per round: its wall time, the server's CPU and the workers' CPU (between the round's start and its
  end), the devices that reported; every round must complete.

Usage: ``.venv/bin/python bench/emulate_10k.py [--devices 10000] [--per-round 100] [--rounds 3]
[--workers 2] [--steps 5] [--batch 32]``; ``--quick`` runs 200 devices, 20 a round, 2 rounds.
Needs MNIST under ``$EDGETRAIN_DATA`` (or ``--data-root``). Writes ``bench/results/emulate_10k.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
for _p in (ROOT, BENCH):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from bench.harness import Case, Context  # noqa: E402
from bench.harness.fleets import build_fleet, group  # noqa: E402
from bench.vs_flower import TreeWatch, _round_recorder, device_memory  # noqa: E402

MIB = 2**20


def fleet_of(args: argparse.Namespace):
    return build_fleet("emulate-10k", model="mnist_cnn", dataset="mnist", seed=args.seed,
                       description="bench/emulate_10k.py: a large fleet of training devices, lightweight mode",
                       partition={"scheme": "iid", "seed": args.seed},
                       emulation={"mode": "lightweight", "memory_cap": "none", "throttle_cpu": False},
                       groups=[group("mid-phone", args.devices, "dev", budget="4GiB")])


def server_config(args: argparse.Namespace, store: Path):
    from orchestrator.config import ServerConfig

    n = args.devices
    return ServerConfig(model="mnist_cnn", strategy="fedavg", rounds=args.rounds, fraction=args.per_round / n,
                        min_devices=n, local_steps=args.steps, batch_size=args.batch, lr=args.lr, momentum=0.9,
                        weight_decay=0.0, seed=args.seed, eval_every=args.rounds, eval_data="mnist",
                        data_root=args.data_root, store_dir=store, deadline_s=900, wait_devices_s=3600,
                        max_connections=max(20_000, 2 * n), hello_timeout_s=300)


def emulate(args: argparse.Namespace) -> dict:
    """One run of the fleet: its rounds, its workers and the process tree's memory peaks."""
    import os

    from emulator.lightweight import run_lightweight

    rounds: dict[int, dict] = {}
    marks = {"t_start": time.time()}
    watch = TreeWatch(os.getpid(), None, interval=2.0)  # smaps_rollup of a worker mapping 5,000 shards is not free
    watch.start()
    try:
        with tempfile.TemporaryDirectory(prefix="emulate-10k-") as tmp:
            run = asyncio.run(run_lightweight(fleet_of(args), server_config(args, Path(tmp) / "store"),
                                              on_event=_round_recorder(rounds, marks), data_root=args.data_root,
                                              workers=args.workers, threads=args.threads))
    finally:
        watch.stop.set()
        watch.join()
    marks["t_end"] = time.time()
    return {"rounds": [rounds[r] for r in sorted(rounds)], "history": run.history, "workers": run.workers,
            "status": statistics_of_status([d.status for d in run.devices]), "marks": marks,
            "peak": dict(watch.peak), "samples": watch.samples}


def statistics_of_status(statuses: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in statuses:
        out[s] = out.get(s, 0) + 1
    return out


def report_of(args: argparse.Namespace, res: dict) -> dict:
    marks, workers = res["marks"], res["workers"]
    per_round = []
    for row, metrics in zip(res["rounds"], res["history"]):
        per_round.append({"round": row["round"], "wall_s": metrics.get("round_wall_s"),
                          "server_cpu_s": metrics.get("server_cpu_s"), "workers_cpu_s": metrics.get("workers_cpu_s"),
                          "reported": row.get("reported"), "selected": row.get("selected")})
    warm = per_round[1:] or per_round
    mem = device_memory(workers, args.threads)
    return {
        "devices": args.devices, "per_round": args.per_round, "workers": len(workers),
        "rounds_completed": len(per_round), "rounds_planned": args.rounds,
        "every_round_complete": len(per_round) == args.rounds and all(
            r["reported"] == args.per_round for r in per_round),
        "create": {"listening_s": _since(marks, "t_first_listening"), "first_registered_s": _since(marks, "t_first_registered"),
                   "all_registered_s": _since(marks, "t_last_registered")},
        "rounds": per_round,
        "warm": {k: statistics.median(r[k] for r in warm if r[k] is not None) if any(r[k] is not None for r in warm)
                 else None for k in ("wall_s", "server_cpu_s", "workers_cpu_s")},
        "memory": {**mem, "peak_all_rss_bytes": res["peak"]["all_rss"], "peak_all_pss_bytes": res["peak"]["all_pss"],
                   "peak_server_rss_bytes": res["peak"]["server_rss"], "processes": res["peak"]["processes"]},
        "status": res["status"], "wall_s": marks["t_end"] - marks["t_start"],
    }


def _since(marks: dict, key: str) -> float | None:
    return None if key not in marks else round(marks[key] - marks["t_start"], 1)


def print_report(r: dict) -> None:
    m, c = r["memory"], r["create"]
    print(f"{r['devices']} devices, {r['per_round']} a round, {r['workers']} workers: "
          f"{r['rounds_completed']}/{r['rounds_planned']} rounds, every round complete: {r['every_round_complete']}")
    print(f"  created: listening {c['listening_s']} s, all registered {c['all_registered_s']} s")
    for row in r["rounds"]:
        print(f"  round {row['round']}: {row['wall_s']} s, server CPU {row['server_cpu_s']} s, "
              f"workers CPU {row['workers_cpu_s']} s, {row['reported']} reported")
    idle, train = m["bytes_per_idle_device"], m["bytes_per_training_device"]
    print(f"  memory: idle device {'-' if idle is None else f'{idle / 1024:.1f} KiB'}, training device "
          f"{'-' if train is None else f'{train / MIB:.1f} MiB'}, peak of all processes RSS "
          f"{m['peak_all_rss_bytes'] / MIB:.0f} MiB / PSS {m['peak_all_pss_bytes'] / MIB:.0f} MiB "
          f"({m['processes']} processes), server peak RSS {m['peak_server_rss_bytes'] / MIB:.0f} MiB")
    print(f"  device lives: {r['status']}")


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--per-round", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="worker processes holding the devices")
    ap.add_argument("--threads", type=int, default=2, help="training threads per worker")
    ap.add_argument("--steps", type=int, default=5, help="local batches per round")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)


def run(ctx: Context) -> dict:
    args = ctx.args
    res = emulate(args)
    report = report_of(args, res)
    print_report(report)
    return ctx.write([{"devices": args.devices, **{k: v for k, v in report["warm"].items()}}], report)


CASE = Case("emulate_10k", __doc__, run, arguments=arguments, data_root=True,
            quick={"devices": 200, "per_round": 20, "rounds": 2})


def main(argv: list[str] | None = None) -> dict | None:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
