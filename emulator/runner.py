"""Run a fleet with the emulation backend its mode and the caller's ``backend`` name.

The backends are one table, :data:`emulator.backends.EMULATION_BACKENDS`: capped
processes (``processes``), many devices per worker process (``lightweight``), the same workers as Ray
actors (``ray``, imported, with Ray, only then). Each takes the same fleet and orchestrator settings
(:mod:`emulator.schedule`) and gives the same
:class:`~emulator.recorder.EmulationRun`.

A run interrupted part-way continues in its own store (``ServerConfig.resume``; ``edgetrain emulate
--resume RUN_DIR``): the orchestrator restarts from the checkpoint of the last completed round
(:func:`completed_rounds`) and runs the rounds after it, with fresh device processes or workers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from emulator.backends import emulation_backend, where_choices
from emulator.fleet import DeviceSpec, Fleet
from emulator.recorder import EmulationRun
from orchestrator.config import ServerConfig

__all__ = ["BACKENDS", "completed_rounds", "run_emulation"]

#: Where a fleet's devices may run (``edgetrain emulate --backend``): the backend table's "where" column.
BACKENDS = where_choices()


async def run_emulation(
    fleet: Fleet,
    config: ServerConfig,
    *,
    specs: list[DeviceSpec] | None = None,
    on_event: Callable[[str, dict], None] | None = None,
    data_root: str | None = None,
    stderr_dir: Path | None = None,
    rss_guard: bool | None = None,
    workers: int | None = None,
    data_limit: int | None = None,
    backend: str = "local",
    address: str | None = None,
    advertise_host: str | None = None,
) -> EmulationRun:
    """Run `fleet` with the backend of its ``emulation.mode`` at `backend` ("local" or "ray").

    `rss_guard` (default on) and `data_limit` apply to the process mode, `workers` (default: one per
    core, 2-4) to the lightweight one; `address` (a running Ray cluster, else a local instance) and
    `advertise_host` (what the actors dial; default ``config.host``, or this node's address when that
    is a wildcard) to Ray. An option the chosen backend does not take is a ValueError."""
    chosen = emulation_backend(fleet.emulation.mode, backend)
    return await chosen.run(fleet, config, specs=specs, on_event=on_event, data_root=data_root,
                            stderr_dir=stderr_dir, rss_guard=rss_guard, workers=workers, data_limit=data_limit,
                            address=address, advertise_host=advertise_host)


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
        return store.rounds.completed()
