"""The process mode of the emulator: one capped OS process per device of a fleet, supervised.

Every device runs as its own process (``python -m emulator.device``, the production
client with its faults wrapped around its connection) under a hard memory cap equal to its class's
budget (:mod:`emulator.capping`: a cgroup where one is writable, else ``RLIMIT_AS``
plus an RSS watchdog) and a CPU share from its class's speed factor. A device that exceeds its cap
is killed by the kernel; the orchestrator sees a vanished device and closes the round without it,
so a kill is a failure of that round, never a hang. A device that the fleet's ``dropout`` makes
vanish mid-round is started again after ``rejoin_after_s`` and rejoins.

A budget is the device's whole memory for the app, shared libraries included (the planner counts the
runtime's RSS, docs/measurements.md). A cgroup does not charge library pages that another cgroup touched first, so
on a shared machine the same device is charged more or less depending on who loaded torch before it.
The supervisor therefore also guards the resident set (``rss_guard``): it polls each device's RSS and
kills a device over its budget, so every mechanism holds a device to the quantity the budget means.
The report says which enforced the kill (``killed_by``: "kernel", "watchdog", "rss-guard", "timeout").

:class:`ProcessBackend` is this mode's row of the backend table (:mod:`emulator.backends`):
:class:`DeviceSupervisor` starts, watches and restarts the processes, and what the devices did is
recorded by :class:`~emulator.recorder.Recorder`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edge_sdk.memory import process_memory
from emulator.backend import BackendOption, EmulationBackend
from emulator.capping import MEMORY_EXIT_CODE, CappedProcess, CapResult
from emulator.credentials import needs_credentials, with_secrets
from emulator.faults import DROP_EXIT
from emulator.fleet import DeviceSpec, Fleet
from emulator.launch import DeviceLaunch, device_argv
from emulator.recorder import DeviceLife, DeviceResult, EmulationRun, Recorder, json_events
from emulator.schedule import device_launch
from orchestrator.config import ServerConfig

__all__ = ["DeviceSupervisor", "ProcessBackend", "RssGuard", "run_fleet"]


def _ending(result: CapResult) -> str:
    if result.oom_killed:
        return "oom-killed"
    if result.timed_out:
        return "timed-out"
    if result.returncode == 0:
        return "finished"
    if result.returncode == DROP_EXIT:
        return "dropped"
    return "failed"


class RssGuard:
    """Polls a device's resident set; kills it over budget (when enforcing) and keeps its high-water mark."""

    interval_s = 0.010

    def __init__(self, proc: CappedProcess, budget_bytes: int, *, enforce: bool) -> None:
        self.proc, self.budget, self.enforce = proc, budget_bytes, enforce
        self.peak = 0
        self.killed = False

    async def run(self) -> None:
        while self.proc.poll() is None:
            try:
                seen = process_memory(self.proc.pid)
            except (ProcessLookupError, PermissionError):
                rss = 0
            else:
                rss, self.peak = seen.rss_bytes, max(self.peak, seen.peak_rss_bytes)
            if self.enforce and rss > self.budget and self.proc.poll() is None:
                self.killed = True
                self.proc.kill()
                return
            await asyncio.sleep(self.interval_s)


class DeviceSupervisor:
    """Starts each device's process under its cap, watches it, and restarts it after a planned
    vanish; lives inside :func:`run_fleet`'s event loop."""

    def __init__(self, specs: list[DeviceSpec], launches: dict[str, DeviceLaunch], recorder: Recorder, *,
                 mechanism: str, timeout_s: float, rss_guard: bool, data_root: str | None,
                 stderr_dir: Path | None, env: Mapping[str, str], launch_dir: Path | None = None) -> None:
        self.specs, self.launches, self.recorder = {s.id: s for s in specs}, launches, recorder
        self.mechanism, self.timeout_s, self.data_root, self.stderr_dir = mechanism, timeout_s, data_root, stderr_dir
        self.rss_guard = rss_guard
        self.launch_dir = launch_dir  # where a launch holding a secret goes through (device_argv)
        self.env = dict(env)  # every device's environment
        self.procs: dict[str, CappedProcess] = {}
        self.tasks: set[asyncio.Task] = set()
        self.finished = False
        self.url = ""

    def start(self, device_id: str) -> None:
        """Start one process of a device under its cap, with a task that pumps its events and awaits it."""
        spec, launch = self.specs[device_id], self.launches[device_id]
        read_fd, write_fd = os.pipe()
        err: int | object = asyncio.subprocess.DEVNULL
        log = None
        if self.stderr_dir is not None:
            log = open(self.stderr_dir / f"{device_id}.log", "ab")
            err = log
        try:
            proc = CappedProcess.start(
                device_argv(launch, self.url, data_root=self.data_root, launch_dir=self.launch_dir), spec.budget_bytes, mechanism=self.mechanism,
                timeout_s=self.timeout_s, env=self.env, stdout=write_fd, stderr=err, cpu_share=spec.cpu_share,
            )
        finally:
            os.close(write_fd)
            if log is not None:
                log.close()
        self.procs[device_id] = proc
        self.recorder.add(DeviceResult(
            device=device_id, group=spec.group, device_class=spec.device_class, budget_bytes=spec.budget_bytes,
            mechanism=proc.mechanism, cpu_mechanism="none", cpu_share=None, expect_role=spec.expect_role,
            force_split=spec.force_split, drop_rounds=launch.faults.drop_rounds,
        ))
        self.recorder.life_started(device_id, pid=proc.pid, mechanism=proc.mechanism)
        task = asyncio.create_task(self._watch(device_id, proc, read_fd))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _watch(self, device_id: str, proc: CappedProcess, read_fd: int) -> None:
        res = self.recorder.results[device_id]
        pump = asyncio.create_task(self._pump(device_id, read_fd))
        guard = RssGuard(proc, res.budget_bytes, enforce=self.rss_guard)
        guard_task = asyncio.create_task(guard.run())
        result = await proc.wait_async()
        guard_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await guard_task
        with contextlib.suppress(asyncio.TimeoutError, Exception):
            await asyncio.wait_for(pump, timeout=5)
        res.cpu_mechanism, res.cpu_share = result.cpu_mechanism, result.cpu_share
        ended, killed_by = _ending(result), None
        if result.oom_killed:
            if result.mechanism.startswith("cgroup"):
                killed_by = "kernel"
            else:  # a failed allocation under RLIMIT_AS exits with MEMORY_EXIT_CODE; the watchdog SIGKILLs
                killed_by = "rlimit-as" if result.returncode == MEMORY_EXIT_CODE else "watchdog"
        elif result.timed_out:
            killed_by = "timeout"
        elif guard.killed:
            ended, killed_by = "oom-killed", "rss-guard"
        elif self.finished and ended == "failed" and result.returncode is not None and result.returncode < 0:
            ended, killed_by = "stopped", "emulator"  # still running after the last round
        life = DeviceLife(result.returncode, ended, ended == "oom-killed", result.timed_out, result.peak_bytes,
                          guard.peak or None, round(result.wall_s, 3), self.recorder.current_round, killed_by)
        self.recorder.life_ended(device_id, life)
        rejoin = self.specs[device_id].behaviour.rejoin_after_s
        if life.ended == "dropped" and rejoin is not None and not self.finished:
            await asyncio.sleep(rejoin)
            if not self.finished:
                self.start(device_id)

    async def _pump(self, device_id: str, read_fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", buffering=0))
        try:
            async for event in json_events(reader):
                self.recorder.on_device_event(device_id, event)
        finally:
            transport.close()

    async def stop(self, grace_s: float = 10.0) -> None:
        """After the last round: let devices leave on their own, then kill what is left."""
        self.finished = True
        for device_id, proc in list(self.procs.items()):
            if device_id not in self.recorder.registered:
                proc.kill()  # restarted too late to join: nobody will say goodbye to it
        for proc in list(self.procs.values()):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait_async(), timeout=grace_s)
            if proc.poll() is None:
                proc.kill()
        pending = [t for t in self.tasks if not t.done()]
        for t in pending:
            t.cancel()  # a restart still sleeping out its rejoin delay
        for t in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        # Processes started by a restart that raced the end of the run.
        for proc in list(self.procs.values()):
            if proc.poll() is None:
                proc.kill()
                await proc.wait_async()


class ProcessBackend(EmulationBackend):
    """The process mode: every device its own OS process under its class's memory cap.

    Devices read the training split from one memory-mapped copy written before they start
    (:func:`emulator.localfleet.prepare_device_data`), cut to its first `data_limit` samples if
    given (CIFAR-10: a class-balanced subset). `mechanism` and `timeout_s` default to the fleet's
    ``[emulation]`` section; `rss_guard` also kills a device whose resident set passes its budget
    (see the module docstring); `backends` (device id -> torch, onnxruntime or auto) sets devices'
    training backends (default: auto). Devices that vanish on purpose are started again after their
    ``rejoin_after_s``; devices killed for memory or time are not (the report says which, and in
    which round)."""

    name = mode = "processes"
    summary = "one OS process per device under its memory cap"
    options = (
        BackendOption("rss_guard", bool, "also kill a device whose resident set passes its budget (default: on)",
                      absent="no memory caps to guard"),
        BackendOption("data_limit", int, "only the dataset's first N training samples", cli=False),
        BackendOption("mechanism", str, "the memory cap (default: the fleet's emulation.memory_cap)", cli=False),
        BackendOption("timeout_s", float, "seconds after which a device process is killed", cli=False),
        BackendOption("backends", dict, "device id -> its training backend", cli=False),
    )

    def __init__(self, fleet: Fleet, config: ServerConfig, *, rss_guard: bool = True, data_limit: int | None = None,
                 mechanism: str | None = None, timeout_s: float | None = None,
                 backends: Mapping[str, str] | None = None, **common: Any) -> None:
        super().__init__(fleet, config, **common)
        self.rss_guard, self.data_limit = rss_guard, data_limit
        self.mechanism = mechanism or fleet.emulation.memory_cap
        self.timeout_s = timeout_s or fleet.emulation.timeout_s
        self.backends = dict(backends or {})
        self.supervisor: DeviceSupervisor | None = None
        self.secrets_dir: tempfile.TemporaryDirectory | None = None
        self.payload_files: tempfile.TemporaryDirectory | None = None  # the devices' payloads (device_env)

    @classmethod
    def describe(cls, fleet: Fleet, config: ServerConfig, options: Mapping[str, Any]) -> str:
        return f"mode {cls.mode}: memory cap {fleet.emulation.memory_cap}"

    async def prepare(self) -> None:
        """Each device's launch (its credential enrolled where the server requires one) and the
        data its process will map."""
        from emulator.localfleet import device_env, prepare_device_data  # loads torch

        fleet, config = self.fleet, self.config
        launches = {s.id: device_launch(fleet, s, self.schedule.get(s.id, ()), data_limit=self.data_limit)
                    for s in self.specs}
        for device_id, backend in self.backends.items():
            launches[device_id] = dataclasses.replace(launches[device_id], backend=backend)
        launches = with_secrets(config, launches)
        if self.stderr_dir is not None:
            self.stderr_dir.mkdir(parents=True, exist_ok=True)
        elif needs_credentials(config):
            self.secrets_dir = tempfile.TemporaryDirectory(prefix="edgetrain-launches-")
        self.payload_files = tempfile.TemporaryDirectory(prefix="edgetrain-payloads-")
        self.supervisor = DeviceSupervisor(
            self.specs, launches, self.recorder, mechanism=self.mechanism, timeout_s=self.timeout_s,
            rss_guard=self.rss_guard, data_root=self.data_root, stderr_dir=self.stderr_dir,
            env=device_env(self.payload_files.name),
            launch_dir=Path(self.secrets_dir.name) if self.secrets_dir else self.stderr_dir)
        prepare_device_data(list(launches.values()), self.data_root)

    async def start(self, url: str) -> None:
        assert self.supervisor is not None
        self.supervisor.url = url
        for s in self.specs:
            self.supervisor.start(s.id)

    async def cancel(self) -> None:
        if self.supervisor is not None:
            await self.supervisor.stop()
        for files in (self.secrets_dir, self.payload_files):
            if files is not None:
                files.cleanup()

    def result(self, history: list[dict]) -> EmulationRun:
        return self.recorder.run(history, [s.id for s in self.specs])


async def run_fleet(fleet: Fleet, config: ServerConfig, **options: Any) -> EmulationRun:
    """Run every device of `fleet` as a capped process against an orchestrator in this process
    until the last round (:class:`ProcessBackend`, its options and the common ones)."""
    return await ProcessBackend(fleet, config, **ProcessBackend.check(options)).run()
