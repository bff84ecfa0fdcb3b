"""``edgetrain serve`` and ``edgetrain device``: the two long-running halves of a deployment."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Optional

import typer

from orchestrator.cli import app


@app.command()
def serve(
    model: str = typer.Option("digits_mlp", help="Model from the zoo."),
    strategy: str = typer.Option("embracingfl", help="Aggregation strategy (fedavg, embracingfl)."),
    rounds: int = typer.Option(20, help="Rounds to run."),
    fraction: float = typer.Option(1.0, help="Share of idle connected devices sampled per round."),
    min_devices: int = typer.Option(2, help="Connected devices to wait for before a round starts."),
    quorum: float = typer.Option(1.0, help="Share of selected devices whose updates close a round early."),
    deadline: float = typer.Option(120.0, help="Seconds after which a round closes without its stragglers."),
    local_steps: int = typer.Option(10, help="Local steps per round (tau)."),
    batch_size: int = typer.Option(32, help="Local mini-batch size."),
    lr: float = typer.Option(0.05, help="Local learning rate."),
    data: str = typer.Option("digits", help="Held-out dataset for evaluation."),
    data_root: Optional[str] = typer.Option(None, help="Folder holding the datasets (default: $EDGETRAIN_DATA or ../shared/datasets)."),
    eval_every: int = typer.Option(1, help="Evaluate every n rounds (0: never)."),
    store: Path = typer.Option(Path("runs/serve"), help="Folder for the SQLite journal and checkpoints."),
    resume: bool = typer.Option(False, help="Continue from the last completed round in --store."),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8765),
    token: str = typer.Option("", help="Shared credential devices must present (empty: none)."),
    tls_cert: Optional[Path] = typer.Option(None, help="PEM certificate chain: serve wss:// (TLS) instead of ws://."),
    tls_key: Optional[Path] = typer.Option(None, help="Private key of --tls-cert (if not in the same file)."),
    seed: int = typer.Option(0),
) -> None:
    """Run the orchestrator: register devices, plan their splits, run rounds, checkpoint each one."""
    from orchestrator.config import ServerConfig
    from orchestrator.server import Orchestrator

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    config = ServerConfig(
        model=model, strategy=strategy, rounds=rounds, fraction=fraction, min_devices=min_devices, quorum=quorum,
        deadline_s=deadline, local_steps=local_steps, batch_size=batch_size, lr=lr, eval_data=data,
        data_root=data_root, eval_every=eval_every, store_dir=store, resume=resume, host=host, port=port,
        token=token, seed=seed, tls_cert=None if tls_cert is None else str(tls_cert),
        tls_key=None if tls_key is None else str(tls_key),
    )
    if tls_key is not None and tls_cert is None:
        raise typer.BadParameter("--tls-key needs --tls-cert")

    def on_event(kind: str, payload: dict) -> None:
        print(json.dumps({"event": kind, **payload}, default=str), flush=True)

    history = asyncio.run(Orchestrator(config, on_event=on_event).run())
    if history:
        last = history[-1]
        typer.echo(f"finished round {last['round']}: accuracy {last.get('accuracy', float('nan')):.4f}", err=True)


@app.command()
def device(
    server: str = typer.Option("ws://127.0.0.1:8765", help="Orchestrator URL (wss://... for TLS)."),
    tls_ca: Optional[Path] = typer.Option(None, help="For wss://: trust only this PEM file (a private CA or the "
                                                     "server's self-signed certificate); default: the system's."),
    device_id: str = typer.Option(..., "--id", help="This device's id."),
    device_class: Optional[str] = typer.Option(None, help="Declare the budget of a device class (profiles/devices)."),
    budget: Optional[str] = typer.Option(None, help="Declare a memory budget, e.g. 512MiB (default: probe this machine)."),
    data: str = typer.Option("digits", help="Local dataset."),
    data_root: Optional[str] = typer.Option(None, help="Folder holding the datasets."),
    data_limit: Optional[int] = typer.Option(None, help="Use only the dataset's first N training samples."),
    partition: str = typer.Option("iid", help="iid, dirichlet:ALPHA or natural."),
    client: int = typer.Option(0, help="This device's index in the partition."),
    num_clients: int = typer.Option(1, help="How many devices the dataset is split across."),
    seed: int = typer.Option(0, help="Partition seed (the same on every device)."),
    token: str = typer.Option(""),
    threads: int = typer.Option(1, help="Threads for ONNX Runtime and torch."),
    storage: str = typer.Option("auto", help="Where cached activations live: memory, disk, auto."),
    json_events: bool = typer.Option(False, "--json-events", help="Print events as JSON lines on stdout."),
    drop_rounds: str = typer.Option("", help="Emulation: vanish mid-round in these rounds (comma-separated)."),
    drop_prob: float = typer.Option(0.0, help="Emulation: probability of vanishing mid-round, per round."),
    cut_download_rounds: str = typer.Option("", help="Emulation: lose the connection half-way through the first "
                                                     "download of these rounds (comma-separated); it resumes."),
    cut_upload_rounds: str = typer.Option("", help="Emulation: lose the connection half-way through the update's "
                                                   "upload in these rounds (comma-separated); the upload resumes."),
    delay: float = typer.Option(0.0, help="Emulation: extra network delay before each upload, seconds."),
    reconnect_retries: int = typer.Option(30, help="Reconnect attempts after a lost connection."),
    force_split: Optional[int] = typer.Option(None, help="Emulation: ask the server for this split whatever the budget."),
) -> None:
    """Run one device: say hello, follow the plan, train its share each round until the server is done."""
    import numpy as np

    from edge_sdk.client import DeviceClient, DeviceConfig
    from edge_sdk.data import load_dataset, parse_partition, partition as split_data
    from profiles.devices import load_device_class
    from profiles.probe import probe
    from profiles.units import parse_size

    if budget is not None:
        budget_bytes = parse_size(budget)
    elif device_class is not None:
        budget_bytes = load_device_class(device_class).budget_bytes
    else:
        budget_bytes = probe().budget_bytes
    root = Path(data_root) if data_root else None
    # Memory-mapped: the device copies its own shard, never the whole dataset.
    dataset = load_dataset(data, root=root, split="train", limit=data_limit, mmap=True)
    scheme, alpha = parse_partition(partition)
    labels = dataset.groups if scheme == "natural" else dataset.y
    parts = split_data(labels, num_clients, scheme, alpha=alpha, seed=seed)
    if not 0 <= client < len(parts):
        raise typer.BadParameter(f"--client must be in [0, {len(parts)})")
    idx = parts[client]
    config = DeviceConfig(server=server, device_id=device_id, budget_bytes=budget_bytes, cores=threads,
                          device_class=device_class or "", token=token, storage=storage, threads=threads,
                          labels={} if force_split is None else {"force_split": str(force_split)},
                          drop_rounds=frozenset(int(r) for r in drop_rounds.split(",") if r.strip()),
                          cut_download_rounds=frozenset(int(r) for r in cut_download_rounds.split(",") if r.strip()),
                          cut_upload_rounds=frozenset(int(r) for r in cut_upload_rounds.split(",") if r.strip()),
                          drop_prob=drop_prob, drop_seed=seed, delay_s=delay, max_retries=reconnect_retries,
                          tls_ca=None if tls_ca is None else str(tls_ca))

    def on_event(kind: str, payload: dict) -> None:
        if json_events:
            print(json.dumps({"event": kind, **payload}, default=str), flush=True)
        else:
            typer.echo(f"{kind}: {payload}", err=True)

    x, y = np.asarray(dataset.x[idx]), np.asarray(dataset.y[idx])
    del dataset
    asyncio.run(DeviceClient(config, x, y, on_event=on_event).run())
