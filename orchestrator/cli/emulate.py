"""``edgetrain emulate --fleet FILE``: a fleet file's devices as capped OS processes against a local orchestrator.

Each device is held to its class's memory budget and CPU share (see ``orchestrator.emulation.runner``);
the run writes ``metrics.json`` (per round, and per device: cap mechanism, peak memory against budget,
how each process ended, time per phase per round), ``accuracy.png`` and ``memory.png``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Optional

import typer

from orchestrator.cli import app


@app.command()
def emulate(
    fleet: str = typer.Option(..., "--fleet", help="A fleet file, or the name of one in profiles/fleets."),
    rounds: Optional[int] = typer.Option(None, help="Rounds (default: the fleet's training.rounds)."),
    out: Path = typer.Option(Path("runs"), help="Where runs/<timestamp>/ is written."),
    data_root: Optional[str] = typer.Option(None, help="Folder holding the datasets."),
    deadline: float = typer.Option(120.0, help="Seconds after which a round closes without its stragglers."),
    rss_guard: bool = typer.Option(True, help="Also kill a device whose resident set passes its budget."),
) -> None:
    """Run every device of FILE under its memory cap and CPU share; report peaks against budgets."""
    from rich.console import Console

    from orchestrator.emulation.fleet import FleetError, load_fleet
    from orchestrator.emulation.runner import run_fleet, server_config
    from orchestrator.fleetview import FleetView
    from orchestrator.report import new_run_dir, plot_accuracy, plot_memory, write_metrics

    console = Console()
    try:
        spec = load_fleet(fleet)
    except FleetError as e:
        raise typer.BadParameter(str(e), param_hint="--fleet") from None
    if spec.emulation.mode != "processes":
        raise typer.BadParameter(f"{spec.name}: emulation.mode is {spec.emulation.mode!r}; "
                                 "edgetrain emulate runs mode \"processes\"", param_hint="--fleet")
    if rounds is not None and rounds < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--rounds")
    run_dir = new_run_dir(out)
    config = server_config(spec, rounds=rounds, store_dir=run_dir / "store", data_root=data_root, deadline_s=deadline)
    devices = spec.devices()
    console.print(f"[bold]edgetrain emulate[/]: fleet {spec.name} ({spec.model} on {spec.dataset}), "
                  f"{len(devices)} devices, {config.rounds} rounds, memory cap {spec.emulation.memory_cap}; "
                  f"writing {run_dir}")
    t0 = time.monotonic()
    with FleetView(console, rounds=config.rounds, devices=len(devices)) as view:

        def on_event(kind: str, data: dict) -> None:
            view.on_event(kind, data)
            if kind == "emulator:exit" and data.get("ended") not in ("finished", "stopped"):
                where = f" in round {data['round']}" if data.get("round") else ""
                by = f" by {data['killed_by']}" if data.get("killed_by") else ""
                console.print(f"[yellow]{data['device']}[/]: {data['ended']}{by}{where} (rc {data['returncode']})")

        run = asyncio.run(run_fleet(spec, config, specs=devices, on_event=on_event, data_root=data_root,
                                    stderr_dir=run_dir / "logs", rss_guard=rss_guard))
    wall = time.monotonic() - t0
    per_device = [d.to_dict() for d in run.devices]
    final = run.history[-1] if run.history else {}
    write_metrics(run_dir, {"fleet": spec.name, "fleet_file": str(spec.path or fleet), "config": config.to_dict(),
                            "wall_s": wall, "rounds": run.history, "devices": per_device, "final": final})
    acc_plot = plot_accuracy(run_dir, run.history, title=f"{spec.name}: {spec.model} on {spec.dataset}")
    mem_plot = plot_memory(run_dir, per_device, title=f"{spec.name}: peak memory per device against its budget")
    _print_summary(console, per_device, final, wall, run_dir, [p for p in (acc_plot, mem_plot) if p])


def _print_summary(console, devices: list[dict], final: dict, wall_s: float, run_dir: Path, plots: list[Path]) -> None:
    from rich.table import Table

    mib = float(1 << 20)
    table = Table(title="devices")
    for col in ("device", "role", "split", "cap", "cpu", "status", "rounds", "peak MiB", "peak RSS MiB",
                "budget MiB", "fwd s", "train s"):
        table.add_column(col, justify="left" if col in ("device", "role", "cap", "cpu", "status") else "right")
    for d in devices:
        rounds = d["rounds"]
        fwd = sum(r.get("forward_s") or 0 for r in rounds) / len(rounds) if rounds else 0.0
        train = sum(r.get("train_s") or 0 for r in rounds) / len(rounds) if rounds else 0.0
        status = d["status"]
        last = d["lives"][-1] if d["lives"] else {}
        if last.get("killed_by") and status != "stopped":
            status += f" ({last['killed_by']}, round {last.get('round')})"
        cpu = f"{d['cpu_share']:.2f} ({d['cpu_mechanism']})" if d["cpu_share"] is not None else d["cpu_mechanism"]
        table.add_row(d["device"], d["role"], str(d["split"]), d["mechanism"], cpu, status, str(d["rounds_reported"]),
                      f"{(d['peak_bytes'] or 0) / mib:.0f}", f"{(d['peak_rss_bytes'] or 0) / mib:.0f}",
                      f"{d['budget_bytes'] / mib:.0f}", f"{fwd:.2f}", f"{train:.2f}")
    console.print(table)
    acc = final.get("accuracy")
    console.print(f"[bold green]done[/] in {wall_s:.1f} s: {final.get('round', 0)} rounds"
                  + (f", final accuracy [bold]{acc:.4f}[/]" if acc is not None else ""))
    console.print(f"metrics: {run_dir / 'metrics.json'}" + "".join(f"   plot: {p}" for p in plots))
