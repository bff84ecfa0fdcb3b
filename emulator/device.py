"""An emulated device: the production client, its connection wrapped by its faults.

``python -m emulator.device LAUNCH --server URL [--json-events] [--data-root DIR]``
runs one :class:`~emulator.launch.DeviceLaunch` (LAUNCH is its JSON, or the path of a
file holding it) as its own process: the local fleet, the capped emulator and, through
:func:`build_client`, the lightweight workers start devices this way. Data loads as ``python -m
edge_sdk`` loads it (:func:`edge_sdk.cli.load_shard`); ``force_split`` goes in the hello as the
label ``force_split`` (honoured by a server configured to allow it); the other faults wrap the
connection (:mod:`emulator.faults`).

Under the ``rlimit-as+watchdog`` cap the process loads and warms up its runtimes first and then caps
its own address space (:func:`~emulator.capping.apply_self_limit`), so that the budget
covers what the device allocates, not the libraries' virtual reservations; a failed allocation then
exits with :data:`~emulator.capping.MEMORY_EXIT_CODE`, so that the emulator can tell a
device over its budget from one that crashed.

Imports neither torch nor the server at import time: a device process holds only what a device does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from emulator.capping import MECHANISM_ENV, MEMORY_EXIT_CODE, apply_self_limit, is_out_of_memory
from emulator.faults import FaultInjector, slowed_backend
from emulator.launch import DeviceLaunch

if TYPE_CHECKING:
    import numpy as np

    from edge_sdk.client import DeviceClient
    from edge_sdk.warm_tails import WarmTails

__all__ = ["build_client", "load_launch", "main", "shape_data"]


def load_launch(text_or_path: str) -> DeviceLaunch:
    """A launch from its JSON, or from the file holding it. ValueError when it is neither."""
    if text_or_path.lstrip().startswith("{"):
        return DeviceLaunch.from_json(text_or_path)
    try:
        return DeviceLaunch.from_json(Path(text_or_path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"neither a launch's JSON nor a readable file: {e}") from None


def shape_data(launch: DeviceLaunch, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The device's shard as its fleet group shapes it: only ``classes``, at most ``max_samples``
    (a seeded random subset), each label replaced with probability ``label_noise`` by a random class
    of the shard (the misaligned devices of FedALIGN's synthetic experiment, Section 4). Seeded by
    the partition seed and the device id, so a restarted device holds the same data."""
    import zlib

    import numpy as np

    if not launch.classes and launch.max_samples is None and launch.label_noise == 0:
        return x, y
    rng = np.random.default_rng([launch.seed, zlib.crc32(launch.device_id.encode())])
    present = np.unique(np.asarray(y))
    idx = np.arange(len(y))
    if launch.classes:
        idx = idx[np.isin(np.asarray(y), launch.classes)]
    if launch.max_samples is not None and len(idx) > launch.max_samples:
        idx = np.sort(rng.choice(idx, size=launch.max_samples, replace=False))
    x, y = np.asarray(x[idx]), np.array(y[idx])
    if launch.label_noise > 0 and len(y):
        flip = rng.random(len(y)) < launch.label_noise
        y[flip] = rng.choice(present, size=int(flip.sum())).astype(y.dtype)
    return x, y


def build_client(launch: DeviceLaunch, x: np.ndarray, y: np.ndarray, *, server: str,
                 on_event: Callable[[str, dict], None], in_process: bool,
                 warm_tails: WarmTails | None = None) -> DeviceClient:
    """The production client for ``launch``, with its faults applied from outside.

    ``in_process``: the device shares its process with others (lightweight workers), so vanishing
    raises :class:`~emulator.faults.DeviceVanished` instead of ending the process, and
    the process keeps its heap between reports (no malloc_trim per device). ``warm_tails``: the
    worker's pool of built tails, shared by its devices (a device that is not training holds none)."""
    from edge_sdk.client import DeviceClient
    from edge_sdk.settings import DeviceSettings

    f = launch.faults
    labels = dict(launch.labels)
    if f.force_split is not None:
        labels["force_split"] = str(f.force_split)
    settings = {**launch.settings(), "labels": labels}
    if f.step_delay_s > 0:  # slow steps: the backend's class wrapped, not the connection
        from edge_sdk.backends import backend_class

        settings["backend"] = slowed_backend(backend_class(launch.backend), f.step_delay_s)
    config = DeviceSettings(**settings, server=server, warm_tails=warm_tails, trim_memory=not in_process)
    if not f.on_connection:  # nothing to inject: the production connection, untouched
        return DeviceClient(config, x, y, on_event=on_event)
    injector = FaultInjector(f, launch.device_id, seed=launch.seed, on_event=on_event, in_process=in_process)
    return DeviceClient(config, x, y, on_event=on_event, connect=injector.connect)


def warm_up_runtimes(backend: str = "torch") -> None:
    """Load and warm up what a device loads lazily (its first ONNX session, its training backend's
    first step, as the device takes them), before it connects; under the RLIMIT_AS fallback the
    limit is then set above it (docs/measurements.md).

    The device runs both in a worker thread (``asyncio.to_thread``), so the warm-up does too: the
    malloc arena that thread takes (glibc reserves 64 MiB of address space for it) then exists
    before the limit is set, instead of consuming the allowance of a device whose RSS is well under
    its budget."""
    from edge_sdk.backends import backend_class
    from edge_sdk.forward import warm_up as onnxruntime_warm_up
    from edge_sdk.memory import tune_allocator

    tune_allocator()  # the device's own allocator settings, before any thread takes an arena
    trainer = backend_class(backend)
    failed: list[BaseException] = []

    def warm() -> None:
        try:
            onnxruntime_warm_up()
            trainer.warm_up()  # an ONNX Runtime device never loads torch
        except BaseException as exc:  # re-raised in the main thread
            failed.append(exc)

    worker = threading.Thread(target=warm, name="warm-up")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m emulator.device",
                                 description="Run one emulated device (a DeviceLaunch) against an orchestrator.")
    ap.add_argument("launch", help="the device's DeviceLaunch as JSON, or a file holding it")
    ap.add_argument("--server", required=True, help="orchestrator URL, e.g. ws://127.0.0.1:8765")
    ap.add_argument("--json-events", action="store_true", help="print events as JSON lines on stdout")
    ap.add_argument("--data-root", default=None, help="folder holding the datasets")
    return ap


def _run(launch: DeviceLaunch, server: str, *, json_events: bool, data_root: str | None) -> None:
    from edge_sdk.cli import event_printer, load_shard

    # A device loads its runtimes before it connects, as an app would at start: the first round it
    # is sampled for then costs what every later one does, not an import of torch on top.
    warm_up_runtimes(launch.backend)
    if os.environ.get(MECHANISM_ENV) == "rlimit-as+watchdog":
        apply_self_limit()
    x, y = load_shard(launch.data, client=launch.client, num_clients=launch.num_clients, partition=launch.partition,
                      seed=launch.seed, data_root=data_root, data_limit=launch.data_limit)
    x, y = shape_data(launch, x, y)
    client = build_client(launch, x, y, server=server, on_event=event_printer(json_events), in_process=False)
    del x, y
    asyncio.run(client.run())


def main(argv: Sequence[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        launch = load_launch(args.launch)
    except ValueError as e:
        parser.error(str(e))
    try:
        _run(launch, args.server, json_events=args.json_events, data_root=args.data_root)
    except BaseException as exc:
        cause: BaseException | None = exc
        while cause is not None:
            if is_out_of_memory(cause):
                print(f"out of memory: {cause}", file=sys.stderr, flush=True)
                os._exit(MEMORY_EXIT_CODE)
            cause = cause.__cause__ or cause.__context__
        raise


if __name__ == "__main__":
    main()
