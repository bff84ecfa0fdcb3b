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
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from emulator.localfleet import DeviceLaunch, role_budgets, run_local_fleet  # noqa: E402
from orchestrator.config import ServerConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="digits_mlp")
    ap.add_argument("--local-steps", type=int, default=10)
    args = ap.parse_args()
    budgets = role_budgets(args.model)
    roles = ["strong"] * 4 + ["moderate"] * 4 + ["weak"] * 8
    launches = [DeviceLaunch(f"{r}-{i:02d}", budgets[r], client=i, num_clients=len(roles)) for i, r in enumerate(roles)]
    with tempfile.TemporaryDirectory() as tmp:
        config = ServerConfig(model=args.model, rounds=args.rounds, min_devices=len(roles), local_steps=args.local_steps,
                              store_dir=Path(tmp) / "store", deadline_s=600, wait_devices_s=600)
        run = asyncio.run(run_local_fleet(config, launches))
    rows = []
    for r in run.history:
        compute = 0.0
        for events in run.device_events.values():
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
    median = statistics.median(r["ratio"] for r in rows if r["ratio"] is not None)
    print(f"median server/devices ratio: {median:.3f}")
    out = Path(__file__).parent / "results" / "overhead.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"devices": len(roles), "model": args.model, "rounds": rows, "median_ratio": median}, indent=2))


if __name__ == "__main__":
    main()
