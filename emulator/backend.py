"""The emulation backend interface: how a fleet's devices run, started, awaited and cancelled.

A backend runs every device of a fleet against an orchestrator in the emulator's process and gives
an :class:`~emulator.recorder.EmulationRun`; backends differ only in where a device lives (its own
capped OS process, a client in a shared worker process, a worker as a Ray actor). Modelled on
Flower's simulation ``Backend`` (build, process, terminate), an :class:`EmulationBackend` owns the
three steps of a fleet's life, and :meth:`EmulationBackend.run` is the one skeleton every backend
shares (the orchestrator started between the first two, raced against the fleet's failure, and
everything cancelled whatever happened):

1. :meth:`~EmulationBackend.prepare` (before the orchestrator listens: workers that load their
   runtimes meanwhile, data written once, credentials enrolled) and :meth:`~EmulationBackend.start`
   (every device dials the orchestrator's URL);
2. :meth:`~EmulationBackend.wait`: until the orchestrator's last round, or until the fleet cannot
   go on (a worker died: :meth:`~EmulationBackend.fail`), which raises :class:`EmulationFailed`;
3. :meth:`~EmulationBackend.cancel`: every device and process stopped, every resource released.

A backend class also declares what the command line needs to know of it without naming it
(``edgetrain emulate`` builds its options and its refusals from these): the fleet ``mode`` it runs
and ``where`` (``--backend``), its options beyond the common ones (:class:`BackendOption`: Ray's
``--address``, the workers' ``--workers``), the modules it ``requires`` (Ray) and how to install
them, how it changes the orchestrator's settings (:meth:`~EmulationBackend.server_settings`), how it
describes a run and what it adds to ``metrics.json``. The table of backends is
:data:`emulator.backends.EMULATION_BACKENDS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from emulator.recorder import Recorder
from emulator.schedule import drop_schedule

if TYPE_CHECKING:
    from emulator.fleet import DeviceSpec, Fleet
    from emulator.recorder import EmulationRun
    from orchestrator.config import ServerConfig

__all__ = ["COMMON_OPTIONS", "BackendOption", "EmulationBackend", "EmulationFailed"]

#: The options every backend takes (its constructor's keywords besides the fleet and the config).
COMMON_OPTIONS = frozenset({"specs", "drops", "on_event", "data_root", "stderr_dir"})


class EmulationFailed(RuntimeError):
    """A run that could not start (a backend's requirement missing, a cluster not reachable) or
    cannot go on (a worker and its devices lost); the message says which, for the person running it."""


@dataclass(frozen=True)
class BackendOption:
    """One option a backend takes beyond :data:`COMMON_OPTIONS`: a keyword of its constructor and,
    unless ``cli`` is False, an ``edgetrain emulate`` option (``--workers``; a ``bool`` is a pair of
    flags, ``--rss-guard/--no-rss-guard``). ``absent`` is said to a user who gives it to a backend
    that does not take it, in place of the backends that do."""

    name: str
    type: type
    help: str
    cli: bool = True
    absent: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def flags(self) -> str:
        """The command line's spelling (both flags of a bool)."""
        return f"{self.flag}/--no-{self.flag[2:]}" if self.type is bool else self.flag


class EmulationBackend(ABC):
    """One way to run a fleet's devices; a subclass is one row of the backend table.

    Constructed with the fleet, the orchestrator's settings, the common options (``specs``: the
    devices to run, default all of the fleet's; ``drops``: device id -> rounds it vanishes in,
    default :func:`~emulator.schedule.drop_schedule`; ``on_event``; ``data_root``; ``stderr_dir``:
    where logs and launch files go) and its own (:attr:`options`). One instance runs once."""

    #: The table's key, and what the run's report calls it.
    name: ClassVar[str]
    #: The fleet file's ``emulation.mode`` this backend runs.
    mode: ClassVar[str]
    #: ``edgetrain emulate --backend``: where the devices run ("local": on this machine).
    where: ClassVar[str] = "local"
    #: In a few words, how a device runs.
    summary: ClassVar[str]
    #: The options it takes beyond :data:`COMMON_OPTIONS`.
    options: ClassVar[tuple[BackendOption, ...]] = ()
    #: Modules it imports when a run starts, and how to install them when they are missing.
    requires: ClassVar[tuple[str, ...]] = ()
    install: ClassVar[str] = ""
    #: Devices share worker processes (many per process, none capped), so a planned vanishing is
    #: counted in the summary rather than said on a line, and the summary is one row per group.
    shared_workers: ClassVar[bool] = False
    #: The run summary's name for its worker processes.
    workers_called: ClassVar[str] = "worker processes"

    def __init__(self, fleet: Fleet, config: ServerConfig, *, specs: list[DeviceSpec] | None = None,
                 drops: Mapping[str, Iterable[int]] | None = None,
                 on_event: Callable[[str, dict], None] | None = None, data_root: str | None = None,
                 stderr_dir: Path | None = None) -> None:
        self.fleet, self.config = fleet, config
        self.specs = fleet.devices() if specs is None else list(specs)
        self.schedule = (drop_schedule(fleet, self.specs, config.rounds) if drops is None
                         else {k: tuple(v) for k, v in drops.items()})
        self.data_root, self.stderr_dir = data_root, stderr_dir
        self.recorder = Recorder(on_event)
        self.failures: list[str] = []
        self._failed: asyncio.Event | None = None

    # -- the table's and the command line's side ----------------------------------------------------
    @classmethod
    def option_names(cls) -> frozenset[str]:
        return frozenset(o.name for o in cls.options)

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options for this backend: the given (not None) ones, each one it takes; ValueError
        naming any it does not."""
        given = {k: v for k, v in options.items() if v is not None}
        foreign = sorted(set(given) - COMMON_OPTIONS - cls.option_names())
        if foreign:
            raise ValueError(f"{', '.join(foreign)} do(es) not apply to the {cls.name} emulation backend "
                             f"({cls.summary}); it takes {', '.join(sorted(cls.option_names())) or 'no other options'}")
        return given

    @classmethod
    def missing(cls) -> str | None:
        """What this machine lacks to run the backend (its required modules), or None."""
        absent = [m for m in cls.requires if importlib.util.find_spec(m) is None]
        if not absent:
            return None
        return f"the {cls.name} emulation backend needs {', '.join(absent)}" + (f": {cls.install}" if cls.install else "")

    @classmethod
    def validate(cls, fleet: Fleet, options: Mapping[str, Any]) -> None:
        """Refuse an option value that cannot work for `fleet`, before anything starts: raise
        :class:`~edge_sdk.values.SettingError` naming its flag."""

    @classmethod
    def server_settings(cls, config: ServerConfig, options: Mapping[str, Any]) -> ServerConfig:
        """The orchestrator's settings for a run on this backend (where it binds, for a cluster)."""
        return config

    @classmethod
    def describe(cls, fleet: Fleet, config: ServerConfig, options: Mapping[str, Any]) -> str:
        """How the devices run, in words, for the line that starts a run."""
        return f"mode {cls.mode}: {cls.summary}"

    @classmethod
    def report(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """What ``metrics.json`` says of the backend."""
        return {"backend": cls.where}

    # -- a run's three steps --------------------------------------------------------------------------
    async def prepare(self) -> None:
        """Before the orchestrator starts (it measures the model and loads its evaluation data
        meanwhile): what the devices need ready. Nothing by default."""

    @abstractmethod
    async def start(self, url: str) -> None:
        """Start every device against the orchestrator at `url`."""

    async def wait(self, server: asyncio.Task[list[dict]]) -> list[dict]:
        """Until the orchestrator's last round (its per-round metrics); :class:`EmulationFailed`
        when the fleet fails first (:meth:`fail`)."""
        failed = asyncio.create_task(self._failure_event().wait())
        try:
            await asyncio.wait({server, failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
        if not server.done():
            raise self.failure()
        return server.result()

    @abstractmethod
    async def cancel(self) -> None:
        """Stop every device and process of the run and release what it held; called once, after
        the last round or on the way out of a failure (what never started is skipped)."""

    @abstractmethod
    def result(self, history: list[dict]) -> EmulationRun:
        """The run's result, from the orchestrator's per-round metrics and what was recorded."""

    # -- shared by every backend -----------------------------------------------------------------------
    def on_server_event(self, kind: str, data: dict) -> None:
        """The orchestrator's events, as the run records them."""
        self.recorder.on_server_event(kind, data)

    def url(self, port: int) -> str:
        """The orchestrator's address as the devices dial it."""
        return f"ws://{self.config.host}:{port}"

    def fail(self, message: str) -> None:
        """The fleet cannot go on (`message` says why): :meth:`wait` raises :meth:`failure`."""
        self.failures.append(message)
        self._failure_event().set()

    def failure(self) -> EmulationFailed:
        return EmulationFailed(f"{self.fleet.name}: the run stops: {'; '.join(self.failures)}")

    def _failure_event(self) -> asyncio.Event:
        if self._failed is None:
            self._failed = asyncio.Event()
        return self._failed

    async def run(self) -> EmulationRun:
        """Run the fleet: prepare, start the orchestrator, start the devices, wait for the last
        round, cancel everything (on success and on failure alike)."""
        from emulator.localfleet import start_orchestrator  # loads torch and the server: only when a run starts

        problem = self.missing()
        if problem is not None:
            raise EmulationFailed(problem)
        if not self.specs:
            raise ValueError(f"{self.fleet.name}: no devices to emulate")
        server: asyncio.Task[list[dict]] | None = None
        try:
            await self.prepare()
            orch, server = await start_orchestrator(self.config, self.on_server_event)
            await self.start(self.url(orch.port))
            history = await self.wait(server)
        finally:
            if server is not None and not server.done():
                server.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await server
            await self.cancel()
        return self.result(history)
