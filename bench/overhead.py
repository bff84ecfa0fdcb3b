"""Orchestrator overhead: the server's own time per round against the devices' compute time.

A fleet of 16 device processes (4 strong, 4 moderate, 8 weak) trains ``digits_mlp`` on 127.0.0.1.
Per round it reports the server's CPU time (exporting and encoding payloads, streaming them,
decoding and folding updates, aggregating, checkpointing; evaluation excluded) and the devices'
compute (multi-step forward + local training, summed over the devices that reported), and their
ratio. Not a test: run it on a quiet machine, ``python bench/overhead.py [--rounds 3]``.
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

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.harness import Case, Context, stats  # noqa: E402
from emulator.localfleet import DeviceLaunch, role_budgets, run_local_fleet  # noqa: E402
from orchestrator.config import ServerConfig  # noqa: E402


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="digits_mlp")
    ap.add_argument("--local-steps", type=int, default=10)


def run(ctx: Context) -> dict:
    args = ctx.args
    budgets = role_budgets(args.model)
    roles = ["strong"] * 4 + ["moderate"] * 4 + ["weak"] * 8
    launches = [DeviceLaunch(f"{r}-{i:02d}", budgets[r], client=i, num_clients=len(roles)) for i, r in enumerate(roles)]
    with tempfile.TemporaryDirectory() as tmp:
        config = ServerConfig(model=args.model, rounds=args.rounds, min_devices=len(roles), local_steps=args.local_steps,
                              store_dir=Path(tmp) / "store", deadline_s=600, wait_devices_s=600)
        fleet_run = asyncio.run(run_local_fleet(config, launches))
    rows = []
    for r in fleet_run.history:
        compute = 0.0
        for events in fleet_run.device_events.values():
            for e in events:
                if e.get("event") == "round_done" and e.get("round") == r["round"]:
                    compute += float(e.get("forward_s", 0)) + float(e.get("train_s", 0))
        rows.append({"round": r["round"], "server_cpu_s": r["server_cpu_s"], "device_compute_s": compute,
                     "round_wall_s": r["round_wall_s"], "ratio": r["server_cpu_s"] / compute if compute else None})
    table = Table(title=f"orchestrator overhead, {len(roles)} devices, {args.model}")
    for col in ("round", "server CPU s", "device compute s (sum)", "round wall s", "server / devices"):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(str(row["round"]), f"{row['server_cpu_s']:.3f}", f"{row['device_compute_s']:.2f}",
                      f"{row['round_wall_s']:.2f}", f"{row['ratio']:.3f}" if row["ratio"] is not None else "-")
    Console().print(table)
    median = stats(r["ratio"] for r in rows).get("median")
    print(f"median server/devices ratio: {median:.3f}" if median is not None else "no round with device compute")
    return ctx.write(rows, {"devices": len(roles), "model": args.model, "median_ratio": median})


CASE = Case("overhead", __doc__, run, arguments=arguments, quick={"rounds": 1, "local_steps": 2},
            metrics=("ratio", "server_cpu_s", "device_compute_s", "round_wall_s"))


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
