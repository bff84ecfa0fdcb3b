"""Run a fleet in the emulation mode its file names.

- ``processes``: one capped OS process per device (:func:`orchestrator.emulation.supervisor.run_fleet`);
- ``lightweight``: many uncapped devices per worker process
  (:func:`orchestrator.emulation.lightweight.run_lightweight`); with ``backend="ray"`` the workers
  are Ray actors, on a local Ray instance or a cluster (:func:`orchestrator.emulation.ray_backend.run_ray`,
  imported, with Ray, only then).

Both take the same fleet and orchestrator settings (:mod:`orchestrator.emulation.schedule`) and give
the same :class:`~orchestrator.emulation.recorder.EmulationRun`.

A run interrupted part-way continues in its own store (``ServerConfig.resume``; ``edgetrain emulate
--resume RUN_DIR``): the orchestrator restarts from the checkpoint of the last completed round
(:func:`completed_rounds`) and runs the rounds after it, with fresh device processes or workers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from orchestrator.config import ServerConfig
from orchestrator.emulation.fleet import DeviceSpec, Fleet
from orchestrator.emulation.lightweight import run_lightweight
from orchestrator.emulation.recorder import EmulationRun
from orchestrator.emulation.supervisor import run_fleet

__all__ = ["BACKENDS", "completed_rounds", "run_emulation"]

#: Where the lightweight mode's workers run: child processes of the emulator, or Ray actors.
BACKENDS = ("local", "ray")


async def run_emulation(
    fleet: Fleet,
    config: ServerConfig,
    *,
    specs: list[DeviceSpec] | None = None,
    on_event: Callable[[str, dict], None] | None = None,
    data_root: str | None = None,
    stderr_dir: Path | None = None,
    rss_guard: bool = True,
    workers: int | None = None,
    data_limit: int | None = None,
    backend: str = "local",
    address: str | None = None,
    advertise_host: str | None = None,
) -> EmulationRun:
    """Run `fleet` in its ``emulation.mode``.

    `rss_guard` applies to the process mode, `workers` (default: one per core, 2-4) to the lightweight one.
    `backend` "ray" runs the lightweight workers as Ray actors: at `address` (a running cluster) or on a
    local instance; the actors dial the orchestrator at `advertise_host` (default: ``config.host``, or
    this node's address when that is a wildcard)."""
    mode = fleet.emulation.mode
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend != "ray" and (address is not None or advertise_host is not None):
        raise ValueError("address and advertise_host apply to backend \"ray\"")
    if backend == "ray":
        if mode != "lightweight":
            raise ValueError(f"{fleet.name}: backend \"ray\" runs lightweight workers; emulation.mode is {mode!r}")
        from orchestrator.emulation.ray_backend import run_ray

        return await run_ray(fleet, config, address=address, advertise_host=advertise_host, specs=specs,
                             on_event=on_event, data_root=data_root, stderr_dir=stderr_dir, workers=workers)
    if mode == "lightweight":
        return await run_lightweight(fleet, config, specs=specs, on_event=on_event, data_root=data_root,
                                     stderr_dir=stderr_dir, workers=workers)
    if workers is not None:
        raise ValueError(f"{fleet.name}: workers apply to emulation.mode \"lightweight\", not {mode!r}")
    return await run_fleet(fleet, config, specs=specs, on_event=on_event, data_root=data_root,
                           stderr_dir=stderr_dir, rss_guard=rss_guard, data_limit=data_limit)


def completed_rounds(store_dir: Path) -> int:
    """The last round the store in `store_dir` completed, 0 if none (or no store there): a run resumed
    from it starts at the round after. Reads the journal only (read-only, no checkpoint is touched),
    so it may watch a store whose run is still going."""
    from orchestrator.store import Store

    try:
        store = Store.open_readonly(store_dir)
    except FileNotFoundError:
        return 0
    with store:
        return store.completed_rounds()
