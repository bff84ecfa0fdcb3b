"""The lightweight mode's workers as Ray actors: emulated fleets beyond one machine.

``edgetrain emulate --backend ray [--address ADDR]`` runs the same workers as the local lightweight
mode (:mod:`emulator.lightweight`), each one a Ray actor instead of a child process: a
local Ray instance when no address is given, an existing cluster otherwise. An actor runs
:func:`~emulator.lightweight.run_worker` (its own thread and asyncio loop) with the
:class:`~emulator.lightweight.WorkerSpec` a local worker reads from its spec file, so
every device is the real :class:`edge_sdk.client.DeviceClient` with its own websocket connection to
the orchestrator, its own state and its own shard of the data, exactly as in the local mode.

Events go back to the emulator in batches: the emulator keeps one call to the actor's
:meth:`WorkerActor.next_events` outstanding per worker; it returns as soon as the worker has emitted
anything (or after ``poll_s``, the length of an idle call), with every event so far as the JSON
lines a local worker prints, plus the actor process's CPU and memory. The emulator feeds them to the same
:class:`~emulator.lightweight.LightweightEmulator` and
:class:`~emulator.recorder.Recorder` as the local mode, so a run's ``metrics.json`` is
the same (``backend: ray`` added by the command). Stopping is a call to :meth:`WorkerActor.stop` (a
local worker's stdin closing); an actor that dies (its process killed, its node lost) stops the run
with :class:`~emulator.lightweight.WorkerFailed`, as a local worker's death does.

The orchestrator stays in the emulator's process: the actors must reach its URL. On a local
instance that is 127.0.0.1; on a cluster the server binds ``--host`` (``0.0.0.0`` by default there)
and the actors dial ``--advertise-host`` (by default this node's address as Ray knows it).

Ray is an optional dependency (``pip install 'edgetrain[ray]'``): this module imports it only when a
run starts, and nothing else in edgetrain imports this module until ``--backend ray`` is asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emulator.fleet import DeviceSpec, Fleet
from emulator.lightweight import (
    WorkerFailed,
    WorkerSpec,
    cpu_and_memory,
    LightweightEmulator,
    load_runtimes,
    sample_rss,
    WorkerHandle,
    default_workers,
    run_worker,
    split_devices,
    worker_devices,
)
from emulator.recorder import EmulationRun, Recorder
from emulator.schedule import drop_schedule

if TYPE_CHECKING:
    from orchestrator.config import ServerConfig

__all__ = ["LOCAL_RAY", "RayUnavailable", "WorkerActor", "connect_ray", "ray_default_workers", "run_ray",
           "worker_host"]

#: How a local Ray instance is started: small, quiet, no dashboard, a minimal object store (events
#: are small; nothing large goes through Ray).
LOCAL_RAY: dict[str, Any] = {
    "include_dashboard": False,
    "object_store_memory": 100 * 2**20,
    "log_to_driver": False,
    "logging_level": logging.WARNING,
}

#: Environment of every actor: one thread per runtime, as a local worker gets (``device_env``).
ACTOR_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

#: Set before Ray starts or connects, unless the user set them: no usage reports.
RAY_ENV_DEFAULTS = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DISABLE_DOCKER_CPU_WARNING": "1"}

NAMESPACE = "edgetrain"


class RayUnavailable(RuntimeError):
    """Ray is not installed (``pip install 'edgetrain[ray]'``) or could not start / connect."""


# -- the actor ------------------------------------------------------------------------------------
class WorkerActor:
    """One lightweight worker inside a Ray actor process.

    :meth:`start` runs :func:`run_worker` on a thread of its own (its own asyncio loop); the worker's
    events are queued as JSON lines and taken by :meth:`next_events`. The actor is created with
    ``max_concurrency`` > 1, so those calls are served while the worker runs."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._events: list[str] = []
        self._done = False
        self._error = ""
        self._stop_requested = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def prepare(self) -> dict:
        """Load the runtimes (torch, ONNX Runtime); say where the actor runs: its process, host, Ray node."""
        from orchestrator.server.limits import raise_fd_limit

        raise_fd_limit()  # a socket per device, as a local worker (main) does
        load_runtimes()
        node = ""
        with contextlib.suppress(Exception):
            import ray

            node = ray.get_runtime_context().get_node_id()
        return {"pid": os.getpid(), "host": socket.gethostname(), "node": node}

    def start(self, spec_json: str, url: str) -> None:
        """Load the runtimes and start the worker's devices against `url`."""
        spec = WorkerSpec.from_json(spec_json)
        if self._thread is not None:
            raise RuntimeError("this worker has started already")
        load_runtimes()  # done by prepare() already, unless it was not called
        self._thread = threading.Thread(target=self._run, args=(spec, url), name=f"edgetrain-worker-{spec.index}",
                                        daemon=True)
        self._thread.start()

    def _emit(self, kind: str, data: dict) -> None:
        line = json.dumps({"event": kind, **data}, default=str)  # what a local worker prints
        with self._cond:
            self._events.append(line)
            self._cond.notify_all()

    def _run(self, spec: WorkerSpec, url: str) -> None:
        async def main() -> None:
            stop = asyncio.Event()
            with self._cond:
                self._loop, self._stop = asyncio.get_running_loop(), stop
                if self._stop_requested:
                    stop.set()
            await run_worker(spec, url, emit=self._emit, stop=stop.wait)

        try:
            asyncio.run(main())
        except BaseException:  # reported to the emulator; the actor itself stays up
            self._error = traceback.format_exc()
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def stop(self) -> None:
        """The run is over (a local worker's stdin closing): devices get the spec's grace, then stop."""
        with self._cond:
            self._stop_requested = True
            loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: the worker is done
                loop.call_soon_threadsafe(stop.set)

    def next_events(self, wait_s: float, max_events: int = 20000) -> dict:
        """Every event not yet taken (at most `max_events`), waiting up to `wait_s` for a first one.

        ``done``: the worker has ended and this is its last batch (``error``: its traceback if it
        failed). ``cpu_s``, ``rss_bytes``, ``peak_rss_bytes``: this actor process, now."""
        with self._cond:
            if not self._events and not self._done:
                self._cond.wait(timeout=wait_s)
            batch, self._events = self._events[:max_events], self._events[max_events:]
            done = self._done and not self._events
            error = self._error if done else ""
        return {"events": batch, "done": done, "error": error, **cpu_and_memory()}


# -- Ray itself -----------------------------------------------------------------------------------
def _ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--backend ray needs Ray: pip install 'edgetrain[ray]' "
                             "(with -c constraints.txt for the pinned version)") from None
    return ray


def connect_ray(address: str | None, *, num_cpus: int | None = None, **options: Any) -> bool:
    """Start a local Ray instance (`address` None) or connect to the cluster at `address`.

    True when this call started or connected Ray (the caller shuts it down); False when this process
    was connected already. `num_cpus` sizes a local instance (Ray's logical CPUs, one per worker)."""
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    ray = _ray()
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"namespace": NAMESPACE, "log_to_driver": False, "logging_level": logging.WARNING}
    if address is None:
        kwargs.update(LOCAL_RAY, num_cpus=num_cpus)
    else:
        kwargs["address"] = address
    kwargs.update(options)
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        raise RayUnavailable(f"could not start or reach {where}: {e}") from None
    return True


def ray_default_workers(num_devices: int, address: str | None) -> int:
    """Workers for a fleet: as locally (one per core, 2-4) on a local instance; on a cluster one per
    CPU the cluster has (each actor asks for one), never more than devices."""
    if address is None:
        return default_workers(num_devices)
    cpus = int(_ray().cluster_resources().get("CPU", 1))
    return max(1, min(num_devices, cpus))


def worker_host(bind_host: str, advertise_host: str | None) -> str:
    """The host the actors dial: `advertise_host`, else the bind host unless it is a wildcard, else
    this node's address as Ray knows it."""
    if advertise_host:
        return advertise_host
    if bind_host not in ("0.0.0.0", "::", ""):
        return bind_host
    return _ray().util.get_node_ip_address()


# -- the emulator's side ----------------------------------------------------------------------------
class _RayWorker(WorkerHandle):
    """The emulator's handle on one worker actor."""

    def __init__(self, index: int, devices: list) -> None:
        super().__init__(index, devices)
        self.actor: Any = None
        self.host = ""
        self.node = ""
        self.local = False  # on this machine: CPU and memory read from /proc as in the local mode
        self.last: dict = {}  # the actor's own CPU and memory, from its latest batch
        self.error = ""

    def log_tail(self, chars: int = 2000) -> str:
        return self.error[-chars:].strip()

    def cpu_s(self) -> float | None:
        if self.local and self.stats.pid is not None and not self.exited:
            from edge_sdk.memory import cpu_seconds

            with contextlib.suppress(ProcessLookupError, PermissionError):
                return cpu_seconds(self.stats.pid)
        return self.last.get("cpu_s")

    def sample_rss(self) -> int | None:
        if self.local and self.stats.pid is not None and not self.exited:
            from edge_sdk.memory import process_memory

            try:
                seen = process_memory(self.stats.pid)
            except (ProcessLookupError, PermissionError):
                seen = None
            if seen is not None:
                if seen.peak_rss_bytes:
                    self.stats.peak_rss_bytes = max(self.stats.peak_rss_bytes or 0, seen.peak_rss_bytes)
                return seen.rss_bytes or None
        if self.last.get("peak_rss_bytes"):
            self.stats.peak_rss_bytes = max(self.stats.peak_rss_bytes or 0, int(self.last["peak_rss_bytes"]))
        return self.last.get("rss_bytes")


class _RayEmulator(LightweightEmulator):
    """The local mode's emulator state, with one difference: a worker's events arrive one call later
    than through a pipe, so a device's ``life_start`` may come after the server registered it. The
    workers' resident set "with every device connected" is therefore sampled when every device has
    registered once, counted here, not from the recorder's current lives; and a device that vanished
    mid-round is recorded in the round its ``dropped`` event names, even when the round ended before
    its ``life_end`` arrived."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: set[str] = set()
        self.dropped_in: dict[str, int | None] = {}  # device -> the round its last "dropped" event named

    def on_worker_event(self, worker: WorkerHandle, event: dict) -> None:
        kind, device = event.get("event"), str(event.get("device"))
        if kind == "dropped":
            self.dropped_in[device] = event.get("round")
        elif kind == "life_end" and event.get("ended") == "dropped" and device in self.dropped_in:
            now = self.recorder.current_round
            self.recorder.current_round = self.dropped_in.pop(device)  # the life ends in the round it vanished in
            try:
                super().on_worker_event(worker, event)
            finally:
                self.recorder.current_round = now
            return
        super().on_worker_event(worker, event)

    def on_server_event(self, kind: str, data: dict) -> None:
        if kind == "registered" and len(self.seen) < len(self.recorder.results):
            self.seen.add(str(data["device"]))
            if len(self.seen) == len(self.recorder.results):
                for w in self.workers:
                    w.stats.rss_after_connect_bytes = w.sample_rss()
        super().on_server_event(kind, data)


async def _pump(emu: LightweightEmulator, worker: _RayWorker, poll_s: float) -> None:
    """Take a worker's events until its last batch, then record how it ended."""
    returncode: int | None = None
    try:
        while True:
            batch = await worker.actor.next_events.remote(poll_s)
            worker.last = batch
            for line in batch["events"]:
                event = json.loads(line)
                if isinstance(event, dict):
                    emu.on_worker_event(worker, event)
            if batch["done"]:
                worker.error = batch["error"]
                returncode = 1 if batch["error"] else 0
                break
    except asyncio.CancelledError:
        raise
    except Exception as e:  # the actor is gone: its process was killed or its node lost
        worker.error = f"{type(e).__name__}: {e}"
    worker.exited = True
    worker.sample_rss()
    emu.on_worker_gone(worker, returncode, stopped=emu.finished)
    if not emu.finished and returncode != 0:
        how = "failed" if returncode else "died"
        tail = worker.log_tail()
        emu.failures.append(f"worker {worker.index} (Ray actor, pid {worker.stats.pid} on {worker.host}) {how} "
                            "during the run" + (f":\n{tail}" if tail else ""))
        emu.worker_failed.set()


async def run_ray(
    fleet: Fleet,
    config: ServerConfig,
    *,
    address: str | None = None,
    advertise_host: str | None = None,
    specs: list[DeviceSpec] | None = None,
    drops: Mapping[str, Iterable[int]] | None = None,
    on_event: Callable[[str, dict], None] | None = None,
    data_root: str | None = None,
    stderr_dir: Path | None = None,
    workers: int | None = None,
    threads: int = 2,
    stop_grace_s: float = 10.0,
    cpus_per_worker: float = 1.0,
    poll_s: float = 1.0,
    ray_options: Mapping[str, Any] | None = None,
) -> EmulationRun:
    """Run every device of `fleet` in `workers` Ray actors against an orchestrator in this process.

    The same inputs and result as :func:`~emulator.lightweight.run_lightweight`
    (``mode`` "lightweight"; each worker dict also names its ``host``). `address`: an existing
    cluster (``ray start --head`` printed it; "auto" for the one this node belongs to), None for a
    local instance started and shut down here. The orchestrator binds ``config.host``; actors dial
    :func:`worker_host`. `workers` defaults to :func:`ray_default_workers`; each actor asks Ray for
    `cpus_per_worker` CPUs. `ray_options` go to ``ray.init``. `stderr_dir` receives a failed
    worker's traceback (``worker-<i>.log``); the actors' own output stays in Ray's session logs."""
    from emulator.localfleet import start_orchestrator  # loads torch: only when a run starts

    specs = fleet.devices() if specs is None else specs
    if not specs:
        raise ValueError(f"{fleet.name}: no devices to emulate")
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    if workers is not None and not 1 <= workers <= len(specs):
        raise ValueError(f"workers must be between 1 and the fleet's {len(specs)} devices, got {workers}")
    n_local = workers or default_workers(len(specs))
    started = connect_ray(address, num_cpus=max(1, int(n_local * cpus_per_worker + 0.999)), **dict(ray_options or {}))
    ray = _ray()
    try:
        n_workers = workers or ray_default_workers(len(specs), address)
        schedule = (drop_schedule(fleet, specs, config.rounds) if drops is None
                    else {k: tuple(v) for k, v in drops.items()})
        devices = worker_devices(fleet, config, specs, schedule)
        handles = [_RayWorker(i, [devices[s.id] for s in share])
                   for i, share in enumerate(split_devices(specs, n_workers))]
        recorder = Recorder(on_event)
        emu = _RayEmulator(specs, handles, recorder)
        return await _run(ray, emu, handles, fleet, config, recorder, specs, start_orchestrator,
                          advertise_host=advertise_host, data_root=data_root, stderr_dir=stderr_dir,
                          threads=threads, stop_grace_s=stop_grace_s, cpus_per_worker=cpus_per_worker,
                          poll_s=poll_s)
    finally:
        if started:
            ray.shutdown()


async def _run(ray, emu: LightweightEmulator, handles: list[_RayWorker], fleet: Fleet, config: ServerConfig,
               recorder: Recorder, specs: list[DeviceSpec], start_orchestrator, *, advertise_host: str | None,
               data_root: str | None, stderr_dir: Path | None, threads: int, stop_grace_s: float,
               cpus_per_worker: float, poll_s: float) -> EmulationRun:
    here = None  # this process's Ray node (none for a Ray Client connection, ray://...)
    with contextlib.suppress(Exception):
        here = ray.get_runtime_context().get_node_id()
    actor_class = ray.remote(WorkerActor).options(
        num_cpus=cpus_per_worker, max_concurrency=4, scheduling_strategy="SPREAD",
        runtime_env={"env_vars": dict(ACTOR_ENV)},
    )
    for w in handles:  # the actors start and load their runtimes while the orchestrator starts
        w.actor = actor_class.remote()
    prepared = asyncio.ensure_future(asyncio.gather(*(w.actor.prepare.remote() for w in handles)))
    pumps: list[asyncio.Task] = []
    sampler = asyncio.create_task(sample_rss(handles))
    server_task: asyncio.Task | None = None
    history: list[dict] = []
    try:
        orch, server_task = await start_orchestrator(config, emu.on_server_event)
        url = f"ws://{worker_host(config.host, advertise_host)}:{orch.port}"
        try:
            for w, info in zip(handles, await prepared):
                w.stats.pid, w.host, w.node = int(info["pid"]), str(info["host"]), str(info["node"])
                w.local = here is not None and w.node == here
                pumps.append(asyncio.create_task(_pump(emu, w, poll_s)))  # before any device starts
            spec_json = [WorkerSpec(w.index, tuple(w.devices), data_root, threads, stop_grace_s).to_json()
                         for w in handles]
            await asyncio.gather(*(w.actor.start.remote(s, url) for w, s in zip(handles, spec_json)))
        except ray.exceptions.RayError as e:  # an actor that cannot start: edgetrain or its runtimes missing on a node
            raise WorkerFailed(f"{fleet.name}: a Ray actor could not start its worker: "
                               f"{type(e).__name__}: {e}") from None
        for w in handles:
            recorder.emit("emulator:worker_started", {"worker": w.index, "pid": w.stats.pid, "host": w.host,
                                                       "devices": len(w.devices), "backend": "ray"})
        failed = asyncio.create_task(emu.worker_failed.wait())
        await asyncio.wait({server_task, failed}, return_when=asyncio.FIRST_COMPLETED)
        failed.cancel()
        if not server_task.done():
            raise WorkerFailed(f"{fleet.name}: the run stops, a worker's devices are lost: {'; '.join(emu.failures)}")
        history = server_task.result()
    finally:
        if server_task is not None and not server_task.done():
            server_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await server_task
        if not prepared.done():
            prepared.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await prepared
        await _stop_actors(emu, handles, pumps, grace_s=stop_grace_s + 5.0)
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        if stderr_dir is not None:
            for w in handles:
                if w.error:
                    Path(stderr_dir).mkdir(parents=True, exist_ok=True)
                    (Path(stderr_dir) / f"worker-{w.index}.log").write_text(w.error + "\n", encoding="utf-8")
    for metrics in history:  # the devices' side of each round's cost, beside the server's server_cpu_s
        per_worker = [r["cpu_s"] for w in handles for r in w.stats.rounds if r["round"] == metrics.get("round")]
        if len(per_worker) == len(handles):
            metrics["workers_cpu_s"] = round(sum(per_worker), 3)
    workers = [{**w.stats.to_dict(), "host": w.host} for w in handles]
    return recorder.run(history, [s.id for s in specs], mode="lightweight", workers=workers)


async def _stop_actors(emu: LightweightEmulator, handles: list[_RayWorker], pumps: list[asyncio.Task], *,
                       grace_s: float) -> None:
    """Ask every actor to stop, take its last events, then end it (an actor never outlives the run)."""
    emu.finished = True
    ray = _ray()
    for w in handles:
        if w.actor is not None:
            with contextlib.suppress(Exception):
                w.actor.stop.remote()
    if pumps:
        deadline = time.monotonic() + grace_s
        for p in pumps:
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(p), timeout=max(0.1, deadline - time.monotonic()))
    for p in pumps:
        if not p.done():
            p.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await p
    for w in handles:  # an actor that did not answer in time: its devices' lives end here
        if w.actor is not None and not w.exited:
            w.exited = True
            emu.on_worker_gone(w, None, stopped=True)
    for w in handles:
        if w.actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(w.actor)
