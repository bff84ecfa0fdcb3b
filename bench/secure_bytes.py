"""Compressed secure uploads: bytes of a masked upload and accuracy, the 32-bit ring beside q-bit values.

Each case is one ``edgetrain emulate`` run (a child process, the lightweight mode: the real
:class:`edge_sdk.client.DeviceClient` over websockets on 127.0.0.1 against the real orchestrator)
of ``digits_mlp`` (4 blocks, 8.5M parameters) on scikit-learn's digits, split Dirichlet 0.5, 8
devices training the whole model, every device every round (``fraction = 1``), FedAvg, 10 local steps
of batch 32, lr 0.05, momentum 0.9, ``secure_aggregation`` with ``secure_clip`` 1.0, the server's norm
bound and direction trust off (they need updates in the clear), 8 rounds. Two modes: ``float`` (the
32-bit ring, int32 words: ``secure_value_bits = 0``) and ``qN`` (``secure_value_bits = N``: N-bit
values, the ring b = bit_length(8 (2^(N-1) - 1)) + 1 bits, the words packed at b bits), each with
seeds 0, 1, 2 (the fleet's seed: model, partition, cohorts).

Per case it reports the bytes of the masked uploads (the server's per-device byte count of the
``update`` payload, the masked words' frame) per device-round, over the float32 update's bytes (4
per parameter), and the accuracy (mean of the last 3 rounds). ``python bench/secure_bytes.py`` writes
``bench/results/secure_bytes.json``; ``--modes`` (``float,q7``), ``--seeds`` (``0,1,2``), ``--rounds`` (8) size it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, parse_list  # noqa: E402
from bench.harness.fleets import build_fleet, fleet_toml, group  # noqa: E402

DEVICES = 8
#: digits_mlp's parameters (64*2048 + 2048 + 2 * (2048*2048 + 2048) + 2048*10 + 10), 4 bytes each in float32.
PARAMETERS = 64 * 2048 + 2048 + 2 * (2048 * 2048 + 2048) + 2048 * 10 + 10
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1",
       "EDGETRAIN_TORCH_DEVICE": "cpu"}


def value_bits(mode: str) -> int:
    """``float`` -> 0 (the 32-bit ring), ``qN`` -> N."""
    return 0 if mode == "float" else int(mode.removeprefix("q"))


def fleet_text(mode: str, seed: int, rounds: int) -> str:
    fleet = build_fleet(
        f"secure-bytes-{mode}", model="digits_mlp", dataset="digits", seed=seed,
        description="bench/secure_bytes.py: digits_mlp, 8 devices, secure aggregation",
        training={"strategy": "fedavg", "rounds": rounds, "fraction": 1.0, "local_steps": 10, "batch_size": 32,
                  "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4, "norm_bound": 0.0, "direction_trust": False,
                  "max_loss_rise": 0.0, "secure_aggregation": True, "secure_clip": 1.0,
                  "secure_value_bits": value_bits(mode)},
        partition={"scheme": "dirichlet", "alpha": 0.5},
        emulation={"mode": "lightweight", "memory_cap": "none", "timeout_s": 1800, "throttle_cpu": False},
        groups=[group("mid-phone", DEVICES, "strong")])
    return fleet_toml(fleet, "bench/secure_bytes.py's fleet")


def masked_bytes(rounds: list[dict]) -> list[int]:
    """Each device-round's bytes of its masked upload (the ``update`` payload up)."""
    out = []
    for r in rounds:
        for by in ((r.get("metrics") or r).get("bytes") or {}).values():
            out.append(int((by.get("up") or {}).get("update", 0)))
    return out


def run_case(mode: str, seed: int, rounds: int, timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="secure-bytes-") as tmp:
        work = Path(tmp)
        (work / "fleet.toml").write_text(fleet_text(mode, seed, rounds))
        argv = [sys.executable, "-m", "edgetrain", "emulate", "--fleet", str(work / "fleet.toml"), "--out",
                str(work / "runs"), "--deadline", "3600", "--workers", "2"]
        started = time.monotonic()
        proc = subprocess.run(argv, cwd=ROOT, env={**os.environ, **ENV}, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        wall = time.monotonic() - started
        found = sorted((work / "runs").glob("*/metrics.json"))
        if proc.returncode != 0 or not found:
            return {"mode": mode, "seed": seed, "error": (proc.stdout + proc.stderr)[-3000:], "wall_s": wall}
        metrics = json.loads(found[0].read_text())
        history = metrics["rounds"]
        ups = masked_bytes(history)
        accuracy = [r.get("accuracy") for r in history]
        return {"mode": mode, "seed": seed, "value_bits": value_bits(mode), "wall_s": round(wall, 1),
                "accuracy": accuracy, "accuracy_last3": mean(a for a in accuracy[-3:] if a is not None),
                "masked_bytes_per_device_round": mean(ups) if ups else None, "device_rounds": len(ups),
                "float32_update_bytes": 4 * PARAMETERS,
                "ratio": (mean(ups) / (4 * PARAMETERS)) if ups else None}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--modes", default="float,q7", help="float (the 32-bit ring) and qN (N-bit values), comma-separated")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--case-timeout", type=float, default=1800, help="seconds one emulation may take")


def run(ctx: Context) -> dict:
    args = ctx.args
    modes = parse_list(args.modes, str)
    cases = []
    for seed in ctx.seeds:
        for mode in modes:
            case = run_case(mode, seed, args.rounds, args.case_timeout)
            print(json.dumps({k: v for k, v in case.items() if k != "accuracy"}), flush=True)
            cases.append(case)
    report = {}
    for mode in modes:
        done = [c for c in cases if c["mode"] == mode and "error" not in c]
        if done:
            report[mode] = {"accuracy_last3_mean": mean(c["accuracy_last3"] for c in done),
                            "ratio_mean": mean(c["ratio"] for c in done if c["ratio"] is not None),
                            "seeds": [c["seed"] for c in done]}
    ctx.write(cases, report)
    return report


CASE = Case("secure_bytes", __doc__, run, arguments=arguments, seeds="0,1,2",
            quick={"modes": "q7", "seeds": "0", "rounds": 2},
            metrics=("accuracy_last3", "ratio", "masked_bytes_per_device_round", "wall_s"), group_by=("mode",))


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
