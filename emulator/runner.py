"""Run a fleet with the emulation backend its mode and the caller's ``backend`` name.

The backends are one table, :data:`emulator.backends.EMULATION_BACKENDS`, of classes
implementing :class:`~emulator.backend.EmulationBackend`: capped processes (``processes``), many
devices per worker process (``lightweight``), the same workers as Ray actors (``ray``, Ray imported
only then). Each takes the same fleet and orchestrator settings (:mod:`emulator.schedule`) and gives
the same :class:`~emulator.recorder.EmulationRun`.

A run interrupted part-way continues in its own store (``ServerConfig.resume``; ``edgetrain emulate
--resume RUN_DIR``): the orchestrator restarts from the checkpoint of the last completed round
(:func:`completed_rounds`) and runs the rounds after it, with fresh device processes or workers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from emulator.backends import emulation_backend, where_choices
from emulator.fleet import Fleet
from emulator.recorder import EmulationRun
from orchestrator.config import ServerConfig

__all__ = ["BACKENDS", "completed_rounds", "run_emulation"]

#: Where a fleet's devices may run (``edgetrain emulate --backend``): the backend table's "where" column.
BACKENDS = where_choices()


async def run_emulation(fleet: Fleet, config: ServerConfig, *, backend: str = "local", **options: Any) -> EmulationRun:
    """Run `fleet` with the backend of its ``emulation.mode`` at `backend` ("local", "ray", ...).

    `options` are the common ones (``specs``, ``drops``, ``on_event``, ``data_root``,
    ``stderr_dir``) and the chosen backend's own (:attr:`EmulationBackend.options
    <emulator.backend.EmulationBackend.options>`: ``rss_guard`` and ``data_limit`` for capped
    processes, ``workers`` for the lightweight workers, ``address`` and ``advertise_host`` for Ray);
    one given (not None) that the chosen backend does not take is a ValueError."""
    chosen = emulation_backend(fleet.emulation.mode, backend)
    return await chosen(fleet, config, **chosen.check(options)).run()


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
