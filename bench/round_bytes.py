"""Bytes per device per round, and the accuracy they buy: held payloads and wire codecs in real runs.

For each model (``digits_mlp`` on digits, the LEAF CNN ``leaf_cnn`` on FEMNIST writers, natural
split) it runs EmbracingFL's mixed fleet (strong, moderate and weak devices, two of each by default:
their roles come from their budgets, ``role_budgets``) through the real orchestrator and real
device clients over websockets on 127.0.0.1 (devices as asyncio tasks in one process), once per
setting and seed:

- ``float32``: what a device costs without any of this: every payload sent each time it is named,
  chunks and tails as they are, updates in float32;
- ``held``: devices keep their payloads by sha256 (``payload_cache``): a chunk or training graph whose
  bytes did not change is never sent again;
- ``lossless``: held, and chunks, graphs, tails and updates through ``shuffle`` (byte planes, deflate);
- ``float16``: held, chunks and graphs ``shuffle``, tails and updates ``float16`` (error feedback);
- ``8bit``: held, chunks and graphs ``shuffle``, tails ``int8``, updates ``sr8`` (stochastic rounding);
- ``eden2``/``eden4``/``eden1``: held, chunks and graphs ``shuffle``, tails ``int8``, updates through
  EDEN at that many bits a coordinate (random rotation, unbiased);
- ``delta8+sr8``/``delta4+eden2``/``delta2+eden1``: held, chunks and tails as delta downloads
  (``download_delta`` int8/int4/int2: quantized, and against the version a device holds,
  :mod:`edge_sdk.codecs.delta`), updates through that codec.

``--fleet mixed`` runs instead the mixed fleet of edge_sdk_js/bench/fleet-accuracy.mjs: an ``edgetrain
serve`` and, on digits_mlp, two Python devices (torch), two Node devices (onnxruntime-node, one weak) and
two headless Chromium tabs running the SDK as the served device page does (onnxruntime-web on
WebAssembly, no payload store), each a process of its own as a user starts them, for the settings of
:data:`FLEET_SETTINGS`: ``defaults`` (no option: what a user gets) and ``float32`` (every transfer
setting off, devices keeping no payloads). Its rows also give each kind of device's bytes
(``by_kind``: py, node, tab).

Reported per setting (mean ± standard deviation over seeds): bytes down and up per device-round
(:func:`orchestrator.server.wirebytes.run_bytes`: every device that took part in a round counts once), their
share of the float32 run's, the final round's test accuracy and its difference from the float32 run
of the same seed (paired).

``python bench/round_bytes.py [--models digits_mlp,leaf_cnn] [--settings float32,held,...] [--seeds 0,1,2]
[--rounds 5] [--devices 6] [--roles strong,moderate,weak] [--fleet mixed] [--table FILE...]`` writes
bench/results/round_bytes.json and prints a markdown table (``--table``: only the table of result files).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge_sdk.client import DeviceClient, DeviceSettings  # noqa: E402
from edge_sdk.data import load_dataset, partition  # noqa: E402
from emulator.localfleet import role_budgets, start_orchestrator  # noqa: E402
from orchestrator.config import ServerConfig  # noqa: E402
from orchestrator.server.wirebytes import run_bytes  # noqa: E402

#: (held payloads, chunk codec, tail codec, graph codec, update codec, download delta) of each setting.
SETTINGS: dict[str, tuple[bool, str, str, str, str, str]] = {
    "float32": (False, "none", "none", "none", "none", "none"),
    "held": (True, "none", "none", "none", "none", "none"),
    "lossless": (True, "shuffle", "shuffle", "shuffle", "shuffle", "none"),
    "float16": (True, "shuffle", "float16", "shuffle", "float16", "none"),
    "8bit": (True, "shuffle", "int8", "shuffle", "sr8", "none"),
    "eden4": (True, "shuffle", "int8", "shuffle", "eden4", "none"),
    "eden2": (True, "shuffle", "int8", "shuffle", "eden2", "none"),
    "eden1": (True, "shuffle", "int8", "shuffle", "eden1", "none"),
    "delta8+sr8": (True, "shuffle", "none", "shuffle", "sr8", "int8"),
    "delta4+eden2": (True, "shuffle", "none", "shuffle", "eden2", "int4"),
    "delta2+eden1": (True, "shuffle", "none", "shuffle", "eden1", "int2"),
}
#: The mixed fleet's settings: (``edgetrain serve``'s options, the Python and Node devices' options).
#: ``defaults`` gives none: the server's and the devices' defaults (bench/validated.toml [defaults]).
FLEET_SETTINGS: dict[str, tuple[str, str]] = {
    "defaults": ("", ""),
    "float32": ("--chunk-codec none --tail-codec none --graph-codec none --download-delta none --update-codec none",
                "--payload-cache off"),
}
#: model -> (training data, partition scheme, evaluation data, local learning rate)
MODELS = {"digits_mlp": ("digits", "iid", "digits", 0.1), "leaf_cnn": ("femnist", "natural", "femnist", 0.04)}


@dataclass(frozen=True)
class Run:
    model: str
    setting: str
    seed: int
    rounds: int
    devices: int
    local_steps: int
    roles: tuple[str, ...] = ("strong", "moderate", "weak")


def run_one(spec: Run, data_root: str | None) -> dict:
    held, chunk, tail, graph, update, delta = SETTINGS[spec.setting]
    train, scheme, evaluation, lr = MODELS[spec.model]
    ds = load_dataset(train, root=data_root)
    parts = partition(ds.groups if scheme == "natural" else ds.y, spec.devices, scheme, seed=spec.seed)
    # role_budgets are the least each role needs: 1% and 4 MiB more leave the planner a margin for its batch.
    budgets = {role: int(b * 1.01) + (4 << 20) for role, b in role_budgets(spec.model).items()}
    roles = [spec.roles[i % len(spec.roles)] for i in range(spec.devices)]
    with tempfile.TemporaryDirectory(prefix="round-bytes-") as tmp:
        config = ServerConfig(model=spec.model, rounds=spec.rounds, min_devices=spec.devices, local_steps=spec.local_steps,
                              lr=lr, seed=spec.seed, eval_every=spec.rounds, eval_data=evaluation, data_root=data_root,
                              store_dir=Path(tmp) / "store", deadline_s=600, chunk_codec=chunk, tail_codec=tail,
                              graph_codec=graph, update_codec=update, download_delta=delta,
                              # Devices share this process's event loop with the server on a loaded machine:
                              # the slow-sender guard would cut their transfers for the bench's own stalls
                              # (a device encoding its update holds the loop; 1 KiB/s still cut a LEAF CNN run).
                              transfer_min_rate=0)

        async def go() -> list[dict]:
            orch, server = await start_orchestrator(config, lambda kind, data: None)
            url = f"ws://127.0.0.1:{orch.port}"
            clients = [DeviceClient(DeviceSettings(url, f"{role}-{i}", budgets[role], backend="torch",
                                                 payload_cache=Path(tmp) / f"held-{i}" if held else None),
                                    ds.x[parts[i]], ds.y[parts[i]]) for i, role in enumerate(roles)]
            await asyncio.gather(*(c.run() for c in clients))
            return await asyncio.wait_for(server, timeout=3600)

        t = time.monotonic()
        history = asyncio.run(go())
    spent = run_bytes(history) or {}
    rounds = max(1, spent.get("device_rounds", 1))
    return {**spec.__dict__, "wall_s": time.monotonic() - t, "accuracy": history[-1].get("accuracy"),
            "down_per_device_round": spent.get("down", 0) / rounds, "up_per_device_round": spent.get("up", 0) / rounds,
            "held_per_device_round": spent.get("held", 0) / rounds,
            "bytes_per_device_round": spent.get("per_device_round"), "codecs": SETTINGS[spec.setting]}


def run_fleet(setting: str, seed: int, rounds: int) -> dict:
    """One run of the mixed fleet (module doc) at ``setting`` of :data:`FLEET_SETTINGS`, its bytes
    per device-round in all and by kind of device (the id's prefix: py, node, tab)."""
    import subprocess

    serve, device = FLEET_SETTINGS[setting]
    t = time.monotonic()
    out = subprocess.run(["node", str(ROOT / "edge_sdk_js" / "bench" / "fleet-accuracy.mjs"), "mixed", str(seed),
                          str(rounds), "--no-gpu", "--serve-args", serve, "--device-args", device],
                         capture_output=True, text=True, timeout=3600, check=True)
    run = json.loads(out.stdout.strip().splitlines()[-1])
    by_kind = {}
    for kind in ("py", "node", "tab"):
        history = [{"bytes": {d: b for d, b in (per or {}).items() if d.startswith(kind + "-")}} for per in run["bytes"]]
        by_kind[kind] = run_bytes(history)
    spent = run_bytes([{"bytes": per} for per in run["bytes"]]) or {}
    n = max(1, spent.get("device_rounds", 1))
    return {"model": "digits_mlp", "setting": setting, "seed": seed, "rounds": rounds, "fleet": "mixed",
            "wall_s": time.monotonic() - t, "accuracy": run["accuracy"][-1], "devices": run["devices"],
            "down_per_device_round": spent.get("down", 0) / n, "up_per_device_round": spent.get("up", 0) / n,
            "held_per_device_round": spent.get("held", 0) / n, "bytes_per_device_round": spent.get("per_device_round"),
            "by_kind": by_kind, "options": FLEET_SETTINGS[setting]}


def _mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    mean = sum(values) / len(values)
    return mean, (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0


def table(results: list[dict]) -> str:
    """One markdown row per model and setting: mean ± standard deviation over seeds of the bytes per
    device-round and their share of the float32 run's, the final accuracy, and its difference from
    the float32 run of the same seed (paired: the same data split and initial model)."""
    rows = ["| model | setting | seeds | down MB / device-round | up MB / device-round | of float32's bytes | "
            "accuracy | − float32's (points, paired) |", "|---|---|---|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in results):
        mine = [r for r in results if r["model"] == model]
        base = {r["seed"]: r for r in mine if r["setting"] == "float32"}
        for setting in dict.fromkeys(r["setting"] for r in mine):
            rs = [r for r in mine if r["setting"] == setting]
            cells = []
            for key, scale, fmt in (("down_per_device_round", 1e-6, ".2f"), ("up_per_device_round", 1e-6, ".3f")):
                m, sd = _mean_sd([r[key] * scale for r in rs])
                cells.append(f"{m:{fmt}} ± {sd:{fmt}}")
            paired = [r for r in rs if r["seed"] in base]
            share = _mean_sd([r["bytes_per_device_round"] / base[r["seed"]]["bytes_per_device_round"] for r in paired]) \
                if paired else None
            cells.append(f"{share[0]:.3f} ± {share[1]:.3f}" if share else "-")
            m, sd = _mean_sd([100 * r["accuracy"] for r in rs])
            cells.append(f"{m:.2f} ± {sd:.2f}")
            diff = _mean_sd([100 * (r["accuracy"] - base[r["seed"]]["accuracy"]) for r in paired]) if paired else None
            cells.append(f"{diff[0]:+.2f} ± {diff[1]:.2f}" if diff else "-")
            rows.append(f"| {model} | {setting} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def kinds_table(results: list[dict]) -> str:
    """The mixed fleet's bytes by kind of device: per setting and kind, bytes down and up per
    device-round and their share of the float32 run's same kind (paired by seed)."""
    rows = ["| setting | devices | down MB / device-round | up MB / device-round | of float32's bytes |",
            "|---|---|---|---|---|"]
    base = {r["seed"]: r for r in results if r["setting"] == "float32"}
    for setting in dict.fromkeys(r["setting"] for r in results):
        rs = [r for r in results if r["setting"] == setting]
        for kind in ("py", "node", "tab"):
            spent = [(r["by_kind"][kind], r["seed"]) for r in rs if r["by_kind"].get(kind)]
            if not spent:
                continue
            cells = [f"{m:.2f} ± {sd:.2f}" for m, sd in (
                _mean_sd([b[d] / b["device_rounds"] / 1e6 for b, _ in spent]) for d in ("down", "up"))]
            paired = [b["per_device_round"] / base[seed]["by_kind"][kind]["per_device_round"]
                      for b, seed in spent if seed in base]
            share = _mean_sd(paired) if paired else None
            cells.append(f"{share[0]:.3f} ± {share[1]:.3f}" if share else "-")
            rows.append(f"| {setting} | {kind} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="digits_mlp,leaf_cnn")
    ap.add_argument("--settings", default="float32,lossless,float16,8bit,eden2,delta8+sr8,delta4+eden2,delta2+eden1")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--devices", type=int, default=6)
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--roles", default="strong,moderate,weak",
                    help="the devices' roles, in turn (moderate,weak: a fleet where nobody trains the frozen blocks)")
    ap.add_argument("--data-root", default=os.environ.get("EDGETRAIN_DATA"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "round_bytes.json")
    ap.add_argument("--fleet", choices=("mixed",), help="the mixed fleet of Python, Node and page devices, each a "
                    "process, at --settings of FLEET_SETTINGS (default float32,defaults), seeds interleaved")
    ap.add_argument("--table", type=Path, nargs="*", help="only print the table of these result files (runs none)")
    args = ap.parse_args()
    if args.table:
        found = [r for path in args.table for r in json.loads(path.read_text())["results"]]
        print(table(found) + ("\n\n" + kinds_table(found) if any("by_kind" in r for r in found) else ""))
        return
    if args.fleet:
        settings = args.settings.split(",") if "--settings" in sys.argv else list(reversed(FLEET_SETTINGS))
        runs = [(lambda setting=setting, seed=seed: run_fleet(setting, seed, args.rounds))
                for seed in map(int, args.seeds.split(",")) for setting in settings]
    else:
        runs = [(lambda model=model, setting=setting, seed=seed: run_one(
                    Run(model, setting, seed, args.rounds, args.devices, args.local_steps, tuple(args.roles.split(","))),
                    args.data_root))
                for model in args.models.split(",") for setting in args.settings.split(",")
                for seed in map(int, args.seeds.split(","))]
    results = []
    for run in runs:
        results.append(run())
        print(json.dumps(results[-1]), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)  # after every run: a stopped bench keeps them
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                                       indent=2))
    print(table(results) + ("\n\n" + kinds_table(results) if args.fleet else ""))


if __name__ == "__main__":
    main()
