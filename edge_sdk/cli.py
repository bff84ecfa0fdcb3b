"""``python -m edge_sdk``: run one device against an orchestrator until training is over.

The device's own entry point, so it ships with the device SDK and imports nothing outside it
(argparse, not the orchestrator's typer app): a board needs only ``edge_sdk`` and its
dependencies. ``edgetrain device`` (the orchestrator's command line) wraps it and adds
``--device-class``; emulated devices (``orchestrator.emulation.device``) reuse its data loading.

    python -m edge_sdk --server ws://host:8765 --id phone-1 --budget 300MiB --data digits --client 0 --num-clients 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from edge_sdk.units import parse_size

__all__ = ["build_parser", "device_config", "event_printer", "load_shard", "main", "partition_indices", "run"]


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser(prog: str = "python -m edge_sdk") -> argparse.ArgumentParser:
    """The device's options; a wrapper may add its own before parsing."""
    ap = argparse.ArgumentParser(prog=prog, description="Run one device: say hello, follow the plan, train its "
                                                        "share each round until the server is done.")
    ap.add_argument("--server", default="ws://127.0.0.1:8765", help="orchestrator URL (wss://... for TLS)")
    ap.add_argument("--id", dest="device_id", required=True, help="this device's id")
    ap.add_argument("--budget", type=_size, default=None,
                    help="declared memory budget, e.g. 512MiB (default: probe this machine)")
    ap.add_argument("--data", default="digits", help="local dataset")
    ap.add_argument("--data-root", default=None, help="folder holding the datasets")
    ap.add_argument("--data-limit", type=int, default=None, help="use only the dataset's first N training samples")
    ap.add_argument("--partition", default="iid", help="iid, dirichlet:ALPHA or natural")
    ap.add_argument("--client", type=int, default=0, help="this device's index in the partition")
    ap.add_argument("--num-clients", type=int, default=1, help="how many devices the dataset is split across")
    ap.add_argument("--seed", type=int, default=0, help="partition seed (the same on every device)")
    ap.add_argument("--token", default="", help="shared token the server expects (a lab setting)")
    ap.add_argument("--secret-file", default=None,
                    help="file holding this device's enrolled credential (edgetrain device enroll); each hello "
                         "proves it without sending it")
    ap.add_argument("--tls-ca", default=None, help="for wss://: trust only this PEM file (a private CA or the "
                                                   "server's self-signed certificate); default: the system's")
    ap.add_argument("--threads", type=int, default=1, help="threads for ONNX Runtime and torch")
    ap.add_argument("--storage", default="auto", choices=("auto", "memory", "disk"),
                    help="where cached activations live")
    ap.add_argument("--backend", default="auto", choices=("auto", "torch", "onnxruntime"),
                    help="training backend: torch, onnxruntime (trains the server's training graphs; never "
                         "imports torch or model code), or auto (torch if installed)")
    ap.add_argument("--registry", default=None, metavar="PACKAGE.MODULE:NAME",
                    help="the phases and selections this device runs (an edge_sdk.phases.DeviceRegistry, e.g. "
                         "edge_sdk.algorithms.DEFAULT_REGISTRY extended with an algorithm's device-side steps)")
    ap.add_argument("--json-events", action="store_true", help="print events as JSON lines on stdout")
    ap.add_argument("--reconnect-retries", type=int, default=30, help="reconnect attempts after a lost connection")
    ap.add_argument("--private-heat", type=float, default=None, metavar="EPSILON",
                    help="report which table rows the data touches as randomized-response bits with this epsilon "
                         "(FedSubAvg's private heat) and download them padded with decoys, never the true rows")
    ap.add_argument("--table-rows", action="append", type=_table_rows, default=[], metavar="COLUMN=ROWS",
                    help="for --private-heat: rows of the sparse table input column COLUMN indexes; repeatable "
                         "(default for MovieLens-indexed data: the zoo recommender's, 0=611 and 1=9742)")
    ap.add_argument("--label", dest="labels", action="append", type=_label, default=[], metavar="KEY=VALUE",
                    help="a label sent in the hello, for the server's strategy (e.g. priority=1 for FedALIGN, "
                         "internal=1 for VaRSeL); repeatable")
    return ap


#: Sparse tables by input column for data indexed like MovieLens latest-small (user, movie): the
#: zoo recommender's tables, so --private-heat needs no --table-rows there.
MOVIELENS_TABLES: dict[str, int] = {"0": 611, "1": 9_742}
_DATASET_TABLES: dict[str, dict[str, int]] = {"movielens": MOVIELENS_TABLES, "synthetic_ratings": MOVIELENS_TABLES}


def _table_rows(text: str) -> tuple[str, int]:
    column, sep, rows = text.partition("=")
    if not sep or not column.strip().isdigit() or not rows.strip().isdigit() or int(rows) < 1:
        raise argparse.ArgumentTypeError(f"expected COLUMN=ROWS with a column number and a row count, not {text!r}")
    return str(int(column)), int(rows)


def private_heat(args: argparse.Namespace):
    """The device's private-heat settings from ``--private-heat`` and ``--table-rows`` (None without them).

    The bit vector of a table has one bit per row, so the device must know each table's size: given,
    or the recommender's for MovieLens-indexed data. Raises ValueError naming what is missing."""
    from edge_sdk.privacy import PrivateHeat

    epsilon = getattr(args, "private_heat", None)
    given = dict(getattr(args, "table_rows", None) or [])
    if epsilon is None:
        if given:
            raise ValueError("--table-rows is for --private-heat")
        return None
    tables = given or _DATASET_TABLES.get(args.data)
    if not tables:
        raise ValueError(f"--private-heat needs --table-rows COLUMN=ROWS for {args.data!r} data "
                         "(the sizes of the model's sparse tables)")
    return PrivateHeat(float(epsilon), tables)


def _registry(reference: str | None) -> dict:
    """``registry=`` for DeviceConfig from ``--registry`` (nothing without it: the default registry)."""
    if reference is None:
        return {}
    from edge_sdk.phases import DeviceRegistry
    from edge_sdk.references import load_reference

    try:
        registry = load_reference(reference, "--registry")
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if not isinstance(registry, DeviceRegistry):
        raise SystemExit(f"--registry {reference!r} is a {type(registry).__name__}, not an edge_sdk.phases.DeviceRegistry")
    return {"registry": registry}


def _read_secret(path: str | None) -> str:
    """The credential in ``path`` (surrounding whitespace dropped), or "" without one."""
    if path is None:
        return ""
    secret = Path(path).read_text().strip()
    if not secret:
        raise SystemExit(f"{path} holds no credential")
    return secret


def _label(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise argparse.ArgumentTypeError(f"a label is KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def partition_indices(dataset, partition: str, num_clients: int, seed: int) -> list[np.ndarray]:
    """Every device's sample indices in ``dataset`` (an ``edge_sdk.data.Dataset``): the same split
    on every device that uses the same partition, count and seed."""
    from edge_sdk.data import parse_partition, partition as split_data

    scheme, alpha = parse_partition(partition)
    labels = dataset.groups if scheme == "natural" else dataset.y
    return split_data(labels, num_clients, scheme, alpha=alpha, seed=seed)


def load_shard(data: str, *, client: int, num_clients: int, partition: str = "iid", seed: int = 0,
               data_root: str | None = None, data_limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """This device's share of the training split, copied out of a memory-mapped dataset (the
    device never holds the whole dataset). ValueError for a client outside the partition."""
    from edge_sdk.data import load_dataset

    dataset = load_dataset(data, root=Path(data_root) if data_root else None, split="train", limit=data_limit,
                           mmap=True)
    parts = partition_indices(dataset, partition, num_clients, seed)
    if not 0 <= client < len(parts):
        raise ValueError(f"client {client} outside [0, {len(parts)})")
    idx = parts[client]
    return np.asarray(dataset.x[idx]), np.asarray(dataset.y[idx])


def event_printer(json_events: bool) -> Callable[[str, dict], None]:
    """Events as JSON lines on stdout (for a supervisor), or readable lines on stderr."""

    def on_event(kind: str, payload: dict) -> None:
        if json_events:
            print(json.dumps({"event": kind, **payload}, default=str), flush=True)
        else:
            print(f"{kind}: {payload}", file=sys.stderr, flush=True)

    return on_event


def device_config(args: argparse.Namespace, *, budget_bytes: int | None = None, device_class: str = ""):
    """The client's settings from parsed options; the budget is ``--budget``, else ``budget_bytes``,
    else what this machine offers (:func:`edge_sdk.probe.probe`)."""
    from edge_sdk.client import DeviceConfig

    budget = args.budget if args.budget is not None else budget_bytes
    if budget is None:
        from edge_sdk.probe import probe

        budget = probe().budget_bytes
    return DeviceConfig(server=args.server, device_id=args.device_id, budget_bytes=budget, cores=args.threads,
                        device_class=device_class, token=args.token, secret=_read_secret(args.secret_file),
                        storage=args.storage, threads=args.threads,
                        max_retries=args.reconnect_retries, tls_ca=args.tls_ca,
                        labels=dict(getattr(args, "labels", None) or []), private_heat=private_heat(args),
                        backend=getattr(args, "backend", "auto"), **_registry(getattr(args, "registry", None)))


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, *, budget_bytes: int | None = None,
        device_class: str = "") -> None:
    """Run the device the options parsed by ``parser`` describe (see :func:`device_config` for the
    budget); a data option that does not work (unknown dataset or partition, client outside the
    partition) is reported by ``parser`` as a usage error."""
    from edge_sdk.client import DeviceClient

    try:
        x, y = load_shard(args.data, client=args.client, num_clients=args.num_clients, partition=args.partition,
                          seed=args.seed, data_root=args.data_root, data_limit=args.data_limit)
        config = device_config(args, budget_bytes=budget_bytes, device_class=device_class)
    except ValueError as e:
        parser.error(str(e))
    asyncio.run(DeviceClient(config, x, y, on_event=event_printer(args.json_events)).run())


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    run(parser.parse_args(argv), parser)
