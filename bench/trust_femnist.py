"""What direction trust and the server's other default checks cost an honest non-IID fleet: the
FEMNIST 75%-weak fleet (``profiles/fleets/femnist-75weak.toml``: 4 strong devices at split 0, 12 weak
at split 3, natural writer split, 25% a round) in the lightweight emulation, with the server's
defaults (norm bound, direction trust, weight cap, round validation) against the fleet file's
paper settings (all of them off), per seed: the mean test accuracy of the last five rounds and the
run's wall time.

Not a test: ``python bench/trust_femnist.py [--rounds 30] [--seeds 0,1,2]`` prints a table and writes
``bench/results/trust_femnist.json``. Needs FEMNIST under ``$EDGETRAIN_DATA``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, interleave, ratio_summary  # noqa: E402
from bench.harness.fleets import derive, write_fleet  # noqa: E402

FLEET = "femnist-75weak"
#: The fleet's settings that turn the server's checks off (a paper's aggregation); "defaults" puts them back
#: to the server's defaults.
CHECKS_OFF = {"training": ("norm_bound", "direction_trust", "max_loss_rise"), "strategy": ("max_weight_share",)}
LANES = ("defaults", "off")


def fleet_for(seed: int, defaults: bool):
    """The shipped fleet in the lightweight emulation at ``seed``; with ``defaults``, the server's checks on."""
    from emulator.fleet import load_fleet

    back = {table: dict.fromkeys(keys) for table, keys in CHECKS_OFF.items()} if defaults else {}
    return derive(load_fleet(FLEET), fleet={"seed": seed}, emulation={"mode": "lightweight"}, **back)


def run_one(tmp: Path, seed: int, defaults: bool, rounds: int) -> dict:
    name = f"{'defaults' if defaults else 'off'}-{seed}"
    fleet = write_fleet(fleet_for(seed, defaults), tmp / f"{name}.toml")
    out = tmp / name
    t0 = time.monotonic()
    subprocess.run([str(Path(sys.executable).parent / "edgetrain"), "emulate", "--fleet", str(fleet), "--rounds", str(rounds),
                    "--out", str(out)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    metrics = json.loads(next(out.rglob("metrics.json")).read_text())
    acc = [h["accuracy"] for h in metrics["rounds"] if "accuracy" in h]
    row = {"run": name, "lane": "defaults" if defaults else "off", "seed": seed, "defaults": defaults,
           "last5": round(100 * sum(acc[-5:]) / len(acc[-5:]), 2), "final": round(100 * acc[-1], 2),
           "wall_s": round(wall, 1), "emulate_wall_s": round(metrics["wall_s"], 1)}
    print(json.dumps(row), flush=True)
    return row


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=30)


def run(ctx: Context) -> dict:
    seeds = ctx.seeds
    rows = []
    with tempfile.TemporaryDirectory() as tmp:  # a seed's two lanes side by side, the first lane alternating
        for rep, lane in interleave(LANES, len(seeds)):
            rows.append(run_one(Path(tmp), seeds[rep], lane == "defaults", ctx.args.rounds))
    print("\n| seed | checks off (%) | defaults (%) | points | wall off (s) | wall defaults (s) | ratio |")
    for seed in seeds:
        on, off = (next(r for r in rows if r["seed"] == seed and r["defaults"] is d) for d in (True, False))
        print(f"| {seed} | {off['last5']} | {on['last5']} | {on['last5'] - off['last5']:+.2f} | {off['wall_s']} | "
              f"{on['wall_s']} | {on['wall_s'] / off['wall_s']:.2f} |")
    return ctx.write(rows, {"rounds": ctx.args.rounds, "seeds": seeds},
                     {"wall_s_ratio": ratio_summary(rows, "wall_s", "off", pair=("seed",))})


CASE = Case("trust_femnist", __doc__, run, arguments=arguments, seeds="0,1,2", quick={"rounds": 2, "seeds": "0"},
            metrics=("last5", "final", "wall_s"), group_by=("lane",))


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
