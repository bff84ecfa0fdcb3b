"""The emulation backends, one table: how ``edgetrain emulate`` runs a fleet's devices.

Each entry is a class implementing :class:`~emulator.backend.EmulationBackend` (start, wait and
cancel a fleet's devices); they differ in where a device lives:

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
one row (:func:`emulation_backend`). Each class declares the options it takes beyond the common ones
(``edgetrain emulate`` offers those with a flag, and refuses one given to a backend that does not
take it before anything starts) and the modules it needs (Ray is imported only by a Ray run). A new
backend is one module with an :class:`~emulator.backend.EmulationBackend` subclass and one row here,
or :func:`register_emulation_backend` from a plugin.
"""

from __future__ import annotations

from emulator.backend import COMMON_OPTIONS, BackendOption, EmulationBackend, EmulationFailed
from emulator.lightweight import LightweightBackend
from emulator.ray_backend import RayBackend
from emulator.supervisor import ProcessBackend

__all__ = ["COMMON_OPTIONS", "EMULATION_BACKENDS", "BackendOption", "EmulationBackend", "EmulationFailed",
           "backend_options", "emulation_backend", "emulation_modes", "register_emulation_backend", "takers",
           "where_choices"]

EMULATION_BACKENDS: dict[str, type[EmulationBackend]] = {b.name: b for b in (
    ProcessBackend, LightweightBackend, RayBackend)}


def register_emulation_backend(backend: type[EmulationBackend]) -> None:
    """Add a row (a plugin's backend class); a name or a (mode, where) pair already taken is refused."""
    if not (isinstance(backend, type) and issubclass(backend, EmulationBackend)):
        raise TypeError(f"an emulation backend is an EmulationBackend subclass, not {backend!r}")
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


def emulation_backend(mode: str, where: str = "local") -> type[EmulationBackend]:
    """The backend that runs a fleet of ``emulation.mode`` `mode` `where`; ValueError saying what there is."""
    for b in EMULATION_BACKENDS.values():
        if (b.mode, b.where) == (mode, where):
            return b
    if where not in where_choices():
        raise ValueError(f"backend must be one of {', '.join(where_choices())}, got {where!r}")
    if mode not in emulation_modes():
        raise ValueError(f"unknown emulation.mode {mode!r}; known: {', '.join(emulation_modes())}")
    there = sorted(b.mode for b in EMULATION_BACKENDS.values() if b.where == where)
    raise ValueError(f"backend {where!r} runs emulation.mode {', '.join(repr(m) for m in there)}, not {mode!r}")


def backend_options(*, cli: bool = True) -> dict[str, BackendOption]:
    """Every backend's options by name (those with a command-line flag, unless `cli` is False); two
    backends that take an option of one name declare it alike."""
    out: dict[str, BackendOption] = {}
    for b in EMULATION_BACKENDS.values():
        for option in b.options:
            if cli and not option.cli:
                continue
            known = out.setdefault(option.name, option)
            if (known.type, known.cli) != (option.type, option.cli):
                raise ValueError(f"emulation backend {b.name!r} declares option {option.name!r} unlike another backend")
    return out


def takers(name: str) -> str:
    """The runs that take option `name`, in the words a user chooses them by: a fleet's
    ``emulation.mode 'lightweight'`` for a local backend, ``--backend ray`` for another."""
    found = [f"emulation.mode {b.mode!r}" if b.where == "local" else f"--backend {b.where}"
             for b in EMULATION_BACKENDS.values() if name in b.option_names()]
    return " or ".join(dict.fromkeys(found))
