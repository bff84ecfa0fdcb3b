"""An emulated fleet of 1,000 devices, run by the lightweight mode's local workers and by Ray actors.

The same fleet (1,000 devices training ``mnist_2nn`` on MNIST, 60 samples each, FedAvg sampling 100
per round) runs in two lanes, side by side in every repeat, against one orchestrator per run:

- ``local``: the lightweight mode's worker processes (``edgetrain emulate``);
- ``ray``: the same workers as Ray actors on a local Ray instance (``edgetrain emulate --backend ray``),
  the instance started and shut down inside the run, so its start-up counts in the wall time.

Each run is a fresh process (``--one MODE``), so peaks do not carry over; the modes alternate,
``--repeats`` runs each (default 2, the first mode rotating), and the table shows each figure's median. For both it reports: wall
time to every device welcomed, hello-to-welcome latency p50/p99 (the server's: hello read to welcome
written; the devices': connection opened to welcome received), round wall time and the server's and
workers' CPU per round, the server process's RSS (orchestrator and emulator, and in the Ray run the
Ray driver too) with every device connected and at its peak, the workers' RSS (before their devices,
with every device connected, peak), the Ray instance's own processes' RSS (GCS, raylet, agents), and
the total wall time; then the ratio ray / local of each. Writes ``bench/results/ray_fleet.json``.

Not a test: the numbers depend on how busy the machine is. Run
``python bench/ray_fleet.py [--devices 1000] [--rounds 10] [--repeats 2] [--workers 2] [--data-root DIR]``
(needs the ``[ray]`` extra and MNIST in the data root).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, interleave, ratio_summary  # noqa: E402
from bench.harness.fleets import build_fleet, group  # noqa: E402

HERE = Path(__file__).resolve()
MODES = ("local", "ray")
MIB = float(1 << 20)


def case_fleet(devices: int, rounds: int, per_round: int):
    """The fleet both lanes run: mnist_2nn on MNIST, FedAvg sampling ``per_round`` devices a round."""
    return build_fleet(
        "ray-fleet", model="mnist_2nn", dataset="mnist", seed=0,
        description=f"bench/ray_fleet.py: {devices} devices, mnist_2nn on MNIST, {per_round} sampled per round",
        training={"strategy": "fedavg", "rounds": rounds, "fraction": per_round / devices, "local_steps": 2,
                  "batch_size": 16, "lr": 0.05, "momentum": 0.0, "weight_decay": 0.0},
        partition={"scheme": "iid"},
        emulation={"mode": "lightweight", "memory_cap": "none", "timeout_s": 600, "throttle_cpu": False},
        groups=[group("mid-phone", devices, "phone")])


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def _tree_rss() -> dict[int, tuple[str, int]]:
    """Every descendant of this process: pid -> (name, resident bytes)."""
    import psutil

    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            out[child.pid] = (child.name(), child.memory_info().rss)
        except psutil.Error:
            continue
    return out


# -- one run, in its own process ----------------------------------------------------------------------
def run_one(mode: str, args: argparse.Namespace) -> dict:
    from edge_sdk.memory import process_memory
    from emulator.runner import run_emulation
    from emulator.schedule import server_config

    tmp = Path(tempfile.mkdtemp(prefix=f"ray-fleet-{mode}-"))
    fleet = case_fleet(args.devices, args.rounds, args.per_round)
    config = server_config(fleet, store_dir=tmp / "store", data_root=args.data_root, deadline_s=300)
    n = fleet.num_devices
    marks: dict[str, float] = {}
    welcomed: list[float] = []
    registered: set[str] = set()
    connected: dict = {}
    t0 = time.monotonic()

    def on_event(kind: str, data: dict) -> None:
        now = round(time.monotonic() - t0, 3)
        if kind == "listening":
            marks.setdefault("listening_s", now)
        elif kind == "emulator:started":
            marks.setdefault("first_device_started_s", now)
        elif kind == "welcomed":
            welcomed.append(float(data["latency_s"]))
        elif kind == "registered":
            registered.add(str(data["device"]))
            if len(registered) == n and "all_welcomed_s" not in marks:
                marks["all_welcomed_s"] = now
                connected["server_rss_bytes"] = process_memory().rss_bytes
                connected["tree"] = _tree_rss()
        elif kind == "round_start" and data["round"] == 1:
            marks["first_round_start_s"] = now
        elif kind == "round_end":
            marks["last_round_end_s"] = now

    # The lightweight mode's workers here, or as Ray actors: the backend `edgetrain emulate --backend` names.
    run = asyncio.run(run_emulation(fleet, config, workers=args.workers, on_event=on_event, data_root=args.data_root,
                                    stderr_dir=tmp / "logs", backend="ray" if mode == "ray" else "local"))
    wall = time.monotonic() - t0
    server = process_memory()
    devices = run.devices
    device_latency = [float(e["connect_to_welcome_s"]) for d in devices for e in d.events
                      if e.get("event") == "welcome" and "connect_to_welcome_s" in e]
    worker_pids = {w["pid"] for w in run.workers}
    tree = connected.get("tree", {})
    ray_system = {pid: v for pid, v in tree.items() if pid not in worker_pids} if mode == "ray" else {}
    rounds = [{k: r.get(k) for k in ("round", "selected", "reported", "round_wall_s", "server_cpu_s",
                                     "workers_cpu_s", "accuracy")} for r in run.history]
    warm = rounds[1:] or rounds
    return {
        "mode": mode,
        "devices": n,
        "registered": len(registered),
        "devices_finished": sum(d.status == "finished" for d in devices),
        "device_failures": sum(life.ended == "failed" for d in devices for life in d.lives),
        "rounds_completed": len(rounds),
        "reports": sum(r["reported"] for r in rounds),
        "workers": len(run.workers),
        "wall_s": round(wall, 2),
        **marks,
        "connect_s": (round(marks["all_welcomed_s"] - marks["first_device_started_s"], 2)
                      if "all_welcomed_s" in marks and "first_device_started_s" in marks else None),
        "shutdown_s": round(wall - marks["last_round_end_s"], 2) if "last_round_end_s" in marks else None,
        "hello_to_welcome_ms": {"p50": _ms(pct(welcomed, 50)), "p99": _ms(pct(welcomed, 99)), "n": len(welcomed)},
        "connect_to_welcome_ms": {"p50": _ms(pct(device_latency, 50)), "p99": _ms(pct(device_latency, 99)),
                                  "n": len(device_latency)},
        "round_wall_s_median_warm": _med([r["round_wall_s"] for r in warm]),
        "round_wall_s_first": rounds[0]["round_wall_s"] if rounds else None,
        "server_cpu_s_median_warm": _med([r["server_cpu_s"] for r in warm]),
        "workers_cpu_s_median_warm": _med([r["workers_cpu_s"] for r in warm if r["workers_cpu_s"] is not None]),
        "final_accuracy": rounds[-1]["accuracy"] if rounds else None,
        "server_rss_connected_mib": _mib(connected.get("server_rss_bytes")),
        "server_peak_rss_mib": _mib(server.peak_rss_bytes),
        "workers_rss_ready_mib": _mib(sum(w["rss_ready_bytes"] or 0 for w in run.workers)),
        "workers_rss_connected_mib": _mib(sum(w["rss_after_connect_bytes"] or 0 for w in run.workers)),
        "workers_peak_rss_mib": _mib(sum(w["peak_rss_bytes"] or 0 for w in run.workers)),
        "workers_rss_per_device_kib": (round(sum(w["rss_after_connect_bytes"] - w["rss_ready_bytes"]
                                                 for w in run.workers) / n / 1024, 1)
                                       if all(w["rss_after_connect_bytes"] and w["rss_ready_bytes"]
                                              for w in run.workers) else None),
        "workers_cpu_s_total": round(sum(w["cpu_s"] or 0 for w in run.workers), 2),
        "ray_system_rss_mib": _mib(sum(rss for _, rss in ray_system.values())) if mode == "ray" else None,
        "ray_system_processes": sorted({name for name, _ in ray_system.values()}) if mode == "ray" else None,
        "rounds": rounds,
        "worker_processes": run.workers,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _mib(n: int | None) -> float | None:
    return None if n is None else round(n / MIB, 1)


def _med(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


# -- the comparison ------------------------------------------------------------------------------------
ROWS = [  # (label, key in a run's result, how to print)
    ("devices registered / finished", lambda r: f"{r['registered']} / {r['devices_finished']}"),
    ("rounds completed, reports", lambda r: f"{r['rounds_completed']}, {r['reports']}"),
    ("workers", lambda r: str(r["workers"])),
    ("orchestrator listening (s from start)", lambda r: _f(r.get("listening_s"))),
    ("first device started (s from start)", lambda r: _f(r.get("first_device_started_s"))),
    ("every device welcomed (s from start)", lambda r: _f(r.get("all_welcomed_s"))),
    ("connect: first device started -> all welcomed (s)", lambda r: _f(r.get("connect_s"))),
    ("hello-to-welcome p50 / p99 ms (server)",
     lambda r: f"{_f(r['hello_to_welcome_ms']['p50'], 2)} / {_f(r['hello_to_welcome_ms']['p99'], 2)}"),
    ("connect-to-welcome p50 / p99 ms (devices)",
     lambda r: f"{_f(r['connect_to_welcome_ms']['p50'], 0)} / {_f(r['connect_to_welcome_ms']['p99'], 0)}"),
    ("round wall s (first; median warm)",
     lambda r: f"{_f(r['round_wall_s_first'])}; {_f(r['round_wall_s_median_warm'])}"),
    ("server CPU s per warm round (median)", lambda r: _f(r["server_cpu_s_median_warm"])),
    ("workers CPU s per warm round (median)", lambda r: _f(r["workers_cpu_s_median_warm"])),
    ("server RSS MiB (all connected; peak)",
     lambda r: f"{_f(r['server_rss_connected_mib'], 0)}; {_f(r['server_peak_rss_mib'], 0)}"),
    ("workers RSS MiB, sum (ready; connected; peak)",
     lambda r: f"{_f(r['workers_rss_ready_mib'], 0)}; {_f(r['workers_rss_connected_mib'], 0)}; "
               f"{_f(r['workers_peak_rss_mib'], 0)}"),
    ("workers RSS per device KiB", lambda r: _f(r["workers_rss_per_device_kib"], 0)),
    ("Ray's own processes RSS MiB", lambda r: _f(r["ray_system_rss_mib"], 0) if r["mode"] == "ray" else "-"),
    ("final accuracy", lambda r: _f(r["final_accuracy"], 4)),
    ("shutdown: last round end -> done (s)", lambda r: _f(r.get("shutdown_s"))),
    ("total wall s", lambda r: _f(r["wall_s"])),
]

RATIOS = ["all_welcomed_s", "connect_s", "round_wall_s_median_warm", "server_cpu_s_median_warm",
          "workers_cpu_s_median_warm", "server_rss_connected_mib", "server_peak_rss_mib", "workers_rss_connected_mib",
          "workers_peak_rss_mib", "wall_s"]


def _f(x, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _median_run(runs: list[dict]) -> dict:
    """One run's shape, each number the median over `runs` (nested dicts too); other values from the first."""
    out = {}
    for key, first in runs[0].items():
        values = [r.get(key) for r in runs]
        if isinstance(first, dict):
            out[key] = _median_run([v for v in values if isinstance(v, dict)])
        elif isinstance(first, (int, float)) and not isinstance(first, bool) and all(
                isinstance(v, (int, float)) for v in values):
            m = statistics.median(values)
            if all(isinstance(v, int) for v in values) and float(m).is_integer():
                m = int(m)  # counts stay counts
            out[key] = round(m, 3) if isinstance(m, float) else m
        else:
            out[key] = first
    return out


def compare(args: argparse.Namespace, repeats: int) -> tuple[list[dict], dict]:
    """Run local, ray, ray, local, ... (``repeats`` times each, side by side, so that a change in the
    machine's load falls on both); each figure of the summary is the median over a mode's runs."""
    runs: list[dict] = []
    for rep, mode in interleave(MODES, repeats):
        print(f"-- {mode} ({rep + 1}/{repeats}): {args.devices} devices, {args.rounds} rounds ...", flush=True)
        out = Path(tempfile.mkstemp(prefix=f"ray-fleet-{mode}-", suffix=".json")[1])
        argv = [sys.executable, str(HERE), "--one", mode, "--devices", str(args.devices), "--rounds",
                str(args.rounds), "--per-round", str(args.per_round), "--json-out", str(out)]
        if args.workers:
            argv += ["--workers", str(args.workers)]
        if args.data_root:
            argv += ["--data-root", args.data_root]
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", RAY_USAGE_STATS_ENABLED="0")
        proc = subprocess.run(argv, env=env, timeout=args.timeout)
        if proc.returncode != 0:
            raise SystemExit(f"the {mode} run failed (exit {proc.returncode})")
        runs.append({"lane": mode, "repeat": rep, **json.loads(out.read_text())})
        out.unlink()
    summary = {mode: _median_run([r for r in runs if r["lane"] == mode]) for mode in MODES}
    ratios = {}
    for key in RATIOS:
        a, b = summary["local"].get(key), summary["ray"].get(key)
        ratios[key] = round(b / a, 2) if a and b is not None else None
    return runs, {"summary": summary, "ray_over_local": ratios}


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=100, help="devices sampled per round")
    ap.add_argument("--workers", type=int, default=None, help="worker processes / actors (default: one per core, 2-4)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)


def run(ctx: Context) -> dict | None:
    args = ctx.args
    if args.one:
        result = run_one(args.one, args)
        args.json_out.write_text(json.dumps(result, indent=1, default=str))
        return None
    if not args.data_root or not (Path(args.data_root) / "mnist").is_dir():
        raise SystemExit(f"no MNIST in {args.data_root}: pass --data-root (the folder holding mnist/)")
    try:
        import ray  # noqa: F401
    except ImportError:
        raise SystemExit("the ray run needs the [ray] extra: pip install -c constraints.txt -e '.[ray]'") from None
    load0 = os.getloadavg()
    runs, report = compare(args, ctx.repeats)
    report.update(devices=args.devices, rounds=args.rounds, per_round=args.per_round, model="mnist_2nn",
                  dataset="mnist", load_avg_at_start=load0, load_avg_at_end=os.getloadavg())
    doc = ctx.write(runs, report, {f"{key}_over_local": ratio_summary(runs, key, "local") for key in RATIOS})
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{args.devices} emulated devices: local lightweight workers vs Ray actors "
                        f"(median of {ctx.repeats} runs each)")
    for col in ("", "local", "ray"):
        table.add_column(col, justify="left" if not col else "right")
    for label, show in ROWS:
        table.add_row(label, show(report["summary"]["local"]), show(report["summary"]["ray"]))
    Console().print(table)
    print("ray / local:", ", ".join(f"{k} {v}" for k, v in report["ray_over_local"].items()))
    return doc


CASE = Case("ray_fleet", __doc__, run, arguments=arguments, repeats=2, data_root=True,
            quick={"devices": 20, "rounds": 1, "per_round": 10, "repeats": 1, "timeout": 300})


def main(argv: list[str] | None = None) -> dict | None:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
