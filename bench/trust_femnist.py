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
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "profiles" / "fleets" / "femnist-75weak.toml"
#: The fleet file's lines that turn the server's checks off (a paper's aggregation); "defaults" drops them.
CHECKS_OFF = ("norm_bound = 0.0", "direction_trust = false", "max_loss_rise = 0.0", "max_weight_share = 1.0")


def fleet_text(seed: int, defaults: bool) -> str:
    text = FLEET.read_text().replace('mode = "processes"', 'mode = "lightweight"')
    text = re.sub(r"^seed = \d+$", f"seed = {seed}", text, count=1, flags=re.M)
    if defaults:
        text = "\n".join(line for line in text.splitlines() if line.strip() not in CHECKS_OFF) + "\n"
    return text


def run(tmp: Path, seed: int, defaults: bool, rounds: int) -> dict:
    name = f"{'defaults' if defaults else 'off'}-{seed}"
    fleet = tmp / f"{name}.toml"
    fleet.write_text(fleet_text(seed, defaults))
    out = tmp / name
    t0 = time.monotonic()
    subprocess.run([str(Path(sys.executable).parent / "edgetrain"), "emulate", "--fleet", str(fleet), "--rounds", str(rounds),
                    "--out", str(out)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    metrics = json.loads(next(out.rglob("metrics.json")).read_text())
    acc = [h["accuracy"] for h in metrics["rounds"] if "accuracy" in h]
    row = {"run": name, "seed": seed, "defaults": defaults, "last5": round(100 * sum(acc[-5:]) / len(acc[-5:]), 2),
           "final": round(100 * acc[-1], 2), "wall_s": round(wall, 1), "emulate_wall_s": round(metrics["wall_s"], 1)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seeds", default="0,1,2")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            rows += [run(Path(tmp), seed, True, args.rounds), run(Path(tmp), seed, False, args.rounds)]
    print("\n| seed | checks off (%) | defaults (%) | points | wall off (s) | wall defaults (s) | ratio |")
    for seed in seeds:
        on, off = (next(r for r in rows if r["seed"] == seed and r["defaults"] is d) for d in (True, False))
        print(f"| {seed} | {off['last5']} | {on['last5']} | {on['last5'] - off['last5']:+.2f} | {off['wall_s']} | "
              f"{on['wall_s']} | {on['wall_s'] / off['wall_s']:.2f} |")
    out = {"rounds": args.rounds, "seeds": seeds, "date": time.strftime("%Y-%m-%d"), "runs": rows}
    (Path(__file__).parent / "results" / "trust_femnist.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
