"""Server memory over a long run: an honest fleet of device processes trains digits_mlp for many
rounds and the orchestrator's resident set is read after every round.

Three devices, one per EmbracingFL role (strong, moderate, weak: the weak and moderate ones are sent
frozen chunks of every new model version, so each round exports, checks and serves new chunks), run
as OS processes against an orchestrator in this process (``run_local_fleet``). It reports the
server's RSS at rounds 1, 20, 50, 100, ... and the last, and the ratio last / round 20 (target at
most 1.10). Not a test: ``python bench/memory_flat.py [--rounds 200]``; writes
``bench/results/memory_flat.json``.
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

from bench.harness import Case, Context  # noqa: E402
from edge_sdk.memory import rss_bytes  # noqa: E402
from emulator.localfleet import DeviceLaunch, role_budgets, run_local_fleet  # noqa: E402
from orchestrator.config import ServerConfig  # noqa: E402


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--local-steps", type=int, default=1)


def run(ctx: Context) -> dict:
    args = ctx.args
    rss: dict[int, float] = {}

    def on_event(kind: str, data: dict) -> None:
        if kind == "round_end":
            rss[data["round"]] = rss_bytes() / 2**20
            if data["round"] % 10 == 0:
                print(f"round {data['round']}: server RSS {rss[data['round']]:.1f} MiB", flush=True)

    budgets = role_budgets("digits_mlp")
    devices = [DeviceLaunch(f"{role}-0", budgets[role], i, 3) for i, role in enumerate(("strong", "moderate", "weak"))]
    with tempfile.TemporaryDirectory() as store:
        config = ServerConfig(model="digits_mlp", rounds=args.rounds, min_devices=3, local_steps=args.local_steps,
                              eval_every=10, store_dir=Path(store))
        asyncio.run(run_local_fleet(config, devices, on_event=on_event))
    last = max(rss)
    marks = sorted({1, 20, *range(50, last + 1, 50), last} & set(rss))
    report = {"rounds": last, "rss_mib": {r: round(rss[r], 1) for r in marks},
              "last_over_round_20": round(rss[last] / rss[20], 3) if 20 in rss else None}
    print(report)
    return ctx.write([{"round": r, "rss_mib": round(v, 2)} for r, v in sorted(rss.items())], report)


CASE = Case("memory_flat", __doc__, run, arguments=arguments, quick={"rounds": 3})


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
