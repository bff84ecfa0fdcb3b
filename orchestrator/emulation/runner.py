"""The fleet emulator: a local orchestrator and one capped OS process per device of a fleet file.

Every device runs the same ``edgetrain device`` command a real board runs, under a hard memory cap
equal to its class's budget (:mod:`orchestrator.emulation.capping`: a cgroup where one is writable,
else ``RLIMIT_AS`` plus an RSS watchdog) and a CPU share from its class's speed factor. A device
that exceeds its cap is killed by the kernel; the orchestrator sees a vanished device and closes the
round without it, so a kill is a failure of that round, never a hang. A device that the fleet's
``dropout`` makes vanish mid-round is started again after ``rejoin_after_s`` and rejoins.

The result holds, per device, how its cap was enforced, the most memory it held (the cgroup's max
usage, or the peak RSS), how every process life ended, and its time per phase in every round.

A budget is the device's whole memory for the app, shared libraries included (the planner counts the
runtime's RSS, FACTS.md). A cgroup does not charge library pages that another cgroup touched first, so
on a shared machine the same device is charged more or less depending on who loaded torch before it.
The emulator therefore also guards the resident set (``rss_guard``): it polls each device's RSS and
kills a device over its budget, so every mechanism holds a device to the quantity the budget means.
The report says which enforced the kill (``killed_by``: "kernel", "watchdog", "rss-guard", "timeout").

Run as ``python -m orchestrator.emulation.runner device ...`` this module is the device entry point
used under the ``rlimit-as+watchdog`` mechanism: it loads the runtimes first and then caps its own
address space (:func:`~orchestrator.emulation.capping.apply_self_limit`), so that the budget covers
what the device allocates for training, not the libraries' virtual reservations.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import threading
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from orchestrator.config import ServerConfig
from orchestrator.emulation.capping import MECHANISM_ENV, MEMORY_EXIT_CODE, CappedProcess, CapResult
from orchestrator.emulation.fleet import DeviceSpec, Fleet

if TYPE_CHECKING:  # orchestrator.localfleet loads the server (torch): not in device processes
    from orchestrator.localfleet import DeviceLaunch

__all__ = [
    "DeviceLife",
    "DeviceResult",
    "EmulationRun",
    "PHASES",
    "device_launch",
    "drop_schedule",
    "run_emulation",
    "run_fleet",
    "server_config",
]

#: Time per phase of a round, as the device reports it in its ``round_done`` event.
PHASES = ("download_s", "forward_s", "train_s", "upload_s")

#: Exit status of a device that vanished on purpose (``edge_sdk.client.DROP_EXIT``; not imported
#: here so that the emulator does not load the device runtime).
DROP_EXIT = 75


@dataclass
class DeviceLife:
    """One OS process of a device: how it ended and what it held."""

    returncode: int | None
    ended: str  # "finished" | "dropped" | "oom-killed" | "timed-out" | "failed" | "stopped"
    oom_killed: bool
    timed_out: bool
    peak_bytes: int | None  # the cap mechanism's measure: cgroup max usage, or peak RSS
    peak_rss_bytes: int | None  # the resident high-water mark (VmHWM) the RSS guard saw
    wall_s: float
    round: int | None  # the orchestrator's round in progress when the process ended
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
        """The most memory any of its processes held, as its cap mechanism measured it."""
        peaks = [life.peak_bytes for life in self.lives if life.peak_bytes is not None]
        return max(peaks) if peaks else None

    @property
    def peak_rss_bytes(self) -> int | None:
        """The device's peak resident set over its processes (the guard's samples and its own reports)."""
        peaks = [life.peak_rss_bytes for life in self.lives if life.peak_rss_bytes is not None]
        peaks += [int(r["peak_rss_bytes"]) for r in self.rounds if r.get("peak_rss_bytes")]
        return max(peaks) if peaks else None

    @property
    def oom_killed(self) -> bool:
        return any(life.oom_killed for life in self.lives)

    @property
    def status(self) -> str:
        """How the device's last process ended ("finished" when it saw training through)."""
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
    workers: list[dict] = field(default_factory=list)  # lightweight mode: one WorkerStats dict per process

    def device(self, device_id: str) -> DeviceResult:
        for d in self.devices:
            if d.device == device_id:
                return d
        raise KeyError(device_id)


def drop_schedule(fleet: Fleet, devices: Iterable[DeviceSpec], rounds: int) -> dict[str, tuple[int, ...]]:
    """The rounds in which each device vanishes mid-round: each round with probability ``dropout``.

    Decided by the emulator (seeded by the fleet seed and the device id), so a run is reproducible and
    a restarted device keeps the same schedule."""
    out: dict[str, tuple[int, ...]] = {}
    for d in devices:
        p = d.behaviour.dropout
        if p <= 0:
            out[d.id] = ()
            continue
        u = np.random.default_rng([fleet.seed, zlib.crc32(d.id.encode())]).random(rounds)
        out[d.id] = tuple(int(r) + 1 for r in np.flatnonzero(u < p))
    return out


def server_config(fleet: Fleet, *, rounds: int | None = None, store_dir: Path, data_root: str | None = None,
                  deadline_s: float = 120.0) -> ServerConfig:
    """The orchestrator's settings for a fleet: its training section, waiting for every device first."""
    t = fleet.training
    return ServerConfig(
        model=fleet.model, strategy=t.strategy, rounds=rounds or t.rounds, fraction=t.fraction,
        min_devices=fleet.num_devices, local_steps=t.local_steps, batch_size=t.batch_size, lr=t.lr,
        momentum=t.momentum, weight_decay=t.weight_decay, seed=fleet.seed, eval_data=fleet.dataset,
        data_root=data_root, store_dir=store_dir, deadline_s=deadline_s, planner_batch=t.batch_size, port=0,
    )


def device_launch(fleet: Fleet, spec: DeviceSpec, drop_rounds: Iterable[int] = ()) -> DeviceLaunch:
    """How to start one device of the fleet: its budget, class, data shard and misbehaviour."""
    from orchestrator.localfleet import DeviceLaunch

    part = fleet.partition
    scheme = f"dirichlet:{part.alpha}" if part.scheme == "dirichlet" else part.scheme
    extra: list[str] = []
    if spec.force_split is not None:
        extra += ["--force-split", str(spec.force_split)]
    drops = sorted(set(drop_rounds))
    if drops:
        extra += ["--drop-rounds", ",".join(map(str, drops))]
    b = spec.behaviour
    if b.latency_ms or b.jitter_ms:
        # One fixed delay per device: its latency plus a seeded share of the jitter.
        jitter = np.random.default_rng([spec.seed, 1]).random() * b.jitter_ms
        extra += ["--delay", f"{(b.latency_ms + jitter) / 1000:.4f}"]
    return DeviceLaunch(
        device_id=spec.id, budget_bytes=spec.budget_bytes, client=spec.index, num_clients=fleet.num_devices,
        data=fleet.dataset, partition=scheme, device_class=spec.device_class, seed=part.seed,
        extra_args=tuple(extra),
    )


def _capped_argv(launch: DeviceLaunch, url: str, data_root: str | None) -> list[str]:
    """The device command, entered through this module so the rlimit fallback can cap it after imports."""
    argv = launch.argv(url, data_root)
    assert argv[1:4] == ["-m", "orchestrator.cli", "device"], argv
    return [argv[0], "-m", "orchestrator.emulation.runner", *argv[3:]]


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


class _Emulator:
    """The state of one emulated run; lives inside :func:`run_fleet`'s event loop."""

    def __init__(self, fleet: Fleet, specs: list[DeviceSpec], launches: dict[str, DeviceLaunch],
                 emit: Callable[[str, dict], None], *, mechanism: str, timeout_s: float, rss_guard: bool,
                 data_root: str | None, stderr_dir: Path | None) -> None:
        self.fleet, self.specs, self.launches, self.emit = fleet, {s.id: s for s in specs}, launches, emit
        self.mechanism, self.timeout_s, self.data_root, self.stderr_dir = mechanism, timeout_s, data_root, stderr_dir
        self.results: dict[str, DeviceResult] = {}
        self.procs: dict[str, CappedProcess] = {}
        self.tasks: set[asyncio.Task] = set()
        self.current_round: int | None = None
        self.finished = False
        self.url = ""
        self.rss_guard = rss_guard
        self.registered: set[str] = set()  # devices whose current process has said hello
        self.env: dict[str, str] = {}  # added to every device's environment

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

    def start(self, device_id: str) -> None:
        """Start one process of a device under its cap, with a task that pumps its events and awaits it."""
        from orchestrator.localfleet import device_env

        spec, launch = self.specs[device_id], self.launches[device_id]
        read_fd, write_fd = os.pipe()
        err: int | object = asyncio.subprocess.DEVNULL
        log = None
        if self.stderr_dir is not None:
            log = open(self.stderr_dir / f"{device_id}.log", "ab")
            err = log
        try:
            proc = CappedProcess.start(
                _capped_argv(launch, self.url, self.data_root), spec.budget_bytes, mechanism=self.mechanism,
                timeout_s=self.timeout_s, env={**device_env(), **self.env}, stdout=write_fd, stderr=err, cpu_share=spec.cpu_share,
            )
        finally:
            os.close(write_fd)
            if log is not None:
                log.close()
        self.procs[device_id] = proc
        self.registered.discard(device_id)
        res = self.results.get(device_id)
        if res is None:
            res = DeviceResult(
                device=device_id, group=spec.group, device_class=spec.device_class, budget_bytes=spec.budget_bytes,
                mechanism=proc.mechanism, cpu_mechanism="none", cpu_share=None, expect_role=spec.expect_role,
                force_split=spec.force_split, drop_rounds=_drop_rounds(launch),
            )
            self.results[device_id] = res
        self.emit("emulator:started", {"device": device_id, "pid": proc.pid, "mechanism": proc.mechanism,
                                       "budget_bytes": spec.budget_bytes, "life": len(res.lives) + 1})
        task = asyncio.create_task(self._watch(device_id, proc, read_fd))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _watch(self, device_id: str, proc: CappedProcess, read_fd: int) -> None:
        res = self.results[device_id]
        pump = asyncio.create_task(self._pump(device_id, read_fd))
        guard = _RssGuard(proc, res.budget_bytes, enforce=self.rss_guard)
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
                          guard.peak or None, round(result.wall_s, 3), self.current_round, killed_by)
        res.lives.append(life)
        self.emit("emulator:exit", {"device": device_id, **asdict(life)})
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
        res = self.results[device_id]
        try:
            async for raw in reader:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("{"):
                    continue
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                res.events.append(event)
                kind = event.get("event")
                if kind == "welcome":
                    res.role, res.split = str(event.get("role")), int(event.get("split", -1))
                elif kind == "round_done":
                    res.rounds.append({k: event.get(k) for k in ("round", *PHASES, "peak_rss_bytes", "accepted", "role")})
                self.emit("device:" + str(kind), event)
        finally:
            transport.close()

    async def stop(self, grace_s: float = 10.0) -> None:
        """After the last round: let devices leave on their own, then kill what is left."""
        self.finished = True
        for device_id, proc in list(self.procs.items()):
            if device_id not in self.registered:
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


class _RssGuard:
    """Polls a device's resident set; kills it over budget (when enforcing) and keeps its high-water mark."""

    interval_s = 0.010

    def __init__(self, proc: CappedProcess, budget_bytes: int, *, enforce: bool) -> None:
        self.proc, self.budget, self.enforce = proc, budget_bytes, enforce
        self.peak = 0
        self.killed = False

    async def run(self) -> None:
        while self.proc.poll() is None:
            rss, hwm = _rss_hwm(self.proc.pid)
            self.peak = max(self.peak, hwm)
            if self.enforce and rss > self.budget and self.proc.poll() is None:
                self.killed = True
                self.proc.kill()
                return
            await asyncio.sleep(self.interval_s)


def _rss_hwm(pid: int) -> tuple[int, int]:
    """(RSS, resident high-water mark) in bytes of process `pid`; zeros once it is gone."""
    from edge_sdk.memory import process_memory

    try:
        seen = process_memory(pid)
    except (ProcessLookupError, PermissionError):
        return 0, 0
    return seen.rss_bytes, seen.peak_rss_bytes


def _drop_rounds(launch: DeviceLaunch) -> tuple[int, ...]:
    args = list(launch.extra_args)
    if "--drop-rounds" in args:
        return tuple(int(r) for r in args[args.index("--drop-rounds") + 1].split(","))
    return ()


async def run_fleet(
    fleet: Fleet,
    config: ServerConfig,
    *,
    specs: list[DeviceSpec] | None = None,
    drops: Mapping[str, Iterable[int]] | None = None,
    on_event: Callable[[str, dict], None] | None = None,
    data_root: str | None = None,
    stderr_dir: Path | None = None,
    mechanism: str | None = None,
    timeout_s: float | None = None,
    rss_guard: bool = True,
    data_limit: int | None = None,
) -> EmulationRun:
    """Run every device of `fleet` against an orchestrator in this process until the last round.

    `specs` defaults to ``fleet.devices()``; `drops` (device id -> rounds) defaults to
    :func:`drop_schedule`; `mechanism` and `timeout_s` default to the fleet's ``[emulation]`` section.
    Devices that vanish on purpose are started again after their ``rejoin_after_s``; devices killed
    for memory or time are not (the report says which, and in which round). `rss_guard` also kills a
    device whose resident set passes its budget (see the module docstring). Devices read the
    training split from one memory-mapped copy written before they start
    (:func:`orchestrator.localfleet.prepare_device_data`), cut to its first `data_limit` samples if
    given (CIFAR-10: a class-balanced subset).
    """
    from orchestrator.localfleet import prepare_device_data, start_orchestrator  # loads torch: only when a run starts

    specs = fleet.devices() if specs is None else specs
    schedule = drop_schedule(fleet, specs, config.rounds) if drops is None else {k: tuple(v) for k, v in drops.items()}
    launches = {s.id: dataclasses.replace(device_launch(fleet, s, schedule.get(s.id, ())), data_limit=data_limit)
                for s in specs}
    if stderr_dir is not None:
        stderr_dir.mkdir(parents=True, exist_ok=True)
    emu = _Emulator(fleet, specs, launches, on_event or (lambda kind, data: None),
                    mechanism=mechanism or fleet.emulation.memory_cap,
                    timeout_s=timeout_s or fleet.emulation.timeout_s, rss_guard=rss_guard, data_root=data_root, stderr_dir=stderr_dir)
    prepare_device_data(list(launches.values()), data_root)
    orch, server_task = await start_orchestrator(config, emu.on_server_event)
    emu.url = f"ws://{config.host}:{orch.port}"
    try:
        for s in specs:
            emu.start(s.id)
        history = await server_task
    finally:
        if not server_task.done():
            server_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await server_task
        await emu.stop()
    return EmulationRun(history, [emu.results[s.id] for s in specs if s.id in emu.results])


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
) -> EmulationRun:
    """Run `fleet` in its ``emulation.mode``: one capped process per device (:func:`run_fleet`), or
    many uncapped devices per worker process (:func:`orchestrator.emulation.lightweight.run_lightweight`).

    `rss_guard` applies to the process mode, `workers` (default: one per core, 2-4) to the lightweight one."""
    mode = fleet.emulation.mode
    if mode == "lightweight":
        from orchestrator.emulation.lightweight import run_lightweight

        return await run_lightweight(fleet, config, specs=specs, on_event=on_event, data_root=data_root,
                                     stderr_dir=stderr_dir, workers=workers)
    if workers is not None:
        raise ValueError(f"{fleet.name}: workers apply to emulation.mode \"lightweight\", not {mode!r}")
    return await run_fleet(fleet, config, specs=specs, on_event=on_event, data_root=data_root,
                           stderr_dir=stderr_dir, rss_guard=rss_guard, data_limit=data_limit)


# -- the device entry point under the rlimit fallback -----------------------------------------------
def _load_runtimes() -> None:
    """Load and warm up what a device loads lazily (its first ONNX session, its first training
    step, as the device takes them), so that RLIMIT_AS is set above it (FACTS.md).

    The device runs both in a worker thread (``asyncio.to_thread``), so the warm-up does too: the
    malloc arena that thread takes (glibc reserves 64 MiB of address space for it) then exists
    before the limit is set, instead of consuming the allowance of a device whose RSS is well under
    its budget."""
    from edge_sdk.forward import warm_up as onnxruntime_warm_up
    from edge_sdk.memory import tune_allocator
    from edge_sdk.trainer import warm_up as torch_warm_up

    tune_allocator()  # the device's own allocator settings, before any thread takes an arena
    failed: list[BaseException] = []

    def warm() -> None:
        try:
            onnxruntime_warm_up()
            torch_warm_up()
        except BaseException as exc:  # re-raised in the main thread
            failed.append(exc)

    worker = threading.Thread(target=warm, name="warm-up")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]


def device_main(argv: list[str]) -> None:
    """``edgetrain device`` with the process's own memory cap applied after the runtimes are loaded.

    A failed allocation exits with ``MEMORY_EXIT_CODE`` (typer would print it and exit 1), so the
    emulator can tell a device over its budget from one that crashed."""
    from orchestrator.emulation.capping import MEMORY_EXIT_CODE, apply_self_limit, is_out_of_memory

    if os.environ.get(MECHANISM_ENV) == "rlimit-as+watchdog":
        _load_runtimes()
        apply_self_limit()
    from orchestrator.cli import app
    from orchestrator.cli import commands  # noqa: F401  (registers the commands)

    try:
        app(args=argv, prog_name="edgetrain", standalone_mode=False)
    except BaseException as exc:
        cause: BaseException | None = exc
        while cause is not None:
            if is_out_of_memory(cause):
                print(f"out of memory: {cause}", file=sys.stderr, flush=True)
                os._exit(MEMORY_EXIT_CODE)
            cause = cause.__cause__ or cause.__context__
        raise


if __name__ == "__main__":
    device_main(sys.argv[1:])
