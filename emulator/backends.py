"""The emulation backends, one table: how ``edgetrain emulate`` runs a fleet's devices.

A backend runs every device of a fleet against an orchestrator in the emulator's process and gives
the same :class:`~emulator.recorder.EmulationRun`; they differ in where a device lives:

======================  ===========  =========  ==========================================================
backend                 fleet mode   where      a device is
======================  ===========  =========  ==========================================================
``processes``           processes    local      its own OS process under its class's hard memory cap
                                                (cgroup, or RLIMIT_AS plus an RSS watchdog; ``memory_cap =
                                                "none"`` in the fleet file: uncapped processes)
``lightweight``         lightweight  local      one of many uncapped devices in a worker process
``ray``                 lightweight  ray        the same workers, each a Ray actor (a local instance or a
                                                cluster; ``pip install 'edgetrain[ray]'``)
======================  ===========  =========  ==========================================================

The fleet file's ``emulation.mode`` and ``edgetrain emulate --backend`` (the "where" column) pick
one row (:func:`emulation_backend`). Each row names its run function as ``package.module:function``,
imported when a run starts (so Ray is imported only by a Ray run), and the options it takes beyond
the common ones; an option given to a backend that does not take it is refused before anything
starts. A new backend is one module with a run function of this shape and one row here (or
:func:`register_emulation_backend` from a plugin)::

    async def run(fleet, config, *, specs, on_event, data_root, stderr_dir, **its_options) -> EmulationRun
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edge_sdk.references import load_reference

# The fleet file's reader asks this table for the modes, so this module sits below the fleet, the
# config and the recorder and names their types (Fleet, ServerConfig, EmulationRun) in docs only.

__all__ = ["COMMON_OPTIONS", "EMULATION_BACKENDS", "EmulationBackend", "emulation_backend", "emulation_modes",
           "register_emulation_backend", "where_choices"]

#: The options every backend's run function takes.
COMMON_OPTIONS = frozenset({"specs", "on_event", "data_root", "stderr_dir"})


@dataclass(frozen=True)
class EmulationBackend:
    """One row of :data:`EMULATION_BACKENDS`."""

    name: str
    mode: str  # the fleet's ``emulation.mode`` it runs
    where: str  # ``edgetrain emulate --backend``: where the devices run
    runner: str  # ``package.module:function``, imported when a run starts
    options: frozenset[str]  # what it takes beyond COMMON_OPTIONS
    summary: str

    def check(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options for this backend's run function: the given (not None) ones, each one it takes;
        ValueError naming any it does not."""
        given = {k: v for k, v in options.items() if v is not None}
        foreign = sorted(set(given) - COMMON_OPTIONS - self.options)
        if foreign:
            raise ValueError(f"{', '.join(foreign)} do(es) not apply to the {self.name} emulation backend "
                             f"({self.summary}); it takes {', '.join(sorted(self.options)) or 'no other options'}")
        return given

    def run(self, fleet: Any, config: Any, **options: Any) -> Awaitable[Any]:
        """Run `fleet` (a Fleet) under `config` (a ServerConfig): the run function's coroutine, whose
        result is an EmulationRun."""
        given = self.check(options)
        runner: Callable[..., Awaitable[Any]] = load_reference(self.runner, "emulation backend")  # type: ignore[assignment]
        return runner(fleet, config, **given)


EMULATION_BACKENDS: dict[str, EmulationBackend] = {b.name: b for b in (
    EmulationBackend("processes", "processes", "local", "emulator.supervisor:run_fleet",
                     frozenset({"rss_guard", "data_limit", "drops", "mechanism", "timeout_s", "backends"}),
                     "one OS process per device under its memory cap"),
    EmulationBackend("lightweight", "lightweight", "local", "emulator.lightweight:run_lightweight",
                     frozenset({"workers", "drops", "threads", "stop_grace_s"}),
                     "many devices per worker process"),
    EmulationBackend("ray", "lightweight", "ray", "emulator.ray_backend:run_ray",
                     frozenset({"workers", "drops", "threads", "stop_grace_s", "address", "advertise_host",
                                "cpus_per_worker", "poll_s", "ray_options"}),
                     "the lightweight workers as Ray actors"),
)}


def register_emulation_backend(backend: EmulationBackend) -> None:
    """Add a row (a plugin's backend); a name or a (mode, where) pair already taken is refused."""
    if backend.name in EMULATION_BACKENDS:
        raise ValueError(f"emulation backend {backend.name!r} is already registered")
    for b in EMULATION_BACKENDS.values():
        if (b.mode, b.where) == (backend.mode, backend.where):
            raise ValueError(f"mode {backend.mode!r} on {backend.where!r} is already the {b.name} backend")
    EMULATION_BACKENDS[backend.name] = backend


def emulation_modes() -> tuple[str, ...]:
    """The values a fleet file's ``emulation.mode`` may take: the modes some backend runs."""
    return tuple(dict.fromkeys(b.mode for b in EMULATION_BACKENDS.values()))


def where_choices() -> tuple[str, ...]:
    """The values of ``edgetrain emulate --backend``, "local" first."""
    return tuple(sorted({b.where for b in EMULATION_BACKENDS.values()}, key=lambda w: (w != "local", w)))


def emulation_backend(mode: str, where: str = "local") -> EmulationBackend:
    """The backend that runs a fleet of ``emulation.mode`` `mode` `where`; ValueError saying what there is."""
    for b in EMULATION_BACKENDS.values():
        if (b.mode, b.where) == (mode, where):
            return b
    if where not in where_choices():
        raise ValueError(f"backend must be one of {', '.join(where_choices())}, got {where!r}")
    there = sorted(b.mode for b in EMULATION_BACKENDS.values() if b.where == where)
    raise ValueError(f"backend {where!r} runs emulation.mode {', '.join(repr(m) for m in there)}, not {mode!r}")
