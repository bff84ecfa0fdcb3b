"""Run reports: metrics.json, a per-round CSV, and PNG plots (accuracy per round, memory per device)."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.server.wirebytes import round_bytes, run_bytes


def new_run_dir(base: Path = Path("runs")) -> Path:
    """``runs/<UTC timestamp>``, unique even for two runs in the same second."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = base / stamp
    n = 1
    while path.exists():
        n += 1
        path = base / f"{stamp}-{n}"
    path.mkdir(parents=True)
    return path


def write_metrics(run_dir: Path, payload: Mapping[str, object]) -> Path:
    """``metrics.json`` (with the run's bytes per device-round, :func:`orchestrator.server.wirebytes.run_bytes`)
    and ``rounds.csv`` (one row per round, with its bytes down and up and per device)."""
    path = run_dir / "metrics.json"
    rounds = payload.get("rounds")
    if isinstance(rounds, Sequence) and rounds:
        spent = run_bytes(rounds)
        payload = {**payload, **({"bytes": spent} if spent is not None and "bytes" not in payload else {})}
        rounds = [{**r, **{f"bytes_{k}": v for k, v in (round_bytes(r) or {}).items() if k != "devices"}} for r in rounds]
    path.write_text(json.dumps(payload, indent=2, default=str))
    if isinstance(rounds, Sequence) and rounds:
        keys = [k for k in ("round", "selected", "reported", "accuracy", "test_loss", "round_wall_s", "server_cpu_s",
                            "bytes_down", "bytes_up", "bytes_held", "bytes_per_device") if k in rounds[0]]
        with open(run_dir / "rounds.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
            w.writeheader()
            w.writerows(rounds)
    return path


def plot_accuracy(run_dir: Path, rounds: Sequence[Mapping[str, object]], *, title: str) -> Path | None:
    """Accuracy and loss of the global model per round."""
    points = [(r["round"], r["accuracy"]) for r in rounds if "accuracy" in r]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label="global model (test)")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="lower right")
    path = run_dir / "accuracy.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_memory(run_dir: Path, devices: Sequence[Mapping[str, object]], *, title: str) -> Path | None:
    """Peak memory of each device beside its budget, coloured by role.

    Bars are the peak resident set where the devices report it (what the budget means), with the
    cgroup's charge drawn inside them where a cgroup measured it: a cgroup is not charged for
    library pages another process touched first, so on its own it would flatter the devices.
    """
    rows = [d for d in devices if d.get("peak_rss_bytes") or d.get("peak_bytes")]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"strong": "tab:blue", "moderate": "tab:orange", "weak": "tab:green"}
    rows = sorted(rows, key=lambda d: (str(d.get("role")), str(d["device"])))
    fig, ax = plt.subplots(figsize=(max(6.4, 0.25 * len(rows)), 4))
    xs = list(range(len(rows)))
    mib = 1 << 20
    rss = [int(d.get("peak_rss_bytes") or d.get("peak_bytes") or 0) / mib for d in rows]
    ax.bar(xs, rss, color=[colours.get(str(d.get("role")), "grey") for d in rows])
    charged = [(x, int(d["peak_bytes"]) / mib) for x, d in zip(xs, rows) if d.get("peak_rss_bytes") and d.get("peak_bytes")]
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    labels = [f"{role} (peak RSS)" for role in colours]
    if charged:
        ax.bar([c[0] for c in charged], [c[1] for c in charged], width=0.4, color="none", edgecolor="black", hatch="//")
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="none", edgecolor="black", hatch="//"))
        labels.append("cgroup charge")
    budget = ax.scatter(xs, [int(d["budget_bytes"]) / mib for d in rows], marker="_", s=200, color="black")
    handles.append(budget)
    labels.append("budget")
    ax.set_xticks(xs)
    ax.set_xticklabels([str(d["device"]) for d in rows], rotation=90, fontsize=6)
    ax.set_ylabel("peak memory (MiB)")
    ax.set_title(title)
    ax.legend(handles, labels, loc="upper right", fontsize=7)
    path = run_dir / "memory.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
