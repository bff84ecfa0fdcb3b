"""What an emulated run learns about its devices, recorded the same way whichever mode ran them.

Every emulation backend (one capped process per device, :mod:`~emulator.supervisor`; many
devices per worker process, :mod:`~emulator.lightweight`, locally or as Ray actors) feeds one
:class:`Recorder`: the
orchestrator's events (registrations, round starts and ends with their stragglers), each device's
own events (its plan, its time per phase and peak in every round) and the start and end of every
life of a device (a process, or a client in a worker). The result is an :class:`EmulationRun`,
written as JSON by ``edgetrain emulate`` (:meth:`EmulationRun.to_dict`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["PHASES", "DeviceLife", "DeviceResult", "EmulationRun", "Recorder", "json_events"]

#: Time per phase of a round, as the device reports it in its ``round_done`` event.
PHASES = ("download_s", "forward_s", "train_s", "upload_s")

#: What a ``round_done`` event contributes to a device's per-round record.
_ROUND_KEYS = ("round", *PHASES, "peak_rss_bytes", "accepted", "role")


@dataclass
class DeviceLife:
    """One life of a device (an OS process, or a client in a worker): how it ended and what it held."""

    returncode: int | None
    ended: str  # "finished" | "dropped" | "oom-killed" | "timed-out" | "failed" | "stopped"
    oom_killed: bool
    timed_out: bool
    peak_bytes: int | None  # the cap mechanism's measure: cgroup max usage, or peak RSS
    peak_rss_bytes: int | None  # the resident high-water mark the RSS guard saw
    wall_s: float
    round: int | None  # the orchestrator's round in progress when the life ended
    killed_by: str | None = None  # "kernel" | "rlimit-as" | "watchdog" | "rss-guard" | "timeout" | "emulator"


@dataclass
class DeviceResult:
    """Everything the emulator learned about one device."""

    device: str
    group: str
    device_class: str
    budget_bytes: int
    mechanism: str  # how its memory cap was enforced
    cpu_mechanism: str  # how its CPU share was applied ("none": not applied)
    cpu_share: float | None
    role: str = "unregistered"
    split: int = -1
    expect_role: str | None = None
    force_split: int | None = None
    drop_rounds: tuple[int, ...] = ()
    lives: list[DeviceLife] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)  # one per round_done: round, phases, peak_rss_bytes
    failed_rounds: list[int] = field(default_factory=list)  # rounds it was selected for but did not report
    events: list[dict] = field(default_factory=list)
    worker: int | None = None  # lightweight mode: the index of the worker process it ran in

    @property
    def peak_bytes(self) -> int | None:
        """The most memory any of its lives held, as its cap mechanism measured it."""
        peaks = [life.peak_bytes for life in self.lives if life.peak_bytes is not None]
        return max(peaks) if peaks else None

    @property
    def peak_rss_bytes(self) -> int | None:
        """The device's peak resident set over its lives (the guard's samples and its own reports)."""
        peaks = [life.peak_rss_bytes for life in self.lives if life.peak_rss_bytes is not None]
        peaks += [int(r["peak_rss_bytes"]) for r in self.rounds if r.get("peak_rss_bytes")]
        return max(peaks) if peaks else None

    @property
    def oom_killed(self) -> bool:
        return any(life.oom_killed for life in self.lives)

    @property
    def status(self) -> str:
        """How the device's last life ended ("finished" when it saw training through)."""
        return self.lives[-1].ended if self.lives else "not started"

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("events")
        d.update(peak_bytes=self.peak_bytes, peak_rss_bytes=self.peak_rss_bytes, oom_killed=self.oom_killed,
                 status=self.status, rounds_reported=len(self.rounds),
                 within_budget=not self.oom_killed and self.peak_bytes is not None
                 and self.peak_bytes <= self.budget_bytes
                 and (self.peak_rss_bytes or 0) <= self.budget_bytes)
        if self.worker is not None:  # lightweight mode: uncapped and unmeasured, so neither within nor over
            d["within_budget"] = None
        return d


@dataclass
class EmulationRun:
    """What an emulated run produced: per-round metrics of the orchestrator and per-device results."""

    history: list[dict]
    devices: list[DeviceResult]
    mode: str = "processes"  # the fleet's emulation mode that ran: "processes" | "lightweight"
    workers: list[dict] = field(default_factory=list)  # shared worker processes: one WorkerStats dict each

    def device(self, device_id: str) -> DeviceResult:
        for d in self.devices:
            if d.device == device_id:
                return d
        raise KeyError(device_id)

    def to_dict(self) -> dict[str, Any]:
        """The run as JSON-ready data: mode, rounds, devices (and worker processes when it had some)."""
        out: dict[str, Any] = {"mode": self.mode}
        if self.workers:  # devices that shared worker processes
            out.update(workers=len(self.workers), worker_processes=self.workers)
        out.update(rounds=self.history, devices=[d.to_dict() for d in self.devices])
        return out


class Recorder:
    """Collects one run's events into :class:`DeviceResult` records, and passes every event on to
    ``emit`` (the progress view): orchestrator events as they are, device events as
    ``device:<kind>``, lives as ``emulator:started`` / ``emulator:exit``."""

    def __init__(self, emit: Callable[[str, dict], None] | None = None) -> None:
        self.emit = emit or (lambda kind, data: None)
        self.results: dict[str, DeviceResult] = {}
        self.current_round: int | None = None
        self.registered: set[str] = set()  # devices whose current life has said hello

    def add(self, result: DeviceResult) -> DeviceResult:
        """Start recording a device (once: a device keeps its record over its lives)."""
        return self.results.setdefault(result.device, result)

    # -- the orchestrator ------------------------------------------------------------------------
    def on_server_event(self, kind: str, data: dict) -> None:
        if kind == "registered":
            self.registered.add(str(data["device"]))
        elif kind == "round_start":
            self.current_round = int(data["round"])
        elif kind == "round_end":
            self.current_round = None
            for d in data.get("stragglers", []):
                if d in self.results:
                    self.results[d].failed_rounds.append(int(data["round"]))
        self.emit(kind, data)

    # -- lives -------------------------------------------------------------------------------------
    def life_started(self, device_id: str, **info: Any) -> None:
        """A new life of a device began (``info``: pid, mechanism, worker ...)."""
        self.registered.discard(device_id)
        res = self.results[device_id]
        self.emit("emulator:started", {"device": device_id, **info, "budget_bytes": res.budget_bytes,
                                       "life": len(res.lives) + 1})

    def life_ended(self, device_id: str, life: DeviceLife, **info: Any) -> None:
        """A life of a device ended; ``info`` (worker, error ...) goes with the event only."""
        self.results[device_id].lives.append(life)
        self.emit("emulator:exit", {"device": device_id, **info, **asdict(life)})

    # -- the device --------------------------------------------------------------------------------
    def on_device_event(self, device_id: str, event: dict, *, own_peak: bool = True) -> None:
        """One of the device's own events. ``own_peak``: its ``peak_rss_bytes`` are the device's own
        (false in a worker process, where they are the whole worker's)."""
        res = self.results[device_id]
        res.events.append(event)
        kind = str(event.get("event"))
        if kind == "welcome":
            res.role, res.split = str(event.get("role")), int(event.get("split", -1))
        elif kind == "round_done":
            record = {k: event.get(k) for k in _ROUND_KEYS}
            if not own_peak:
                record["peak_rss_bytes"] = None
            res.rounds.append(record)
        self.emit("device:" + kind, event)

    def run(self, history: list[dict], order: list[str], *, mode: str = "processes",
            workers: list[dict] | None = None) -> EmulationRun:
        """The run's result, devices in ``order`` (those that were never started are left out)."""
        return EmulationRun(history, [self.results[d] for d in order if d in self.results], mode=mode,
                            workers=list(workers or []))


async def json_events(reader: asyncio.StreamReader) -> AsyncIterator[dict]:
    """The JSON objects a device or worker prints, one per line, until its output closes; other
    lines (a stray print, a traceback's lines) are skipped."""
    async for raw in reader:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            yield event
