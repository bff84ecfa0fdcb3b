"""A local fleet: one orchestrator in this process and one OS process per device, on 127.0.0.1.

Used by ``edgetrain demo`` and the integration tests; ``edgetrain emulate`` adds memory caps.
Each device is a :class:`~emulator.launch.DeviceLaunch` run by
``python -m emulator.device``: the client a real board runs, with the launch's faults
(if any) applied around its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from emulator.launch import DeviceLaunch, Faults, device_argv
from emulator.recorder import json_events
from orchestrator.config import ServerConfig
from orchestrator.server import Orchestrator

__all__ = ["DeviceLaunch", "Faults", "FleetRun", "device_env", "min_budget_for_split", "prepare_device_data",
           "role_budgets", "run_local_fleet", "start_orchestrator"]


@dataclass
class FleetRun:
    """What a local run produced: per-round metrics and per-device events."""

    history: list[dict]
    device_events: dict[str, list[dict]] = field(default_factory=dict)
    returncodes: dict[str, int | None] = field(default_factory=dict)


def prepare_device_data(launches: Sequence[DeviceLaunch], data_root: str | None) -> None:
    """Write the memory-mapped copy of every dataset the devices will load, once, before they start.

    Devices then map it and copy only their shard; without this each would parse the whole
    dataset at once (``edge_sdk.data.load_dataset(mmap=True)``).
    """
    from edge_sdk.data import load_dataset

    for name, limit in sorted({(d.data, d.data_limit) for d in launches}, key=str):
        load_dataset(name, root=data_root, split="train", limit=limit, mmap=True)


def device_env(payloads: str | None = None) -> dict[str, str]:
    """Environment for device processes: one thread each, so many share two cores politely; and, unless
    the user named one ($EDGETRAIN_PAYLOAD_CACHE), ``payloads`` as the root of the devices' payload
    folders: an emulation's devices live as long as its run, so their payloads go with it (a folder per
    server port and device id in the user's cache would pile up, run after run, on ports never met again)."""
    from edge_sdk.payload_store import PAYLOAD_CACHE_ENV

    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    if payloads is not None and not os.environ.get(PAYLOAD_CACHE_ENV):
        env[PAYLOAD_CACHE_ENV] = payloads
    return env


async def _pump(proc: asyncio.subprocess.Process, device_id: str, sink: list[dict],
                on_event: Callable[[str, dict], None]) -> None:
    assert proc.stdout is not None
    async for event in json_events(proc.stdout):
        sink.append(event)
        on_event("device:" + str(event.get("event")), event)


async def start_orchestrator(
    config: ServerConfig, on_event: Callable[[str, dict], None]
) -> tuple[Orchestrator, asyncio.Task[list[dict]]]:
    """Start an orchestrator in this event loop; return once it listens (its port is known).

    The task's result is the run's per-round metrics; a server that fails to start raises here.
    """
    orch = Orchestrator(config, on_event=on_event)
    ready = asyncio.Event()
    server_task = asyncio.create_task(orch.run(ready=ready))
    ready_task = asyncio.create_task(ready.wait())
    await asyncio.wait({server_task, ready_task}, return_when=asyncio.FIRST_COMPLETED)
    ready_task.cancel()
    if server_task.done():
        server_task.result()  # raises the server's startup error
    return orch, server_task


async def run_local_fleet(
    config: ServerConfig,
    devices: Sequence[DeviceLaunch],
    *,
    on_event: Callable[[str, dict], None] | None = None,
    data_root: str | None = None,
    stderr_dir: Path | None = None,
    python: Callable[[DeviceLaunch], str] | None = None,
) -> FleetRun:
    """Start the orchestrator, start every device, wait for the last round, stop the devices.

    A device launched with ``force_split`` gets that split: the server is told to honour it.
    ``python`` picks each device's interpreter (default: this one), e.g. one without torch."""
    emit = on_event or (lambda kind, data: None)
    if any(d.faults.force_split is not None for d in devices):
        config = dataclasses.replace(config, allow_forced_split=True)
    prepare_device_data(devices, data_root)
    orch, server_task = await start_orchestrator(config, emit)
    url = f"ws://{config.host}:{orch.port}"
    events: dict[str, list[dict]] = {d.device_id: [] for d in devices}
    procs: dict[str, asyncio.subprocess.Process] = {}
    pumps = []
    if stderr_dir is not None:
        stderr_dir.mkdir(parents=True, exist_ok=True)
    payloads = tempfile.TemporaryDirectory(prefix="edgetrain-payloads-")
    try:
        for d in devices:
            err = open(stderr_dir / f"{d.device_id}.log", "wb") if stderr_dir else asyncio.subprocess.DEVNULL
            proc = await asyncio.create_subprocess_exec(
                *device_argv(d, url, data_root=data_root, python=python(d) if python else sys.executable), stdout=asyncio.subprocess.PIPE, stderr=err,
                env=device_env(payloads.name),
            )
            procs[d.device_id] = proc
            pumps.append(asyncio.create_task(_pump(proc, d.device_id, events[d.device_id], emit)))
        history = await server_task
    finally:
        if not server_task.done():
            server_task.cancel()
        for proc in procs.values():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=10)
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for t in pumps:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t, timeout=5)
        payloads.cleanup()
    return FleetRun(history, events, {k: p.returncode for k, p in procs.items()})


def min_budget_for_split(model, split: int, batch: int = 32, local_samples: int = 0, *, backend: str = "torch",
                         graph_splits: Sequence[int] = (), secure: bool = False) -> int:
    """The smallest budget for which the planner lets a device on ``backend`` train blocks [split, L)
    (``secure``: in a run with secure aggregation, whose devices are planned with its memory)."""
    from profiles.accounting import TrainingMemory
    from profiles.planner import PlanError, plan_split

    memory = TrainingMemory().secured() if secure else TrainingMemory()
    lo, hi = 1 << 20, 1 << 40
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            fits = plan_split(model, mid, batch, local_samples=local_samples, backends=(backend,),
                              graph_splits=graph_splits, memory=memory).split <= split
        except PlanError:
            fits = False
        lo, hi = (lo, mid) if fits else (mid, hi)
    return hi


def role_budgets(model_name: str, batch: int = 32, local_samples: int = 2_000, *, backend: str = "torch",
                 secure: bool = False) -> dict[str, int]:
    """Budgets that make the planner give each role on this model (for demos and tests).

    ``backend`` is the runtime the devices are planned on (``torch``, ``onnxruntime``: a name of
    ``profiles.runtime.RUNTIMES``). Strong: enough for the whole model. Weak: just enough for the last block. Moderate: just
    enough for the smallest suffix the planner still calls moderate (or the middle split).
    ``secure``: for a run with secure aggregation (its devices hold more: :meth:`TrainingMemory.secured`).
    ``local_samples`` bounds a device's dataset, which the budget must hold too (the default
    covers any share of scikit-learn's digits, 1,438 training samples).
    """
    from edge_sdk.models import build_model
    from profiles.planner import plan_split
    from profiles.runtime import RUNTIMES

    from profiles.accounting import TrainingMemory, measure_model

    from exporters.train_export import train_graph_refusal

    model = build_model(model_name, seed=None)
    cost = measure_model(model)
    graphs = [k for k in range(len(model)) if train_graph_refusal(model, k) is None] if RUNTIMES[backend].needs_graph else []
    splits = graphs or range(len(model))
    budgets = {k: min_budget_for_split(cost, k, batch, local_samples, backend=backend, graph_splits=graphs,
                                       secure=secure) for k in splits}
    memory = TrainingMemory().secured() if secure else TrainingMemory()  # as min_budget_for_split plans
    roles = {k: plan_split(cost, b, batch, local_samples=local_samples, backends=(backend,),
                           graph_splits=graphs, memory=memory).role for k, b in budgets.items()}
    moderate = [k for k in sorted(budgets) if roles[k] == "moderate"]
    k_mod = moderate[-1] if moderate else len(model) // 2
    return {"strong": budgets[min(budgets)], "moderate": budgets[k_mod], "weak": budgets[max(budgets)]}
