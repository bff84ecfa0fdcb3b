"""The emulator's lightweight mode: many uncapped devices sharing a few worker processes.

A process that imports torch costs 220-390 MiB of resident memory (docs/measurements.md), so a fleet of a few
hundred capped processes does not fit on one machine. In this mode the fleet's devices are split
across W worker processes; each worker runs its devices as asyncio tasks of the real
:class:`edge_sdk.client.DeviceClient`, every device with its own websocket connection, its own state
(plan, round progress, reconnects) and its own shard of the data. Nothing caps a device's memory
here: budgets only steer the planner, and the report says so (``mode: lightweight``).

A device that is not selected in a round awaits its next message on its socket and costs no CPU;
the workers' CPU per round (measured from outside, between the orchestrator's ``round_start`` and
``round_end``) shows it. Training and chunk forwarding run in a small thread pool (2 threads by
default) with torch and ONNX Runtime on one thread each, so a hundred devices in a worker never
start more than a few busy threads.

A worker's devices share what a process of one device would rebuild every round: one pool of built
tails (:class:`edge_sdk.warm_tails.WarmTails`; a tail is taken in the training thread, loaded with
the round's state, trained and given back, so a device that is not training holds no model) and the
heap (no ``malloc_trim`` after each report, and freed buffers kept in the heap instead of a mapping
per buffer or a heap trimmed on free: the next device reuses them at once, without faulting their
pages in again (:func:`keep_heap`; a quarter of the CPU of an mnist_cnn training step,
edge_sdk.client.DeviceSettings.trim_memory), one file per payload its devices keep
(:mod:`edge_sdk.payload_store`: a device's store links the file another device of the worker wrote), and
each device's shard is a read-only map of a file of its own (:mod:`emulator.shards`).
Every check of the protocol stays on: each transfer's sha256, each tensor's validation.

The emulator's side is :class:`LightweightBackend`, the ``lightweight`` row of the backend table
(:mod:`emulator.backends`): it starts the workers (:meth:`~LightweightBackend.prepare`), hands them
the orchestrator's address (:meth:`~LightweightBackend.start`), stops the run when one dies during it
(:class:`WorkerFailed`) and stops them all after the last round (:meth:`~LightweightBackend.cancel`);
:class:`LightweightEmulator` records what they report.

Run as ``python -m emulator.lightweight --url URL --spec-file F`` this module is the
worker: F is a :class:`WorkerSpec` as JSON. With ``--url -`` it reads the orchestrator's address
from the first line of stdin once its runtimes and shards are loaded: the emulator starts its
workers first and its orchestrator meanwhile. It prints one JSON event per line on stdout (the
device's own events, plus ``life_start``/``life_end`` per device life and ``worker_ready``/
``worker_exit``), and stops when its stdin closes: that is how the emulator ends the run, and why
a worker never outlives the emulator.

Each device is the :class:`~emulator.launch.DeviceLaunch` the process mode would start,
run by the same code as a device process (:func:`emulator.device.build_client`).
Vanishing mid-round (the fleet's ``dropout``): a device process leaves with ``os._exit``; a device
here must not take its neighbours down, so its connection is reset and
:class:`~emulator.faults.DeviceVanished` ends that device only (the orchestrator sees
it gone), and the worker starts a fresh client after ``rejoin_after_s``, as the process mode starts a
fresh process. What the devices did is recorded by the same
:class:`~emulator.recorder.Recorder` as in the process mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from edge_sdk.fileio import atomic_write
from edge_sdk.values import SettingError
from edge_sdk.warm_tails import WarmTails
from emulator.backend import BackendOption, EmulationBackend, EmulationFailed
from emulator.faults import DeviceVanished
from emulator.fleet import DeviceSpec, Fleet
from emulator.launch import DeviceLaunch
from emulator.recorder import DeviceLife, DeviceResult, EmulationRun, Recorder, json_events
from emulator.schedule import device_launch

if TYPE_CHECKING:
    import numpy as np

    from orchestrator.config import ServerConfig

__all__ = [
    "MAX_WORKERS",
    "LightweightBackend",
    "WorkerDevice",
    "WorkerSpec",
    "WorkerFailed",
    "WorkerStats",
    "default_workers",
    "main",
    "run_lightweight",
    "run_worker",
    "split_devices",
    "worker_device",
    "worker_devices",
]

#: Upper bound of :func:`default_workers`: more workers than cores only add torch copies.
MAX_WORKERS = 4

T = TypeVar("T")


class WorkerFailed(EmulationFailed):
    """A worker process ended during the run: its devices are gone, so the run stops (the message says why)."""


# -- what a worker runs ------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerDevice:
    """One device of a worker: the launch the process mode would start, and when it rejoins after a vanish."""

    launch: DeviceLaunch
    rejoin_after_s: float | None = None

    @property
    def device_id(self) -> str:
        return self.launch.device_id


@dataclass(frozen=True)
class WorkerSpec:
    """Everything one worker process needs: its devices and where the data lives."""

    index: int
    devices: tuple[WorkerDevice, ...]
    data_root: str | None = None
    threads: int = 2  # training / forwarding threads shared by the worker's devices
    stop_grace_s: float = 10.0  # after stdin closes: time for devices still talking to finish
    connect_at_once: int = 64  # devices between opening their connection and their welcome, at most

    def to_json(self) -> str:
        raw = asdict(self)
        raw["devices"] = [{"launch": d.launch.to_dict(), "rejoin_after_s": d.rejoin_after_s} for d in self.devices]
        return json.dumps(raw)

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        """Parse a spec file; a malformed one raises ValueError naming what is wrong."""
        try:
            raw = json.loads(text)
            devices = tuple(WorkerDevice(DeviceLaunch.from_dict(d["launch"]), d.get("rejoin_after_s"))
                            for d in raw.pop("devices"))
            spec = cls(devices=devices, **raw)
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"not a worker spec: {type(e).__name__}: {e}") from None
        if not spec.devices:
            raise ValueError("a worker spec needs at least one device")
        if spec.threads < 1:
            raise ValueError(f"threads must be at least 1, got {spec.threads}")
        if spec.connect_at_once < 1:
            raise ValueError(f"connect_at_once must be at least 1, got {spec.connect_at_once}")
        ids = [d.device_id for d in spec.devices]
        if len(set(ids)) != len(ids):
            raise ValueError("device ids in a worker spec must be distinct")
        return spec


def default_workers(num_devices: int, cores: int | None = None) -> int:
    """Worker processes for a fleet: one per core, between 2 and :data:`MAX_WORKERS`, never more than devices."""
    cores = cores or os.cpu_count() or 2
    return max(1, min(num_devices, MAX_WORKERS, max(2, cores)))


def split_devices(devices: Sequence[T], workers: int) -> list[list[T]]:
    """Deal devices round-robin over `workers` lists, so every worker gets a share of every group."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if workers > len(devices):
        raise ValueError(f"{workers} workers for {len(devices)} devices: at most one worker per device")
    return [list(devices[i::workers]) for i in range(workers)]


def worker_device(fleet: Fleet, spec: DeviceSpec, drop_rounds: Iterable[int] = ()) -> WorkerDevice:
    """The device as the process mode would launch it (:func:`~emulator.schedule.device_launch`)."""
    return WorkerDevice(device_launch(fleet, spec, drop_rounds), spec.behaviour.rejoin_after_s)


def worker_devices(fleet: Fleet, config: ServerConfig, specs: Sequence[DeviceSpec],
                   schedule: Mapping[str, Iterable[int]]) -> dict[str, WorkerDevice]:
    """Every device of a run as its worker starts it, each with its credential where `config` needs
    one (:func:`~emulator.credentials.with_secrets`: enrolled in the run's store)."""
    from emulator.credentials import with_secrets

    devices = {s.id: worker_device(fleet, s, schedule.get(s.id, ())) for s in specs}
    launches = with_secrets(config, {d: w.launch for d, w in devices.items()})
    return {d: dataclasses.replace(w, launch=launches[d]) for d, w in devices.items()}


# -- the worker process --------------------------------------------------------------------------------
class _Stopped(Exception):
    """Raised out of a device's ``reconnect`` event once the run is over: nobody will answer."""


def _local_data(spec: WorkerSpec) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each device's shard, as ``python -m edge_sdk`` loads it (each dataset loaded and split once),
    its inputs memory-mapped from a file of their own."""
    import numpy as np

    from edge_sdk.cli import partition_indices
    from edge_sdk.data import load_dataset
    from emulator.device import shape_data
    from emulator.shards import mapped_rows, prune_unused

    datasets: dict[tuple[str, int | None], Any] = {}
    parts: dict[tuple[str, int | None, str, int, int], list] = {}
    out, folders = {}, set()
    for d in (w.launch for w in spec.devices):
        source = (d.data, d.data_limit)
        if source not in datasets:
            datasets[source] = load_dataset(d.data, root=spec.data_root, split="train", limit=d.data_limit, mmap=True)
        ds = datasets[source]
        key = (*source, d.partition, d.num_clients, d.seed)
        if key not in parts:
            parts[key] = partition_indices(ds, d.partition, d.num_clients, d.seed)
        if not 0 <= d.client < len(parts[key]):
            raise ValueError(f"{d.device_id}: client {d.client} outside [0, {len(parts[key])})")
        idx = parts[key][d.client]
        # Mapped, not copied: an idle device's inputs are not resident (emulator.shards); the
        # shards' folder pruned once, after them all.
        rows = mapped_rows(ds.x, idx, prune=False)
        if isinstance(rows, np.memmap) and rows.filename:
            folders.add(Path(rows.filename).parent)
        out[d.device_id] = shape_data(d, rows, np.array(ds.y[idx]))
    for folder in folders:
        prune_unused(folder)
    return out


def load_runtimes() -> None:
    """Import torch and ONNX Runtime once, on one thread each, before any device connects. The
    worker's devices share one GPU where torch sees one (``EDGETRAIN_TORCH_DEVICE``, here ``auto``
    unless set: :mod:`edge_sdk.accelerator`): one CUDA context per worker, not per device."""
    import onnxruntime  # noqa: F401
    import torch

    from edge_sdk.accelerator import ENV

    os.environ.setdefault(ENV, "auto")

    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):  # only settable before torch's first parallel work
        torch.set_num_interop_threads(1)


def keep_heap() -> bool:
    """Keep every freed buffer below 32 MiB in the heap for the next device, and never shrink the heap
    on a free (:func:`edge_sdk.memory.keep_freed_buffers`), where glibc's own policy still moved its
    mapping threshold and trimmed the top of each arena's heap as buffers came and went: each trim
    unmapped pages that the next device's round faulted in again (about 1,800 page faults per device
    round of mnist_cnn: the download's receive buffer and a training's activations and gradients),
    and an unmap in a process of several threads also interrupts the other cores that run its threads
    (a TLB shootdown). A worker holds its devices' memory for the whole run anyway; its peak is set by
    the tails training at once, not by the heap it keeps. True if applied (glibc)."""
    from edge_sdk.memory import keep_freed_buffers

    return keep_freed_buffers(True)


def cpu_and_memory() -> dict[str, float | int]:
    """This process's CPU (user + system, all threads), resident set and its high-water mark."""
    from edge_sdk.memory import cpu_seconds, process_memory

    seen = process_memory()
    return {"cpu_s": round(cpu_seconds(), 3), "rss_bytes": seen.rss_bytes, "peak_rss_bytes": seen.peak_rss_bytes}


async def _device_lives(d: WorkerDevice, x: np.ndarray, y: np.ndarray, url: str,
                        emit: Callable[[str, dict], None], stopping: asyncio.Event, reconnecting: set[str],
                        warm_tails: WarmTails | None = None, gate: asyncio.Semaphore | None = None) -> None:
    """Run one device until the server says goodbye; after a vanish, a fresh client rejoins.

    `reconnecting` holds the devices between a lost connection and their next welcome; `warm_tails`
    is the worker's pool of built tails, shared by its devices; `gate` admits a life's first
    connection, held until its welcome (:attr:`WorkerSpec.connect_at_once`): thousands of devices
    opening their connections at once time out in the server's accept queue and retry, over and
    over (10,000 at once: none welcomed in four minutes on a busy 2-core machine)."""
    from emulator.device import build_client

    device_id = d.device_id
    t0, welcomed, held = time.monotonic(), False, False

    def let_go() -> None:
        nonlocal held
        if held and gate is not None:
            gate.release()
        held = False

    def on_event(kind: str, data: dict) -> None:
        nonlocal welcomed
        if kind == "welcome" and not welcomed:  # a life's first welcome: how long connecting took
            welcomed = True
            let_go()
            data = {**data, "connect_to_welcome_s": round(time.monotonic() - t0, 4)}
        emit(kind, data)
        if kind == "welcome":
            reconnecting.discard(device_id)
        elif kind == "reconnect":
            if stopping.is_set():
                raise _Stopped(device_id)
            reconnecting.add(device_id)

    life = 0
    while True:
        life += 1
        if gate is not None:
            await gate.acquire()
            held = True
        emit("life_start", {"device": device_id, "life": life})
        t0, error, welcomed = time.monotonic(), "", False
        try:
            await build_client(d.launch, x, y, server=url, on_event=on_event, in_process=True,
                               warm_tails=warm_tails).run()
            ended = "finished"
        except DeviceVanished:
            ended = "dropped"
        except _Stopped:
            ended = "stopped"
        except asyncio.CancelledError:
            emit("life_end", {"device": device_id, "life": life, "ended": "stopped",
                              "wall_s": round(time.monotonic() - t0, 3), "error": ""})
            raise
        except Exception as exc:  # one device's failure is reported, never its neighbours' end
            ended, error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            reconnecting.discard(device_id)
            let_go()
        emit("life_end", {"device": device_id, "life": life, "ended": ended,
                          "wall_s": round(time.monotonic() - t0, 3), "error": error})
        if ended != "dropped" or d.rejoin_after_s is None or stopping.is_set():
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=d.rejoin_after_s)
        if stopping.is_set():
            return


def _url_from_stdin() -> str:
    """The first line of stdin, read byte by byte (nothing of what follows is buffered away)."""
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = os.read(sys.stdin.fileno(), 1)
        if not byte:
            raise SystemExit("stdin closed before the orchestrator's address came")
        line += byte
    url = line.decode().strip()
    if not url.startswith(("ws://", "wss://")):
        raise SystemExit(f"not an orchestrator address on stdin: {url[:100]!r}")
    return url


async def _wait_for_stdin_eof() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while await reader.readline():
            pass
    finally:
        transport.close()


async def run_worker(spec: WorkerSpec, url: str | None, *, emit: Callable[[str, dict], None],
                     stop: Callable[[], Any] | None = None) -> None:
    """Run every device of `spec` against `url` until each is done; None: the first line of stdin,
    read once the runtimes and the shards are loaded (the emulator starts the orchestrator meanwhile).

    `stop` is awaited concurrently (by default: stdin reaching its end); once it returns, devices
    still connected get ``stop_grace_s`` to finish and the rest (waiting to rejoin, reconnecting)
    are cancelled and reported ``stopped``."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=spec.threads, thread_name_prefix="device"))
    data = _local_data(spec)
    if url is None:
        url = await loop.run_in_executor(None, _url_from_stdin)
    stopping = asyncio.Event()
    reconnecting: set[str] = set()
    # Tails are built and trained in the thread pool: at most `threads` are in use at once.
    warm = WarmTails(keep=spec.threads)
    gate = asyncio.Semaphore(spec.connect_at_once)
    tasks = {d.device_id: asyncio.create_task(_device_lives(d, *data[d.device_id], url, emit, stopping, reconnecting,
                                                            warm, gate))
             for d in spec.devices}
    stopper = asyncio.create_task((stop or _wait_for_stdin_eof)())
    emit("worker_ready", {"worker": spec.index, "pid": os.getpid(), "devices": len(tasks), **cpu_and_memory()})
    everyone = asyncio.gather(*tasks.values(), return_exceptions=True)
    await asyncio.wait({stopper, everyone}, return_when=asyncio.FIRST_COMPLETED)
    if not everyone.done():
        stopping.set()  # devices waiting to rejoin return now
        for device_id in list(reconnecting):  # backing off from a server that is gone
            tasks[device_id].cancel()
        await asyncio.wait({everyone}, timeout=spec.stop_grace_s)
        for t in tasks.values():
            t.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    stopper.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await stopper
    emit("worker_exit", {"worker": spec.index, "pid": os.getpid(), **cpu_and_memory()})


def main(argv: Sequence[str] | None = None) -> None:
    """The worker entry point: ``python -m emulator.lightweight --url URL --spec-file F``."""
    parser = argparse.ArgumentParser(prog="python -m emulator.lightweight",
                                     description="Run many emulated devices as asyncio tasks in one process.")
    parser.add_argument("--url", required=True,
                        help="the orchestrator, e.g. ws://127.0.0.1:8765; '-': the first line of stdin")
    parser.add_argument("--spec-file", required=True, type=Path, help="a WorkerSpec as JSON")
    args = parser.parse_args(argv)
    try:
        spec = WorkerSpec.from_json(args.spec_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        parser.error(f"{args.spec_file}: {e}")
    if args.url != "-" and not args.url.startswith(("ws://", "wss://")):
        parser.error(f"--url must be a ws:// or wss:// URL, got {args.url!r}")
    from orchestrator.server.limits import raise_fd_limit

    raise_fd_limit()  # a socket per device: thousands per worker need more than a 1,024 soft limit
    load_runtimes()
    keep_heap()
    # torch's and ONNX Runtime's objects live as long as the worker: out of the collector's reach
    # (gc.freeze), a full collection walks only what the devices allocate, not the runtimes again.
    gc.collect()
    gc.freeze()

    def emit(kind: str, data: dict) -> None:
        sys.stdout.write(json.dumps({"event": kind, **data}, default=str) + "\n")
        sys.stdout.flush()

    asyncio.run(run_worker(spec, None if args.url == "-" else args.url, emit=emit))


# -- the emulator's side ------------------------------------------------------------------------------
@dataclass
class WorkerStats:
    """One worker process: its devices, its memory and CPU, and its CPU in each round."""

    index: int
    devices: int
    pid: int | None = None
    returncode: int | None = None
    peak_rss_bytes: int | None = None  # the worker's resident high-water mark (VmHWM / ru_maxrss)
    rss_ready_bytes: int | None = None  # with its runtimes and data loaded, before its devices connect
    rss_after_connect_bytes: int | None = None  # resident set once every device had its plan
    cpu_s: float | None = None  # user + system over the worker's life
    rounds: list[dict] = field(default_factory=list)  # {"round", "cpu_s"}: CPU between round start and end

    def to_dict(self) -> dict:
        return asdict(self)


class WorkerHandle:
    """The emulator's handle on one worker (a child process, or an actor of a cluster).

    Its CPU and memory are read from /proc while it runs on this machine (``local``), else taken
    from what the worker last ``reported`` of itself."""

    def __init__(self, index: int, devices: list[WorkerDevice]) -> None:
        self.index, self.devices = index, devices
        self.stats = WorkerStats(index, len(devices))
        self.proc: asyncio.subprocess.Process | None = None
        self.watch: asyncio.Task | None = None
        self.round_cpu0: float | None = None
        self.exited = False
        self.local = True
        self.reported: dict = {}  # the worker's own cpu_s, rss_bytes, peak_rss_bytes (a remote worker's)
        self.log: Path | None = None  # its stderr
        self.error = ""  # what ended it, when it says so itself (a remote worker's traceback)

    def log_tail(self, chars: int = 2000) -> str:
        if self.error or self.log is None:
            return self.error[-chars:].strip()
        with contextlib.suppress(OSError):
            return self.log.read_bytes()[-chars:].decode(errors="replace").strip()
        return ""

    def _readable(self) -> bool:
        return self.local and self.stats.pid is not None and not self.exited

    def cpu_s(self) -> float | None:
        """The process's CPU so far (user + system, all threads)."""
        from edge_sdk.memory import cpu_seconds

        if self._readable():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                return cpu_seconds(self.stats.pid)
        return self.reported.get("cpu_s")

    def sample_rss(self) -> int | None:
        """The worker's resident set now (None once it is gone); keeps its high-water mark."""
        from edge_sdk.memory import process_memory

        seen = None
        if self._readable():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                seen = process_memory(self.stats.pid)
        if seen is not None:
            if seen.peak_rss_bytes:
                self.stats.peak_rss_bytes = max(self.stats.peak_rss_bytes or 0, seen.peak_rss_bytes)
            return seen.rss_bytes or None
        if self.reported.get("peak_rss_bytes"):
            self.stats.peak_rss_bytes = max(self.stats.peak_rss_bytes or 0, int(self.reported["peak_rss_bytes"]))
        return self.reported.get("rss_bytes")

    def to_dict(self) -> dict:
        """The worker as the run's result lists it."""
        return self.stats.to_dict()


class LightweightEmulator:
    """What one lightweight run records of its workers and their devices, from the orchestrator's
    events and the workers' (each a JSON object, as a worker prints it)."""

    def __init__(self, specs: list[DeviceSpec], workers: list[WorkerHandle], recorder: Recorder) -> None:
        self.workers, self.recorder = workers, recorder
        self.finished = False  # set when the emulator ends the run: workers ending now were stopped
        self.open_lives: dict[str, float] = {}  # device -> when its current life started
        by_id = {s.id: s for s in specs}
        for w in workers:
            for d in w.devices:
                s = by_id[d.device_id]
                recorder.add(DeviceResult(
                    device=d.device_id, group=s.group, device_class=s.device_class, budget_bytes=s.budget_bytes,
                    mechanism="none", cpu_mechanism="none", cpu_share=None, expect_role=s.expect_role,
                    force_split=s.force_split, drop_rounds=d.launch.faults.drop_rounds, worker=w.index,
                ))

    def on_server_event(self, kind: str, data: dict) -> None:
        if kind == "registered":
            if self.all_registered(str(data["device"])):
                for w in self.workers:  # every device holds its connection, plan and data now
                    w.stats.rss_after_connect_bytes = w.sample_rss()
        elif kind == "round_start":
            for w in self.workers:
                w.round_cpu0 = w.cpu_s()
        elif kind == "round_end":
            for w in self.workers:
                cpu = w.cpu_s()
                if cpu is not None and w.round_cpu0 is not None:
                    w.stats.rounds.append({"round": int(data["round"]), "cpu_s": round(cpu - w.round_cpu0, 3)})
                w.sample_rss()
        self.recorder.on_server_event(kind, data)

    def all_registered(self, device: str) -> bool:
        """Whether every device holds its connection once `device` registers (the current lives'
        registrations: a worker's events come through a pipe, before the server's)."""
        return len(self.recorder.registered | {device}) == len(self.recorder.results)

    def life_round(self, device: str, event: dict) -> int | None:
        """The round a device's life ended in (its ``life_end`` event): the round in progress."""
        return self.recorder.current_round

    def on_worker_event(self, worker: WorkerHandle, event: dict) -> None:
        kind = str(event.get("event"))
        device = event.get("device")
        if kind == "worker_ready":
            worker.stats.rss_ready_bytes = int(event["rss_bytes"])
            worker.sample_rss()
        elif kind == "worker_exit":
            worker.stats.cpu_s = float(event["cpu_s"])
            worker.stats.peak_rss_bytes = max(worker.stats.peak_rss_bytes or 0, int(event["peak_rss_bytes"]))
            self.recorder.emit("emulator:worker_exit", {**event, "worker": worker.index})
            return
        if device is None or str(device) not in self.recorder.results:
            return
        device = str(device)
        if kind == "life_start":
            self.open_lives[device] = time.monotonic()
            self.recorder.life_started(device, pid=worker.stats.pid, worker=worker.index, mechanism="none")
        elif kind == "life_end":
            self.open_lives.pop(device, None)
            life = DeviceLife(None, str(event["ended"]), False, False, None, None, float(event["wall_s"]),
                              self.life_round(device, event))
            self.recorder.life_ended(device, life, worker=worker.index, error=event.get("error", ""))
        else:
            # peak_rss_bytes in its events is the whole worker's, not this device's.
            self.recorder.on_device_event(device, event, own_peak=False)

    def on_worker_gone(self, worker: WorkerHandle, returncode: int | None, *, stopped: bool) -> None:
        """A worker ended: devices whose life it did not close ended with it."""
        worker.stats.returncode = returncode
        ended = "stopped" if stopped else "failed"
        for d in worker.devices:
            t0 = self.open_lives.pop(d.device_id, None)
            if t0 is None:
                continue
            life = DeviceLife(returncode, ended, False, False, None, None, round(time.monotonic() - t0, 3),
                              self.recorder.current_round, "emulator" if stopped else None)
            self.recorder.life_ended(d.device_id, life, worker=worker.index,
                                     error=f"worker exited with {returncode}")


async def sample_rss(workers: list[WorkerHandle], interval_s: float = 0.5) -> None:
    while True:
        for w in workers:
            if not w.exited:
                w.sample_rss()
        await asyncio.sleep(interval_s)


class LightweightBackend(EmulationBackend):
    """The lightweight mode: the fleet's devices in `workers` child processes, none capped.

    The same inputs and result as the process mode, with no memory caps: ``mechanism`` is "none"
    for every device, ``peak_bytes`` is unknown, and the result's ``workers`` list holds each
    worker's pid, peak RSS, CPU and CPU per round. `workers` defaults to :func:`default_workers`;
    `threads` is each worker's training thread pool; `stop_grace_s` what a worker gives its devices
    still talking once the run is over. Subclasses place the workers elsewhere (:meth:`launch`,
    :meth:`start`, :meth:`stop_workers`), e.g. as Ray actors."""

    name = mode = "lightweight"
    summary = "many devices per worker process"
    shared_workers = True
    options = (
        BackendOption("workers", int, "worker processes the devices share (default: one per core, 2-4)"),
        BackendOption("threads", int, "each worker's training threads", cli=False),
        BackendOption("stop_grace_s", float, "seconds a worker's devices get to finish after the run", cli=False),
        BackendOption("connect_at_once", int, "devices of a worker connecting at once (until their welcome)",
                      cli=False),
    )

    def __init__(self, fleet: Fleet, config: ServerConfig, *, workers: int | None = None, threads: int = 2,
                 stop_grace_s: float = 10.0, connect_at_once: int = 64, **common: Any) -> None:
        super().__init__(fleet, config, **common)
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.workers, self.threads, self.stop_grace_s = workers, threads, stop_grace_s
        self.connect_at_once = connect_at_once
        self.handles: list[WorkerHandle] = []
        self.emu: LightweightEmulator | None = None
        self.sampler: asyncio.Task | None = None
        self.run_files: tempfile.TemporaryDirectory | None = None  # spec files and logs without a stderr_dir
        self.payload_files: tempfile.TemporaryDirectory | None = None  # the devices' payloads (device_env)

    @classmethod
    def validate(cls, fleet: Fleet, options: Mapping[str, Any]) -> None:
        workers = options.get("workers")
        if workers is not None and not 1 <= workers <= fleet.num_devices:
            raise SettingError("--workers", f"must be between 1 and the fleet's {fleet.num_devices} devices")

    @classmethod
    def describe(cls, fleet: Fleet, config: ServerConfig, options: Mapping[str, Any]) -> str:
        workers = options.get("workers") or default_workers(fleet.num_devices)
        return f"mode {cls.mode}: {workers} worker processes, no memory caps"

    def deal(self, n_workers: int, handle: type[WorkerHandle] = WorkerHandle) -> None:
        """Deal the devices (each with its credential where the server requires one) over `n_workers`."""
        devices = worker_devices(self.fleet, self.config, self.specs, self.schedule)
        self.handles = [handle(i, [devices[s.id] for s in share])
                        for i, share in enumerate(split_devices(self.specs, n_workers))]
        self.emu = self.bookkeeping()

    def bookkeeping(self) -> LightweightEmulator:
        return LightweightEmulator(self.specs, self.handles, self.recorder)

    def worker_spec(self, w: WorkerHandle) -> WorkerSpec:
        return WorkerSpec(w.index, tuple(w.devices), self.data_root, self.threads, self.stop_grace_s,
                          self.connect_at_once)

    def on_server_event(self, kind: str, data: dict) -> None:
        assert self.emu is not None
        self.emu.on_server_event(kind, data)

    def failure(self) -> EmulationFailed:
        return WorkerFailed(f"{self.fleet.name}: the run stops, a worker's devices are lost: {'; '.join(self.failures)}")

    async def prepare(self) -> None:
        """Start the workers: they load their runtimes and shards while the orchestrator measures
        the model and loads its evaluation data, and learn its address on stdin (:meth:`start`)."""
        from emulator.localfleet import device_env

        self.deal(self.workers or default_workers(len(self.specs)))
        if self.stderr_dir is None:
            self.run_files = tempfile.TemporaryDirectory(prefix="edgetrain-lightweight-")
        folder = Path(self.run_files.name) if self.run_files is not None else Path(self.stderr_dir)
        folder.mkdir(parents=True, exist_ok=True)
        self.sampler = asyncio.create_task(sample_rss(self.handles))
        self.payload_files = tempfile.TemporaryDirectory(prefix="edgetrain-payloads-")
        env = device_env(self.payload_files.name)
        for w in self.handles:
            await self._spawn(w, folder, env)

    async def start(self, url: str) -> None:
        for w in self.handles:
            assert w.proc is not None and w.proc.stdin is not None
            w.proc.stdin.write(f"{url}\n".encode())

    async def cancel(self) -> None:
        if self.emu is not None:
            self.emu.finished = True
            await self.stop_workers(grace_s=self.stop_grace_s + 5.0)
        if self.sampler is not None:
            self.sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.sampler
        for files in (self.run_files, self.payload_files):
            if files is not None:
                files.cleanup()

    def result(self, history: list[dict]) -> EmulationRun:
        for metrics in history:  # the devices' side of each round's cost, beside the server's server_cpu_s
            per_worker = [r["cpu_s"] for w in self.handles for r in w.stats.rounds if r["round"] == metrics.get("round")]
            if len(per_worker) == len(self.handles):
                metrics["workers_cpu_s"] = round(sum(per_worker), 3)
        return self.recorder.run(history, [s.id for s in self.specs], mode="lightweight",
                                 workers=[w.to_dict() for w in self.handles])

    def worker_lost(self, w: WorkerHandle, returncode: int | None, how: str,
                    said: str = "; its stderr ends with:") -> None:
        """A worker ended: its devices' lives end with it; during the run (`how` it ended, unless
        it returned 0 with every device done, and what it `said`) the run cannot go on."""
        assert self.emu is not None
        w.exited = True
        self.emu.on_worker_gone(w, returncode, stopped=self.emu.finished)
        if not self.emu.finished and returncode != 0:
            tail = w.log_tail()
            self.fail(f"worker {w.index} {how} during the run" + (f"{said}\n{tail}" if tail else ""))

    async def _spawn(self, w: WorkerHandle, folder: Path, env: dict[str, str]) -> None:
        """Start one worker process (it reads the orchestrator's address from its stdin) and watch it."""
        spec_file = folder / f"worker-{w.index}.json"
        atomic_write(spec_file, self.worker_spec(w).to_json().encode(), durable=False)  # 0600: it may hold secrets
        w.log = folder / f"worker-{w.index}.log"
        with open(w.log, "ab") as err:
            w.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "emulator.lightweight", "--url", "-", "--spec-file", str(spec_file),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err, env=env, limit=1 << 20,
            )
        w.stats.pid = w.proc.pid
        w.watch = asyncio.create_task(self._watch(w))
        self.recorder.emit("emulator:worker_started", {"worker": w.index, "pid": w.proc.pid, "devices": len(w.devices)})

    async def _watch(self, w: WorkerHandle) -> None:
        """Read a worker's events until its stdout closes, then record how it ended."""
        assert self.emu is not None and w.proc is not None and w.proc.stdout is not None
        async for event in json_events(w.proc.stdout):
            self.emu.on_worker_event(w, event)
        await w.proc.wait()
        self.worker_lost(w, w.proc.returncode, f"(pid {w.proc.pid}) exited with {w.proc.returncode}")

    async def stop_workers(self, *, grace_s: float) -> None:
        """Close every worker's stdin (its signal to stop), wait for it, kill it if it does not go."""
        for w in self.handles:
            if w.proc is not None and w.proc.stdin is not None:
                with contextlib.suppress(Exception):
                    w.proc.stdin.close()
        for w in self.handles:
            if w.proc is None or w.watch is None:
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(w.watch), timeout=grace_s)
            if w.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.kill()
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(w.watch, timeout=10)


async def run_lightweight(fleet: Fleet, config: ServerConfig, **options: Any) -> EmulationRun:
    """Run every device of `fleet` in worker processes against an orchestrator in this process
    (:class:`LightweightBackend`, its options and the common ones)."""
    return await LightweightBackend(fleet, config, **LightweightBackend.check(options)).run()


if __name__ == "__main__":
    main()
