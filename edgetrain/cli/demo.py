"""``edgetrain demo``: a mixed fleet (strong, moderate, weak) trains a real model on this machine.

The orchestrator runs in this process and every device is its own OS process talking websockets
on 127.0.0.1. Device budgets are set so that the planner gives the intended roles for the demo's
model: on real hardware the same roles follow from the device classes in ``profiles/devices``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Optional

import typer

from edgetrain.cli import app


@app.command(epilog="Example: edgetrain demo --rounds 5 (a mixed fleet on digits; runs/<time>/accuracy.png)")
def demo(
    model: str = typer.Option("digits_mlp", help="Model: a zoo name, or package.module:factory for one of your own (docs/models.md)."),
    data: str = typer.Option("digits", help="Dataset: digits (bundled with scikit-learn), or femnist / cifar10 from --data-root."),
    data_root: Optional[str] = typer.Option(
        None, help="Folder holding the research datasets (default: $EDGETRAIN_DATA); digits needs none."),
    strong: int = typer.Option(2, help="Strong devices (train the whole model)."),
    moderate: int = typer.Option(2, help="Moderate devices."),
    weak: int = typer.Option(4, help="Weak devices (stream frozen chunks, train the last blocks)."),
    weak_backend: str = typer.Option("onnxruntime", help="Weak devices' training backend (a device's --backend): "
                                                         "onnxruntime (the tail's training graph; torch never loads), "
                                                         "torch, or package.module:Class."),
    rounds: int = typer.Option(15, help="Rounds."),
    local_steps: int = typer.Option(10, help="Local steps per round (tau)."),
    lr: float = typer.Option(0.1, help="Local learning rate."),
    partition: str = typer.Option("dirichlet:0.5", help="iid, dirichlet:ALPHA or natural."),
    strategy: str = typer.Option("embracingfl", help="Aggregation strategy."),
    out: Path = typer.Option(Path("runs"), help="Where runs/<timestamp>/ is written."),
    seed: int = typer.Option(0),
) -> None:
    """Train a mixed fleet end to end and write metrics.json and accuracy.png under runs/<timestamp>/."""
    from orchestrator.config import ServerConfig

    roles = ["strong"] * strong + ["moderate"] * moderate + ["weak"] * weak
    n = len(roles)
    if n < 1:
        raise typer.BadParameter("the fleet needs at least one device")
    # The settings are checked before torch loads or a run folder is made: a mistyped option is one
    # line at once, and leaves no empty runs/<time>/ behind.
    config = ServerConfig(
        model=model, strategy=strategy, rounds=rounds, min_devices=n, local_steps=local_steps, lr=lr,
        eval_data=data, data_root=data_root, store_dir=out / "store", seed=seed, deadline_s=120,
        wait_devices_s=120,  # the demo starts its devices: a fleet that died is an error, not a wait
        keep_checkpoints=1,  # a demo is not resumed: its final weights are what it keeps
    )
    from profiles.runtime import backend_runtime

    try:
        weak_runtime = backend_runtime(weak_backend).name
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--weak-backend") from None

    from edgetrain.cli import console as wide_console
    from emulator.localfleet import DeviceLaunch, role_budgets, run_local_fleet
    from orchestrator.views.fleetview import FleetView, summarise_run
    from orchestrator.views.report import new_run_dir, plot_accuracy, write_metrics

    console = wide_console()
    run_dir = new_run_dir(out)
    config = dataclasses.replace(config, store_dir=run_dir / "store")
    budgets = role_budgets(model)
    # A weak device is budgeted for the runtime its backend is planned on (ONNX Runtime without torch:
    # a far smaller process), so the planner still gives it the last block only.
    if weak_runtime != "torch":
        budgets["weak"] = role_budgets(model, backend=weak_runtime)["weak"]
    launches = [
        DeviceLaunch(device_id=f"{role}-{i:02d}", budget_bytes=budgets[role], client=i, num_clients=n,
                     data=data, partition=partition, seed=seed,
                     backend=weak_backend if role == "weak" else "torch")
        for i, role in enumerate(roles)
    ]
    console.print(f"[bold]edgetrain demo[/]: {model} on {data}, {strong} strong + {moderate} moderate + {weak} weak "
                  f"devices (weak on {weak_backend}), {rounds} rounds, strategy {strategy}; writing {run_dir}")
    t0 = time.monotonic()
    with FleetView(console, rounds=rounds, devices=n) as view:
        run = asyncio.run(run_local_fleet(config, launches, on_event=view.on_event, data_root=data_root,
                                          stderr_dir=run_dir / "logs"))
    wall = time.monotonic() - t0
    _prune_chunks(config.store_dir)
    summary = summarise_run(run, launches, config)
    write_metrics(run_dir, {"config": config.to_dict(), "wall_s": wall, **summary})
    plot = plot_accuracy(run_dir, summary["rounds"], title=f"{model} on {data}: {strong}/{moderate}/{weak} strong/moderate/weak")
    view.print_summary(summary, wall_s=wall, run_dir=run_dir, plot=plot)


def _prune_chunks(store: Path) -> None:
    """Drop the exported chunks the run kept on disk (re-exported from a checkpoint when needed), so
    that a demo's folder holds its report and final weights, not hundreds of MiB of ONNX."""
    from exporters.cache import ChunkCache

    ChunkCache(max_bytes=0, directory=store / "chunks").prune_disk(0)
