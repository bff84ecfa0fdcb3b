"""What a person sees while a local fleet trains: rich progress bars and a closing summary table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from edge_sdk.backends import BACKENDS
from orchestrator.config import ServerConfig


class FleetView:
    """Progress of a run: rounds done, devices connected, devices reporting this round, accuracy."""

    def __init__(self, console: Console, *, rounds: int, devices: int) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console, transient=False,
        )
        self.rounds_task = self.progress.add_task("rounds", total=rounds, info="")
        self.conn_task = self.progress.add_task("devices connected", total=devices, info="")
        self.round_task = self.progress.add_task("round reports", total=1, info="")
        self.connected: set[str] = set()
        self.accuracy: float | None = None

    def __enter__(self) -> FleetView:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def on_event(self, kind: str, data: dict) -> None:
        p = self.progress
        if kind == "registered":
            self.connected.add(str(data["device"]))
            p.update(self.conn_task, completed=len(self.connected), info=f"last: {data['device']} ({data['role']}, split {data['split']})")
        elif kind == "disconnected":
            self.connected.discard(str(data["device"]))
            p.update(self.conn_task, completed=len(self.connected))
        elif kind == "round_start":
            p.update(self.round_task, total=max(1, int(data["selected"])), completed=0, info=f"round {data['round']}")
        elif kind == "update":
            p.update(self.round_task, completed=int(data["reported"]), info=f"round {data['round']}: {data['device']} ({data['role']})")
        elif kind == "round_end":
            if "accuracy" in data:
                self.accuracy = float(data["accuracy"])
            acc = f"accuracy {self.accuracy:.3f}" if self.accuracy is not None else ""
            p.update(self.rounds_task, completed=int(data["round"]), info=acc)

    def print_summary(self, summary: dict, *, wall_s: float, run_dir: Path, plot: Path | None) -> None:
        table = Table(title="devices", caption="k: split; backend: how it trained (torch, or ort: the tail's training "
                                               "graph in ONNX Runtime); torch: whether the process loaded torch; "
                                               "chunks: frozen chunks streamed; MiB: peak RSS / budget")
        for col in ("device", "role", "k", "trains", "backend", "torch", "chunks", "rounds", "MiB"):
            table.add_column(col, justify="left" if col in ("device", "role", "trains", "backend") else "right",
                             no_wrap=True, min_width=_MIN_WIDTH.get(col))
        for d in summary["devices"]:
            loaded = d.get("torch_loaded")
            table.add_row(
                d["device"], d["role"], str(d["split"]), _span(d["trained_blocks"]), _backend_label(d.get("backend")),
                "-" if loaded is None else ("yes" if loaded else "no"), str(d["chunks_streamed"]),
                str(d["rounds"]), f"{(d['peak_bytes'] or 0) / 2**20:.0f}/{d['budget_bytes'] / 2**20:.0f}",
            )
        self.console.print(table)
        final = summary["final"]
        acc = final.get("accuracy")
        self.console.print(
            f"[bold green]done[/] in {wall_s:.1f} s: {final.get('round', 0)} rounds, final accuracy "
            f"[bold]{acc:.4f}[/]" if acc is not None else f"done in {wall_s:.1f} s"
        )
        self.console.print(f"metrics: {run_dir / 'metrics.json'}" + (f"   plot: {plot}" if plot else ""))


def summarise_run(run, launches: Sequence, config: ServerConfig) -> dict:
    """Per-device and per-round results of a local run, from the devices' own event logs."""
    from edge_sdk.models import build_model

    names = build_model(config.model, seed=None).block_names
    devices = []
    for launch in launches:
        events = run.device_events.get(launch.device_id, [])
        welcome = next((e for e in events if e.get("event") == "welcome"), {})
        done = [e for e in events if e.get("event") == "round_done"]
        split = int(welcome.get("split", -1))
        devices.append({
            "device": launch.device_id,
            "role": welcome.get("role", "unregistered"),
            "split": split,
            "trained_blocks": names[split:] if split >= 0 else [],
            "frozen_chunks": welcome.get("chunks", []),
            "chunks_streamed": len(welcome.get("chunks", [])) * len(done),
            "rounds": len(done),
            "accepted": sum(1 for e in done if e.get("accepted")),
            "peak_bytes": max((int(e.get("peak_rss_bytes", 0)) for e in done), default=None),
            "budget_bytes": launch.budget_bytes,
            # What the device reported training with, and whether its process ever loaded torch.
            "backend": next((str(e["backend"]) for e in reversed(done) if e.get("backend")), None),
            "torch_loaded": any(bool(e.get("torch_loaded")) for e in done) if done else None,
            "mean_forward_s": _mean(e.get("forward_s") for e in done),
            "mean_train_s": _mean(e.get("train_s") for e in done),
            "returncode": run.returncodes.get(launch.device_id),
        })
    rounds = list(run.history)
    return {"rounds": rounds, "devices": devices, "final": rounds[-1] if rounds else {}}


#: Columns a narrow terminal must not squeeze (rich shrinks the others first).
_MIN_WIDTH = {"k": 2, "backend": 7, "torch": 5, "MiB": 9}

#: Short names of the training backends in the summary table (a backend of the device's own: its name).
_BACKENDS = {name: b.short or name for name, b in BACKENDS.items()}


def _backend_label(name: str | None) -> str:
    return _BACKENDS.get(name, name) if name else "-"


def _span(blocks: Sequence[str]) -> str:
    if not blocks:
        return "-"
    return blocks[0] if len(blocks) == 1 else f"{blocks[0]}..{blocks[-1]}"


def _mean(values) -> float | None:
    xs = [float(v) for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None
