"""Secure aggregation over the network at 10, 100 and 1,000 devices per round, beside the plain round.

Each case is one run of the emulator's lightweight mode (``emulator.lightweight``: the
real :class:`edge_sdk.client.DeviceClient` over websockets on 127.0.0.1, devices as asyncio tasks in
a few worker processes, each enrolled with its credential) against the real orchestrator, in a
process of its own so that its peak resident set is its own: ``mnist_2nn`` (784-64-10, two blocks,
51k parameters) on MNIST split IID, FedAvg, every device selected every round (``fraction = 1``),
one local step of batch 16; the server's norm bound, direction trust and validation off in both
modes, so only secure aggregation differs. Dropouts: each device vanishes in a round with
probability 0, 10% or 30% as its upload is about to begin (``drop_at = "upload"``: it has trained
and, in a secure round, advertised its keys and sent its shares, so the server recovers its masks),
and rejoins at once (its next life reconnects, says hello and is planned again).

Per round it reports the wall time (``round_wall_s``: instruction to commit), the server's CPU
(``server_cpu_s``) and the devices' (the workers' CPU between round start and end, per selected
device), the bytes each device downloads (the model) and uploads (the update; in a secure round
the key, share and unmasking messages separately), and the server's resident set at the round's end
and its peak over the run (psutil, :mod:`edge_sdk.memory`; the server process also holds the
emulator's bookkeeping). Round 1 is left out of the means where there are more rounds: it loads the
devices' runtimes. ``python bench/secagg_fleet.py`` writes ``bench/results/secagg_fleet.json``;
``--devices``, ``--dropouts``, ``--rounds``, ``--rounds-large`` (rounds of the 1,000-device cases) size
it; ``--stage-s`` sets how long a secure stage waits for its devices (``secure_stage_s``, the
server's 30 s by default: emulated devices train one after another on the machine's cores, where
real devices train side by side). A case that fails or passes ``--case-timeout`` is reported with
where it stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, interleave, parse_list, runs_of  # noqa: E402
from bench.harness.fleets import build_fleet, group  # noqa: E402

LARGE = 1000  # a fleet this size or larger runs --rounds-large rounds


def case_fleet(name: str, devices: int, rounds: int, dropout: float, secure: bool, local_steps: int = 1):
    """The fleet of one case: FedAvg on mnist_2nn, every device every round, the server's checks off."""
    return build_fleet(
        name, model="mnist_2nn", dataset="mnist", seed=0,
        training={"strategy": "fedavg", "rounds": rounds, "fraction": 1.0, "local_steps": local_steps,
                  "batch_size": 16, "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "norm_bound": 0.0,
                  "direction_trust": False, "max_loss_rise": 0.0, "secure_aggregation": secure, "secure_clip": 5.0},
        partition={"scheme": "iid"},
        emulation={"mode": "lightweight", "memory_cap": "none", "timeout_s": 1800, "throttle_cpu": False},
        behaviour={"dropout": dropout, "drop_at": "upload", "rejoin_after_s": 0.0},
        groups=[group("mid-phone", devices, "d")])


def round_row(h: dict, rss: int | None) -> dict:
    """One round's costs from the orchestrator's metrics (``history``)."""
    bytes_ = h.get("bytes") or {}
    downs = [sum(b.get("down", {}).values()) for b in bytes_.values()]
    ups = [sum(b.get("up", {}).values()) for b in bytes_.values() if b.get("up")]
    secure = h.get("secure") or {}
    selected = int(h.get("selected") or 0)
    row = {"round": h["round"], "selected": selected, "reported": h.get("reported"),
           "wall_s": round(h.get("round_wall_s", 0.0), 3), "server_cpu_s": h.get("server_cpu_s"),
           "device_cpu_s": round(h["workers_cpu_s"] / selected, 4) if selected and "workers_cpu_s" in h else None,
           "down_bytes": round(mean(downs)) if downs else 0, "up_bytes": round(mean(ups)) if ups else 0,
           "server_rss_bytes": rss}
    if secure:
        row["secure"] = {"cohort": secure.get("cohort"), "masked": secure.get("masked"),
                         "recovered": len(secure.get("recovered") or ()),
                         "revealed": sum(bool(b.get("revealed")) for b in secure.get("blocks", {}).values()),
                         "blocks": len(secure.get("blocks", {})),
                         "key_share_bytes_up": round(secure.get("bytes_in", 0) / max(1, secure.get("cohort") or 1)),
                         "unmask_s": round(secure.get("unmask_s", 0.0), 4)}
    return row


def run_case(devices: int, dropout: float, secure: bool, rounds: int, workers: int | None, data_root: str | None,
             stage_s: float | None = None, local_steps: int = 1) -> dict:
    """One case, in this process: the run's rounds and this process's (the server's) memory."""
    import emulator.localfleet  # noqa: F401  (torch and the server: loaded before the baseline RSS)
    from edge_sdk.memory import process_memory
    from emulator.runner import run_emulation
    from emulator.schedule import server_config

    name = f"{'secure' if secure else 'plain'}-{devices}-drop{round(dropout * 100)}"
    fleet = case_fleet(name, devices, rounds, dropout, secure, local_steps)
    rss: dict[int, int] = {}

    def on_event(kind: str, data: dict) -> None:
        if kind == "round_end":
            rss[int(data["round"])] = process_memory().rss_bytes
            print(f"[{name}] round {data['round']} done", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="secagg-fleet-") as tmp:
        config = server_config(fleet, store_dir=Path(tmp) / "store", data_root=data_root, deadline_s=900)
        # Both modes prove credentials, so the plain round pays for the hello's proof too.
        config = dataclasses.replace(config, eval_every=10_000, keep_checkpoints=1, validation_samples=0,
                                     require_credentials=True)
        if stage_s is not None:  # emulated devices train one after another: a stage may wait longer for them
            config = dataclasses.replace(config, secure_stage_s=stage_s)
        rss_before = process_memory().rss_bytes
        t0 = time.monotonic()
        run = asyncio.run(run_emulation(fleet, config, on_event=on_event, data_root=data_root,
                                        stderr_dir=Path(tmp) / "logs", workers=workers))
        wall = time.monotonic() - t0
    return {"case": name, "mode": "secure" if secure else "plain", "devices": devices, "dropout": dropout,
            "local_steps": local_steps, "rounds": [round_row(h, rss.get(h["round"])) for h in run.history], "run_wall_s": round(wall, 1),
            "server_rss_before_bytes": rss_before, "server_peak_rss_bytes": process_memory().peak_rss_bytes,
            "worker_peak_rss_bytes": [w.get("peak_rss_bytes") for w in run.workers]}


def summary(case: dict) -> dict:
    """The case's means over its rounds (round 1 left out where there are more)."""
    rows = case.get("rounds") or []
    rows = rows[1:] if len(rows) > 1 else rows
    if not rows:
        return {}

    def avg(key: str) -> float | None:
        vals = [r[key] for r in rows if r.get(key) is not None]
        return round(mean(vals), 4) if vals else None

    out = {k: avg(k) for k in ("wall_s", "server_cpu_s", "device_cpu_s", "down_bytes", "up_bytes")}
    sec = [r["secure"] for r in rows if "secure" in r]
    if sec:
        out["key_share_bytes_up"] = round(mean(s["key_share_bytes_up"] for s in sec))
        out["revealed_rounds"] = f"{sum(s['revealed'] == s['blocks'] for s in sec)}/{len(sec)}"
        out["recovered"] = sum(s["recovered"] for s in sec)
    out["server_peak_rss_mib"] = round(case["server_peak_rss_bytes"] / 2**20, 1)
    out["server_rss_growth_mib"] = round((case["server_peak_rss_bytes"] - case["server_rss_before_bytes"]) / 2**20, 1)
    return out


def table(paths: list[Path]) -> str:
    """The markdown table of result files: each secure case beside the plain case of its size and dropout."""
    cases = [c for path in paths for c in runs_of(json.loads(path.read_text()), older="results")]
    plain = {(c["devices"], c["dropout"]): c for c in cases if c["mode"] == "plain"}
    lines = ["| devices | dropout | wall s (secure / plain) | device CPU s | server CPU s | upload B | "
             "key, share, unmask B up | server RSS growth MiB | blocks revealed, masks recovered |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in (c for c in cases if c["mode"] == "secure"):
        p, s = plain.get((c["devices"], c["dropout"]), {}).get("summary", {}), c.get("summary") or {}
        if "failed" in c or not s:
            lines.append(f"| {c['devices']} | {c['dropout']:.0%} | failed: {c.get('failed', '')[:120]} |||||||")
            continue

        def pair(key: str) -> str:
            return f"{s.get(key)} / {p.get(key)}"

        lines.append(f"| {c['devices']} | {c['dropout']:.0%} | {pair('wall_s')} | {pair('device_cpu_s')} | "
                     f"{pair('server_cpu_s')} | {pair('up_bytes')} | {s.get('key_share_bytes_up')} | "
                     f"{pair('server_rss_growth_mib')} | {s.get('revealed_rounds')} rounds, {s.get('recovered')} |")
    return "\n".join(lines)


def child(args: argparse.Namespace, devices: int, dropout: float, secure: bool) -> dict:
    """Run one case in a process of its own (its peak RSS is its own); a failure is a result."""
    rounds = args.rounds_large if devices >= LARGE else args.rounds
    argv = [sys.executable, __file__, "--case", f"{devices},{dropout},{int(secure)},{rounds}"]
    if args.stage_s is not None:
        argv += ["--stage-s", str(args.stage_s)]
    argv += ["--local-steps", str(args.local_steps)]
    if args.workers:
        argv += ["--workers", str(args.workers)]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=args.case_timeout)
    except subprocess.TimeoutExpired as e:
        done = [ln for ln in (e.stderr or b"").decode(errors="replace").splitlines() if "done" in ln]
        return {"devices": devices, "dropout": dropout, "mode": "secure" if secure else "plain",
                "failed": f"stopped after {args.case_timeout} s; rounds done: {done[-1] if done else 'none'}"}
    if proc.returncode != 0:
        return {"devices": devices, "dropout": dropout, "mode": "secure" if secure else "plain",
                "failed": f"exit {proc.returncode} after {time.monotonic() - t0:.0f} s: {proc.stderr[-1500:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--devices", default="10,100,1000")
    ap.add_argument("--dropouts", default="0,0.1,0.3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rounds-large", type=int, default=2)
    ap.add_argument("--local-steps", type=int, default=1,
                    help="local steps of batch 16 a device trains each round (1: the protocol's cost against almost "
                         "no training)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--case-timeout", type=float, default=900)
    ap.add_argument("--stage-s", type=float, default=None, help="secure_stage_s (default: the server's, 30 s)")
    ap.add_argument("--table", nargs="+", type=Path, default=None, help="print the table of these result files")
    ap.add_argument("--case", default=None, help=argparse.SUPPRESS)  # devices,dropout,secure,rounds: one case


def run(ctx: Context) -> dict | None:
    args = ctx.args
    if args.table:
        print(table(args.table))
        return None
    if args.case:
        n, drop, sec, rounds = args.case.split(",")
        print(json.dumps(run_case(int(n), float(drop), sec == "1", int(rounds), args.workers, args.data_root,
                                  args.stage_s, args.local_steps)))
        return None
    results = []
    sizes = [(n, drop) for n in parse_list(args.devices, int) for drop in parse_list(args.dropouts, float)]
    for rep, mode in interleave(("plain", "secure"), len(sizes)):  # a size's two cases side by side
        case = child(args, *sizes[rep], mode == "secure")
        case["summary"] = summary(case) if "failed" not in case else {}
        results.append(case)
        print(json.dumps({k: case.get(k) for k in ("mode", "devices", "dropout", "summary", "failed")}), flush=True)
    return ctx.write(results)


CASE = Case("secagg_fleet", __doc__, run, arguments=arguments, data_root=True,
            quick={"devices": "4", "dropouts": "0", "rounds": 1, "case_timeout": 300})


def main(argv: list[str] | None = None) -> dict | None:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
