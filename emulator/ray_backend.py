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
lines a local worker prints, plus the actor process's CPU and memory. :class:`RayBackend` is the
local mode's backend (:class:`~emulator.lightweight.LightweightBackend`) with the workers placed
as actors: it feeds them to the same bookkeeping (:class:`ActorBookkeeping`, a
:class:`~emulator.lightweight.LightweightEmulator`) and :class:`~emulator.recorder.Recorder`, so a
run's ``metrics.json`` is the same (``backend: ray`` and the cluster's address added). Stopping is a call to :meth:`WorkerActor.stop` (a
local worker's stdin closing); an actor that dies (its process killed, its node lost) stops the run
with :class:`~emulator.lightweight.WorkerFailed`, as a local worker's death does.

The orchestrator stays in the emulator's process: the actors must reach its URL. On a local
instance that is 127.0.0.1; on a cluster the server binds ``--host`` (``0.0.0.0`` by default there)
and the actors dial ``--advertise-host`` (by default this node's address as Ray knows it).

Ray is an optional dependency (``pip install 'edgetrain[ray]'``, the backend's ``requires``): this
module, which the backend table imports, imports Ray only when a run starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emulator.backend import BackendOption, EmulationFailed
from emulator.lightweight import (
    LightweightBackend,
    LightweightEmulator,
    WorkerFailed,
    WorkerHandle,
    WorkerSpec,
    cpu_and_memory,
    default_workers,
    load_runtimes,
    run_worker,
    sample_rss,
)

if TYPE_CHECKING:
    from emulator.fleet import Fleet
    from emulator.recorder import EmulationRun
    from orchestrator.config import ServerConfig

__all__ = ["LOCAL_RAY", "RayBackend", "RayUnavailable", "WorkerActor", "connect_ray", "ray_default_workers",
           "run_ray", "worker_host"]

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


class RayUnavailable(EmulationFailed):
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
class ActorHandle(WorkerHandle):
    """The emulator's handle on one worker actor: where it runs (its CPU and memory read from /proc
    when that is this machine, else from its batches)."""

    def __init__(self, index: int, devices: list) -> None:
        super().__init__(index, devices)
        self.actor: Any = None
        self.host = ""
        self.node = ""
        self.local = False

    def to_dict(self) -> dict:
        return {**super().to_dict(), "host": self.host}


class ActorBookkeeping(LightweightEmulator):
    """The local mode's bookkeeping, with one difference: a worker's events arrive one call later
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
        if event.get("event") == "dropped":
            self.dropped_in[str(event.get("device"))] = event.get("round")
        super().on_worker_event(worker, event)

    def life_round(self, device: str, event: dict) -> int | None:
        if event.get("ended") == "dropped" and device in self.dropped_in:
            return self.dropped_in.pop(device)  # the life ends in the round it vanished in
        return super().life_round(device, event)

    def all_registered(self, device: str) -> bool:
        if len(self.seen) >= len(self.recorder.results):
            return False
        self.seen.add(device)
        return len(self.seen) == len(self.recorder.results)


class RayBackend(LightweightBackend):
    """The lightweight workers as Ray actors, on a local instance or a cluster.

    The same inputs and result as :class:`~emulator.lightweight.LightweightBackend` (``mode``
    "lightweight"; each worker dict also names its ``host``). `address`: an existing cluster (``ray
    start --head`` printed it; "auto" for the one this node belongs to), None for a local instance
    started and shut down here. The orchestrator binds `host` (``0.0.0.0`` on a cluster) and `port`;
    actors dial :func:`worker_host`. `workers` defaults to :func:`ray_default_workers`; each actor
    asks Ray for `cpus_per_worker` CPUs. `ray_options` go to ``ray.init``. `stderr_dir` receives a
    failed worker's traceback (``worker-<i>.log``); the actors' own output stays in Ray's session logs."""

    name = where = "ray"
    summary = "the lightweight workers as Ray actors"
    requires = ("ray",)
    install = "pip install 'edgetrain[ray]' (with -c constraints.txt for the pinned version)"
    workers_called = "worker processes as Ray actors"
    options = LightweightBackend.options + (
        BackendOption("address", str, "the running Ray cluster to use (e.g. 10.0.0.5:6379, or 'auto' on a cluster "
                                      "node); default: start a local Ray instance"),
        BackendOption("host", str, "the address the orchestrator binds (default 127.0.0.1; 0.0.0.0 with --address)"),
        BackendOption("advertise_host", str, "the host or IP the workers dial to reach the orchestrator (default: "
                                             "--host, or this node's address as Ray knows it when --host is 0.0.0.0)"),
        BackendOption("port", int, "the orchestrator's port, e.g. one a firewall lets through (default: any free port)"),
        BackendOption("cpus_per_worker", float, "CPUs each actor asks Ray for", cli=False),
        BackendOption("poll_s", float, "the longest a call for a worker's events waits", cli=False),
        BackendOption("ray_options", dict, "keywords of ray.init", cli=False),
    )

    def __init__(self, fleet: Fleet, config: ServerConfig, *, address: str | None = None,
                 advertise_host: str | None = None, host: str | None = None, port: int | None = None,
                 cpus_per_worker: float = 1.0, poll_s: float = 1.0, ray_options: Mapping[str, Any] | None = None,
                 **options: Any) -> None:
        super().__init__(fleet, self.server_settings(config, {"address": address, "host": host, "port": port}),
                         **options)
        self.address, self.advertise_host = address, advertise_host
        self.cpus_per_worker, self.poll_s, self.ray_options = cpus_per_worker, poll_s, dict(ray_options or {})
        self.started = False  # this run started or connected Ray (and shuts it down)
        self.prepared: asyncio.Future | None = None
        self.pumps: list[asyncio.Task] = []

    @classmethod
    def server_settings(cls, config: ServerConfig, options: Mapping[str, Any]) -> ServerConfig:
        host, port = options.get("host"), options.get("port")
        return dataclasses.replace(config, host=host or ("0.0.0.0" if options.get("address") is not None else config.host),
                                   port=config.port if port is None else port)

    @classmethod
    def describe(cls, fleet: Fleet, config: ServerConfig, options: Mapping[str, Any]) -> str:
        address, workers = options.get("address"), options.get("workers")
        n_workers_text = (str(workers or default_workers(fleet.num_devices)) if address is None
                          else str(workers) if workers else "one per cluster CPU,")
        where = f"the Ray cluster at {address}" if address is not None else "a local Ray instance"
        return (f"mode {cls.mode}: {n_workers_text} worker processes as Ray actors on {where}, no memory caps; "
                f"orchestrator bound to {config.host}")

    @classmethod
    def report(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return {**super().report(options), "ray_address": options.get("address")}

    def bookkeeping(self) -> LightweightEmulator:
        return ActorBookkeeping(self.specs, self.handles, self.recorder)

    def url(self, port: int) -> str:
        return f"ws://{worker_host(self.config.host, self.advertise_host)}:{port}"

    async def prepare(self) -> None:
        """Start (or reach) Ray and create the actors: they load their runtimes while the
        orchestrator starts."""
        n_local = self.workers or default_workers(len(self.specs))
        self.started = connect_ray(self.address, num_cpus=max(1, int(n_local * self.cpus_per_worker + 0.999)),
                                   **self.ray_options)
        ray = _ray()
        self.deal(self.workers or ray_default_workers(len(self.specs), self.address), ActorHandle)
        actor_class = ray.remote(WorkerActor).options(
            num_cpus=self.cpus_per_worker, max_concurrency=4, scheduling_strategy="SPREAD",
            runtime_env={"env_vars": dict(ACTOR_ENV)},
        )
        for w in self.handles:
            w.actor = actor_class.remote()
        self.prepared = asyncio.ensure_future(asyncio.gather(*(w.actor.prepare.remote() for w in self.handles)))
        self.sampler = asyncio.create_task(sample_rss(self.handles))

    async def start(self, url: str) -> None:
        """Learn where each actor runs, start taking its events, then start its devices."""
        ray = _ray()
        here = None  # this process's Ray node (none for a Ray Client connection, ray://...)
        with contextlib.suppress(Exception):
            here = ray.get_runtime_context().get_node_id()
        assert self.prepared is not None
        try:
            for w, info in zip(self.handles, await self.prepared):
                w.stats.pid, w.host, w.node = int(info["pid"]), str(info["host"]), str(info["node"])
                w.local = here is not None and w.node == here
                self.pumps.append(asyncio.create_task(self._pump(w)))  # before any device starts
            await asyncio.gather(*(w.actor.start.remote(self.worker_spec(w).to_json(), url) for w in self.handles))
        except ray.exceptions.RayError as e:  # an actor that cannot start: edgetrain or its runtimes missing on a node
            raise WorkerFailed(f"{self.fleet.name}: a Ray actor could not start its worker: "
                               f"{type(e).__name__}: {e}") from None
        for w in self.handles:
            self.recorder.emit("emulator:worker_started", {"worker": w.index, "pid": w.stats.pid, "host": w.host,
                                                            "devices": len(w.devices), "backend": "ray"})

    async def _pump(self, w: ActorHandle) -> None:
        """Take a worker's events until its last batch, then record how it ended."""
        assert self.emu is not None
        returncode: int | None = None
        try:
            while True:
                batch = await w.actor.next_events.remote(self.poll_s)
                w.reported = batch
                for line in batch["events"]:
                    event = json.loads(line)
                    if isinstance(event, dict):
                        self.emu.on_worker_event(w, event)
                if batch["done"]:
                    w.error = batch["error"]
                    returncode = 1 if batch["error"] else 0
                    break
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the actor is gone: its process was killed or its node lost
            w.error = f"{type(e).__name__}: {e}"
        w.exited = True
        w.sample_rss()
        how = "failed" if returncode else "died"
        self.worker_lost(w, returncode, f"(Ray actor, pid {w.stats.pid} on {w.host}) {how}", said=":")

    async def cancel(self) -> None:
        try:
            if self.prepared is not None and not self.prepared.done():
                self.prepared.cancel()
            if self.prepared is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self.prepared
            await super().cancel()
            if self.stderr_dir is not None:
                for w in self.handles:
                    if w.error:
                        Path(self.stderr_dir).mkdir(parents=True, exist_ok=True)
                        (Path(self.stderr_dir) / f"worker-{w.index}.log").write_text(w.error + "\n", encoding="utf-8")
        finally:
            if self.started:
                _ray().shutdown()

    async def stop_workers(self, *, grace_s: float) -> None:
        """Ask every actor to stop, take its last events, then end it (an actor never outlives the run)."""
        assert self.emu is not None
        ray = _ray()
        handles: list[ActorHandle] = self.handles  # type: ignore[assignment]
        for w in handles:
            if w.actor is not None:
                with contextlib.suppress(Exception):
                    w.actor.stop.remote()
        deadline = time.monotonic() + grace_s
        for p in self.pumps:
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(p), timeout=max(0.1, deadline - time.monotonic()))
        for p in self.pumps:
            if not p.done():
                p.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await p
        for w in handles:  # an actor that did not answer in time: its devices' lives end here
            if w.actor is not None and not w.exited:
                w.exited = True
                self.emu.on_worker_gone(w, None, stopped=True)
        for w in handles:
            if w.actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(w.actor)


async def run_ray(fleet: Fleet, config: ServerConfig, **options: Any) -> EmulationRun:
    """Run every device of `fleet` in Ray actors against an orchestrator in this process
    (:class:`RayBackend`, its options and the common ones)."""
    return await RayBackend(fleet, config, **RayBackend.check(options)).run()
