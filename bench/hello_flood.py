"""What a hello flood costs an honest fleet: the wall time of flooded rounds against quiet ones.

Three enrolled device processes train digits_mlp through a real ``serve`` with credentials required;
through rounds --flood-from to --flood-to a separate process (``tests/flood.py``) keeps --connections
connections saying hellos with forged proofs and made-up budgets, each answered with a refusal and
journaled. Per run: every round's wall time, flooded or quiet, the devices that reported in each,
and the refusals journaled. The report gives the median flooded and quiet round and their ratio, per
repeat and over all (the flood's own process takes one of the machine's cores, so on 2 cores the
ratio includes that). ``tests/test_lifecycle.py`` holds what must not change under a flood (every
round closes with all three devices, every refusal journaled); the time it costs is measured here.

    python bench/hello_flood.py [--repeats 3 --connections 100 --rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context  # noqa: E402
from tests.flood import flooded_fleet  # noqa: E402

DEVICES = 3


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--connections", type=int, default=100, help="connections the flood keeps saying hellos")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--flood-from", type=int, default=3, help="the flood starts as this round starts (1-based)")
    ap.add_argument("--flood-to", type=int, default=4, help="and stops as this round ends")


def run(ctx: Context) -> dict:
    args = ctx.args
    runs, table = [], []
    for repeat in range(ctx.repeats):
        with tempfile.TemporaryDirectory(prefix="edgetrain-flood-") as tmp:
            flood = asyncio.run(flooded_fleet(Path(tmp), rounds=args.rounds, flood_from=args.flood_from,
                                              flood_to=args.flood_to, connections=args.connections,
                                              devices=DEVICES, data_root=ctx.data_root))
        history, refused, codes = flood.history, flood.refused, flood.exit_codes
        walls = {"flooded": [], "quiet": []}
        for h in history:
            if h["round"] == 1:
                continue  # the first round builds what later rounds reuse (exports, plans)
            kind = "flooded" if args.flood_from <= h["round"] <= args.flood_to else "quiet"
            walls[kind].append(h["round_wall_s"])
            runs.append({"repeat": repeat, "round": h["round"], "lane": kind, "round_wall_s": h["round_wall_s"],
                         "reported": h["reported"], "refused": refused, "device_exit_codes": codes})
        quiet, flooded = statistics.median(walls["quiet"]), statistics.median(walls["flooded"])
        table.append({"repeat": repeat, "quiet_s": round(quiet, 2), "flooded_s": round(flooded, 2),
                      "ratio": round(flooded / quiet, 3), "extra_s": round(flooded - quiet, 2),
                      "reported": [h["reported"] for h in history], "refused": refused})
        print(f"repeat {repeat}: quiet {quiet:.2f} s, flooded {flooded:.2f} s ({flooded / quiet:.2f}x), "
              f"reported {[h['reported'] for h in history]}, refusals journaled {refused}", flush=True)
    return ctx.write(runs, {"repeats": table})


CASE = Case("hello_flood", __doc__, run, arguments=arguments, repeats=3, data_root=True,
            quick={"rounds": 4, "flood_from": 2, "flood_to": 3, "connections": 20, "repeats": 1},
            metrics=("round_wall_s",), group_by=("lane",))


def main(argv=None):
    return CASE.main(argv)


if __name__ == "__main__":
    main()
