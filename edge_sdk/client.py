"""The device: connect, say hello, carry out the server's instructions, reconnect on drops.

One training instruction on a device (docs/architecture.md, "One round, step by step"; EmbracingFL
Algorithms 1-2): fetch frozen chunk 1, run it over the local data, cache the activations, free the chunk,
fetch chunk 2 ... then fetch the model payload (the trainable tail, or a submodel of its rows),
train tau local steps on the cached activations and report the deltas. A strong device has no
chunks and trains the whole model. A round may hold several instructions (docs/protocol.md,
"Phases"), each run by the phase of its name in the device's registry (:mod:`edge_sdk.phases`;
``DeviceConfig.registry``): ``evaluate`` reports the received model's loss, ``compare`` the distance
between this round's update and a broadcast one, and an algorithm adds its own phases, report hooks
and selection kinds (:mod:`edge_sdk.algorithms`). The activations and the trained update are kept
for the round, so no phase computes them twice, and a trained update is never trained again.

The client carries no test hooks: emulation wraps its connection from outside (``connect``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import random
import ssl
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from edge_sdk import protocol as p
from edge_sdk.algorithms import DEFAULT_REGISTRY
from edge_sdk.credentials import make_proof
from edge_sdk.data.sources import DataSource, as_source, source_arrays
from edge_sdk.memory import (keep_freed_buffers, may_keep_freed_buffers, peak_rss_bytes, release_memory,
                             tune_allocator)
from edge_sdk.phases import DeviceRegistry, Tensors, TrainedUpdate
from edge_sdk.privacy import PrivateHeat, private_hello_ext, private_hello_fields
from edge_sdk.protocol.session import DeviceSession
from edge_sdk.transport import (Channel, client_tls, recv_msg, recv_payload, send_error, send_msg, send_payload,
                                ws_options)

log = logging.getLogger("edgetrain.device")

#: Integer inputs with at most this many columns are declared per column in the hello (their rows).
MAX_ROW_COLUMNS = 16


class DeviceRefused(RuntimeError):
    """The server turned the device away (bad credentials, budget too small): retrying will not help."""


class RoundAborted(RuntimeError):
    """The server closed the round this device was working on."""


@dataclass
class DeviceConfig:
    server: str
    device_id: str
    budget_bytes: int
    cores: int = 1
    device_class: str = ""
    token: str = ""  # the server's shared token (a lab setting), or:
    secret: str = ""  # this device's enrolled credential: each hello carries a fresh proof of it, not the secret
    labels: dict[str, str] = field(default_factory=dict)
    storage: str = "auto"  # where cached activations live: memory, disk, or auto (disk for weak devices)
    work_dir: Path | None = None
    threads: int = 1
    forward_batch: int = 0  # batch of the multi-step forward pass; 0: the planned batch size
    reconnect: bool = True
    max_retries: int | None = 30  # reconnect attempts in a row; None: forever (a service)
    max_backoff_s: float = 5.0  # the longest wait between two attempts
    frame_size: int = p.DEFAULT_FRAME_SIZE
    tls_ca: str | None = None  # for a wss:// server: trust only this PEM file (private CA, self-signed)
    #: Training backend: "torch", "onnxruntime" (training graphs, never imports torch), or "auto"
    #: (torch if it is installed, else onnxruntime). The hello's runtimes say which (Hello.runtimes).
    backend: str = "auto"
    # Private row heat (FedSubAvg): send randomized-response bits and a decoy-padded download set
    # instead of the true rows (edge_sdk.privacy). None: declare the rows themselves.
    private_heat: PrivateHeat | None = None
    #: Extension fields sent in the hello as they are (``Hello.ext``: ``namespace.name`` -> value), for
    #: a strategy that declares them (``Strategy.hello_fields``).
    hello_ext: dict[str, object] = field(default_factory=dict)
    #: The phases, report hooks and selection kinds this device knows (edge_sdk.phases): the
    #: built-in ones and every algorithm's of edge_sdk.algorithms, unless extended or replaced.
    registry: DeviceRegistry = DEFAULT_REGISTRY
    #: Built tails kept between rounds (:class:`edge_sdk.warm_tails.WarmTails`), shared by the devices
    #: of a process (an emulator's worker); None: the tail is built every round and freed after it.
    warm_tails: Any = None
    #: Return freed heap to the OS after each chunk and report (malloc_trim), and give every large
    #: buffer its own mapping (edge_sdk.memory.tune_allocator) unless the plan leaves room to keep
    #: them for the next step (edge_sdk.memory.may_keep_freed_buffers): what a device's budget wants.
    #: A process running many devices (an emulator's worker) reuses the heap and keeps it.
    trim_memory: bool = True
    #: A device that keeps its freed buffers trims its heap once it has been idle this long after a
    #: report, not at the report itself: back-to-back rounds reuse the buffers (a trim and the page
    #: faults after it cost an emulated mnist_cnn device about a tenth of its round's CPU), and an
    #: idle device still hands them back.
    idle_trim_s: float = 2.0
    #: A bundle (edge_sdk.bundle) provisioned offline: its chunks and training graph are used instead
    #: of downloads whenever the server's payloads have the same bytes (sha256).
    bundle: Path | None = None


@dataclass
class RoundReport:
    round: int
    role: str
    phase: str
    trained: tuple[int, int]
    metrics: dict[str, p.Scalar]
    timings: dict[str, float]

    @property
    def loss_before(self) -> float:
        return float(self.metrics.get("loss_before", math.nan))

    @property
    def loss_after(self) -> float:
        return float(self.metrics.get("loss_after", math.nan))


@dataclass
class _RoundProgress:
    """What survives a reconnect within one round: the activations computed so far, partial
    downloads, trained updates, and each report until the server acknowledges it."""

    round: int
    chunks_done: tuple[str, ...] = ()  # chunk ids run forward so far, in order
    activations: object | None = None  # ActivationCache
    partial: dict[str, p.IncomingTransfer] = field(default_factory=dict)
    storage: str = "memory"  # where the last chunk's activations went
    trained: dict[str, TrainedUpdate] = field(default_factory=dict)  # by model payload id
    reports: dict[str, tuple[p.Report, bytes | None]] = field(default_factory=dict)  # by phase, until acked
    acked: set[str] = field(default_factory=set)  # phases done this round
    notes: dict[str, p.Scalar] = field(default_factory=dict)  # what this round's phases share (PhaseContext.notes)
    timings: dict[str, float] = field(default_factory=lambda: {"download_s": 0.0, "forward_s": 0.0, "train_s": 0.0,
                                                               "upload_s": 0.0})


def backoff_delay(attempt: int, max_delay_s: float, *, first_s: float = 0.2) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): doubling from ``first_s``, capped at
    ``max_delay_s``, with jitter (a random 50-100%) so a fleet that lost its server at once does not
    come back at once."""
    return min(max_delay_s, first_s * 2 ** min(attempt, 32)) * (0.5 + random.random() / 2)


def _reason(exc: BaseException) -> str:
    """One line on why a connection failed ("Connection refused", "server closed: 1012 ...")."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


def device_seed(round_seed: int, device_id: str) -> int:
    """The local sampling seed: differs per device and round, the same on every run (no salted hash())."""
    return (round_seed * 1_000_003 + zlib.crc32(device_id.encode())) % (1 << 31)


def hello_runtimes(backend: str) -> list[str]:
    """Hello.runtimes for a training backend: ``["onnxruntime", "torch"]`` for a device that trains
    with torch, ``["onnxruntime"]`` for one that trains from ONNX training graphs (the server then
    plans it with ONNX Runtime's much smaller runtime). "auto" looks for torch without importing it."""
    if backend == "auto":
        import importlib.util

        backend = "torch" if importlib.util.find_spec("torch") is not None else "onnxruntime"
    if backend not in ("torch", "onnxruntime"):
        raise ValueError(f"backend must be auto, torch or onnxruntime, not {backend!r}")
    return ["onnxruntime", "torch"] if backend == "torch" else ["onnxruntime"]


def declared_rows(x: np.ndarray) -> dict[str, list[int]]:
    """Per integer input column, the distinct values the local data holds (Hello.rows): the rows of
    the embedding tables it touches. Empty for other inputs."""
    if x.dtype.kind not in "iu" or x.ndim != 2 or x.shape[1] > MAX_ROW_COLUMNS:
        return {}
    return {str(c): np.unique(x[:, c]).astype(np.int64).tolist() for c in range(x.shape[1])}


class DeviceClient:
    """Runs a device against an orchestrator until the server says goodbye.

    ``data`` is the device's local data: a :class:`~edge_sdk.data.sources.DataSource` (an image
    folder, a table, batches from the app), or arrays ``x`` and ``y`` (``DeviceClient(config, x, y)``).
    ``connect`` opens the connection (``websockets.asyncio.client.connect`` by default); emulation
    passes a wrapper that injects faults.
    """

    def __init__(
        self, config: DeviceConfig, data: DataSource | np.ndarray | Any, y: np.ndarray | None = None, *,
        on_event: Callable[[str, dict], None] | None = None,
        connect: Callable[..., Any] | None = None,
    ) -> None:
        source = as_source(data, y)
        x, y = source_arrays(source)
        if len(x) != len(y) or len(x) == 0:
            raise ValueError("a device needs a non-empty local dataset with one label per sample")
        if config.trim_memory:
            # Every large buffer its own mapping, returned when freed: what a budget wants until the
            # plan says how much of it the device needs (_allocator_for_plan).
            tune_allocator()
        #: Whether freed large buffers stay in the heap for reuse until the next trim (the plan
        #: left room for it, edge_sdk.memory.may_keep_freed_buffers), or go back to the OS at once.
        self.keeps_freed_buffers = not config.trim_memory
        self._idle_trim: asyncio.TimerHandle | None = None  # the pending trim after a report (_released_after_report)
        self.config = config
        self.x, self.y = x, y
        #: What the local data is, for the hello: one sample's shape and the label count (None: regression).
        self.input_shape: tuple[int, ...] = tuple(source.input_shape)
        self.num_classes: int | None = source.num_classes
        self.rows = declared_rows(x)
        self.row_bits: dict[str, bytes] = {}
        if config.private_heat is not None:
            # Drawn once: every (re)connection repeats the same noisy report, so the server cannot
            # average fresh draws to recover the true rows.
            self.rows, self.row_bits = private_hello_fields(self.rows, config.private_heat, np.random.default_rng())
        self.on_event = on_event or (lambda kind, data: None)
        self._connect = connect or ws_connect
        # Frames this side sends are config.frame_size; it accepts any peer's up to the default bound.
        self.limits = p.Limits(max_frame_bytes=max(config.frame_size, p.DEFAULT_LIMITS.max_frame_bytes))
        self.welcome: p.Welcome | None = None
        self.reports: list[RoundReport] = []
        self._progress: _RoundProgress | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._held = None if config.bundle is None else _open_bundle(config.bundle)

    # -- connection -----------------------------------------------------------------------
    async def run(self) -> list[RoundReport]:
        """Connect (and reconnect with exponential backoff and jitter) until the server sends ``Bye``;
        ``config.max_retries`` None retries forever (a service waiting for its server)."""
        attempt = 0
        try:
            while True:
                try:
                    async with self._connect(self.config.server, ssl=self._tls(), **ws_options(self.limits)) as ws:
                        attempt = 0
                        if await self._serve(Channel(ws, DeviceSession(), self.limits)):
                            return self.reports
                except (ConnectionClosed, OSError, InvalidHandshake, asyncio.TimeoutError) as exc:
                    retries = self.config.max_retries
                    if not self.config.reconnect or (retries is not None and attempt >= retries):
                        raise ConnectionError(f"{self.config.device_id}: lost the server {self.config.server} after "
                                              f"{attempt} retries: {_reason(exc)}") from exc
                    delay = backoff_delay(attempt, self.config.max_backoff_s)
                    attempt += 1
                    self.on_event("reconnect", {"device": self.config.device_id, "server": self.config.server,
                                                "attempt": attempt, "delay_s": round(delay, 2), "error": _reason(exc)})
                    await asyncio.sleep(delay)
        finally:
            self._drop_progress()
            if self._tmp is not None:
                self._tmp.cleanup()

    def _tls(self) -> ssl.SSLContext | None:
        """The TLS settings for a ``wss://`` server (None for ``ws://``)."""
        if not self.config.server.startswith("wss://"):
            if self.config.tls_ca is not None:
                raise ValueError(f"tls_ca is set but {self.config.server!r} is not a wss:// URL")
            return None
        return client_tls(self.config.tls_ca)

    async def _serve(self, ch: Channel) -> bool:
        """One connection (:meth:`_session`). An error of this side's own (an instruction it cannot
        carry out: a phase its registry lacks, a malformed payload) is told to the server as an
        ``Error`` message before it ends the device: retrying would meet it again."""
        try:
            return await self._session(ch)
        except p.ProtocolError as exc:
            if not exc.remote:
                await send_error(ch, exc)
            raise

    async def _session(self, ch: Channel) -> bool:
        """One connection's life. True when the server said goodbye (training over)."""
        c = self.config
        resume = self._progress.round if self._progress else -1
        await send_msg(ch, p.Hello(
            device_id=c.device_id, token=make_proof(c.device_id, c.secret) if c.secret else c.token,
            budget_bytes=c.budget_bytes, cores=c.cores,
            runtimes=hello_runtimes(c.backend), num_samples=len(self.x), device_class=c.device_class,
            labels=dict(c.labels), resume_round=resume, rows=self.rows,
            ext={**c.hello_ext, **private_hello_ext(self.row_bits, c.private_heat)},
            input_shape=list(self.input_shape), num_classes=-1 if self.num_classes is None else self.num_classes,
        ))
        welcome = await self._expect(ch, p.Welcome)
        self.welcome = welcome
        self._allocator_for_plan()
        self.on_event("welcome", {"device": c.device_id, "role": welcome.role, "split": welcome.split,
                                  "chunks": [list(ch) for ch in welcome.chunks],
                                  "keeps_freed_buffers": self.keeps_freed_buffers})
        while True:
            msg = await recv_msg(ch)
            if isinstance(msg, p.Bye):
                return True
            if isinstance(msg, p.Error):
                raise DeviceRefused(f"{msg.code}: {msg.message}")
            if isinstance(msg, p.Resume):
                await self._resume_upload(ch, msg)
                instruction: p.Instruction | None = ch.session.next_instruction()
            elif isinstance(msg, p.Instruction):
                instruction = msg
            else:
                raise p.ProtocolError("unexpected", f"did not expect {msg.TYPE} while idle")
            while instruction is not None:
                try:
                    await self._carry_out(ch, instruction)
                except RoundAborted:
                    self.on_event("aborted", {"device": c.device_id, "round": instruction.round})
                    self._drop_progress()
                instruction = ch.session.next_instruction()

    async def _recv(self, ch: Channel) -> p.Message:
        """The next message that is not a follow-up instruction (those wait in the session's queue)."""
        while True:
            msg = await recv_msg(ch)
            if isinstance(msg, p.Instruction):
                continue
            if isinstance(msg, p.Error):
                raise DeviceRefused(f"{msg.code}: {msg.message}")
            if isinstance(msg, p.Bye):
                raise RoundAborted("server said goodbye")
            return msg

    async def _expect(self, ch: Channel, kind: type) -> p.Message:
        msg = await self._recv(ch)
        if not isinstance(msg, kind):
            raise p.ProtocolError("unexpected", f"expected {kind.TYPE}, got {msg.TYPE}")
        return msg

    # -- one instruction ------------------------------------------------------------------
    async def _carry_out(self, ch: Channel, ins: p.Instruction) -> None:
        """Do the instruction's phase and report; a report already made (before a reconnect) is sent again."""
        if self._progress is None or self._progress.round != ins.round:
            self._drop_progress()  # the previous round's activations and updates: freed before this round's
            self._progress = _RoundProgress(ins.round)
        prog = self._progress
        if ins.phase not in prog.reports:
            self._busy()
            result = await self.config.registry.run(_PhaseContext(self, ch, ins, prog))
            payload = None if result.tensors is None else p.encode_tensors(result.tensors)
            num_samples = len(self.x) if result.num_samples is None else result.num_samples
            report = p.Report(ins.round, ins.phase, num_samples, result.trained,
                              "" if payload is None else uuid.uuid4().hex, result.metrics)
            prog.reports[ins.phase] = (report, payload)
            if not self.keeps_freed_buffers:  # else after the upload, when idle
                self._release()
        report, payload = prog.reports[ins.phase]
        await send_msg(ch, report)
        await self._upload(ch, prog, report, payload, offset=0)

    async def _resume_upload(self, ch: Channel, msg: p.Resume) -> None:
        """The server holds the first ``msg.offset`` bytes of this round's update: send the rest."""
        prog = self._progress
        held = None if prog is None else next(
            ((r, data) for r, data in prog.reports.values() if r.transfer_id == msg.transfer_id), None)
        if held is None or held[1] is None:
            raise p.ProtocolError("unexpected", f"resume of transfer {msg.transfer_id[:64]!r}, which this device is not sending")
        report, payload = held
        if msg.offset > len(payload):
            raise p.ProtocolError("malformed", f"resume at offset {msg.offset}, past the update's {len(payload)} bytes")
        self.on_event("upload_resumed", {"device": self.config.device_id, "round": report.round, "offset": msg.offset,
                                         "total": len(payload)})
        await self._upload(ch, prog, report, payload, offset=msg.offset)

    async def _upload(self, ch: Channel, prog: _RoundProgress, report: p.Report, payload: bytes | None, *,
                      offset: int) -> None:
        """Stream the report's tensors from ``offset`` (if it has any) and wait for the server's verdict."""
        started = time.monotonic()
        try:
            if payload is not None:
                await send_payload(ch, payload, transfer_id=report.transfer_id, kind="update",
                                   meta={"round": report.round}, frame_size=self.config.frame_size, offset=offset)
            ack = await self._expect(ch, p.Ack)
        finally:
            prog.timings["upload_s"] += time.monotonic() - started
        del prog.reports[report.phase]  # acknowledged: the encoded update is not needed any more
        prog.acked.add(report.phase)
        self._released_after_report()
        welcome = self.welcome
        assert welcome is not None
        self.reports.append(RoundReport(report.round, welcome.role, report.phase, tuple(report.trained),
                                        dict(report.metrics), dict(prog.timings)))
        self.on_event("round_done", {"device": self.config.device_id, "round": report.round, "phase": report.phase,
                                     "accepted": ack.accepted, "reason": ack.reason, "role": welcome.role,
                                     "trained": list(report.trained), **prog.timings,
                                     "peak_rss_bytes": peak_rss_bytes(),
                                     "backend": report.metrics.get("backend", ""),
                                     # An ONNX Runtime device never loads torch: said from inside the process.
                                     "torch_loaded": "torch" in sys.modules})

    # -- phases ---------------------------------------------------------------------------
    async def _forward(self, ch: Channel, ins: p.Instruction, prog: _RoundProgress) -> np.ndarray:
        """The input of block ``ins.split`` for every local sample (EmbracingFL Algorithm 1): the raw
        data, or the output of the frozen chunks run one at a time, each freed before the next."""
        from edge_sdk.forward import ActivationCache, ChunkRunner  # onnxruntime loads on first use

        welcome = self.welcome
        assert welcome is not None
        if prog.activations is None or tuple(ins.chunk_ids[: len(prog.chunks_done)]) != prog.chunks_done:
            if prog.activations is not None:
                prog.activations.close()
            prog.activations, prog.chunks_done = ActivationCache.from_array(self.x), ()
        # The planned split's chunks are the welcome's ranges, in order (a bundle's chunk of a range).
        ranges = dict(zip(ins.chunk_ids, welcome.chunks)) if ins.split == welcome.split else {}
        for cid in ins.chunk_ids[len(prog.chunks_done):]:
            # One copy as bytes, the receive buffer freed before the session parses it: a chunk
            # then costs its bytes plus ONNX Runtime's two copies (profiles.accounting frozen_copies).
            data = bytes(await self._fetch(ch, ins.round, cid, prog, block_range=ranges.get(cid)))
            t = time.monotonic()
            runner = ChunkRunner(data, threads=self.config.threads)
            del data
            prog.storage = self._storage(runner, graph=bool(ins.config.get(p.TRAIN_GRAPH_KEY)))
            previous = prog.activations
            prog.activations = await asyncio.to_thread(
                previous.apply, runner, batch_size=self.config.forward_batch or welcome.batch_size,
                storage=prog.storage, directory=self._work_dir(),
            )
            runner.close()
            del runner
            self._release()
            prog.chunks_done = (*prog.chunks_done, cid)
            prog.timings["forward_s"] += time.monotonic() - t
        return prog.activations.array

    async def _model_inputs(self, ch: Channel, ins: p.Instruction, prog: _RoundProgress):
        """The input of the tail, the received state, its row-sparse tables' rows and the build options."""
        # The selection's build options (a channel slice's width) before any download: a bad
        # instruction costs nothing.
        options = self.config.registry.selection(ins.selection).model_options(ins)
        x = await self._forward(ch, ins, prog)
        state = p.decode_tensors(await self._fetch(ch, ins.round, ins.model_id, prog), self.limits)
        rows = {n: v.indices for n, v in state.items() if isinstance(v, p.RowSparse)}
        return x, state, rows, options

    def _loaded_tail(self, ins: p.Instruction, x, state, rows, options):
        """A tail model loaded with the received state (torch), and its input (runs in a worker thread)."""
        from edge_sdk.trainer import build_tail, load_tail_state, local_rows  # torch loads here

        assert self.welcome is not None
        table_rows = {n: len(r) for n, r in rows.items()}
        # A channel slice (width reduction) is built at the slice's width, never at full width, and
        # load_tail_state refuses a slice whose shapes are not that model's.
        pool = self.config.warm_tails
        model = (pool.take if pool is not None else build_tail)(self.welcome.model, ins.split, table_rows, **options)
        try:
            load_tail_state(model, ins.split, state)  # every entry of the tail: nothing of a past round stays
            if rows:
                x = local_rows(model, np.asarray(x), rows)
        except BaseException:
            self._give_back(model)
            raise
        return x, model

    def _give_back(self, model) -> None:
        if self.config.warm_tails is not None:
            self.config.warm_tails.give_back(model)

    def _train_torch(self, ins: p.Instruction, x, state, rows, options, config):
        """Load a tail and train it; a pooled tail goes back at once, its deltas copied out of it."""
        from edge_sdk.trainer import train_tail

        x, model = self._loaded_tail(ins, x, state, rows, options)
        try:
            result = train_tail(model, ins.split, x, self.y, config, state)
            if self.config.warm_tails is not None:  # the deltas are views of the tail's storage
                result = dataclasses.replace(result, deltas={n: np.array(v, copy=True) for n, v in result.deltas.items()})
            return result
        finally:
            self._give_back(model)

    def _evaluate_torch(self, ins: p.Instruction, x, state, rows, options, config):
        from edge_sdk.trainer import evaluate_tail

        x, model = self._loaded_tail(ins, x, state, rows, options)
        try:
            return evaluate_tail(model, ins.split, x, self.y, config)
        finally:
            self._give_back(model)

    async def _graph_tail(self, ch: Channel, ins: p.Instruction, prog: _RoundProgress):
        """The input of the tail, the received state and the tail's training graph in ONNX Runtime
        (the instruction names a graph: the plan chose the ONNX Runtime backend; torch never loads)."""
        from edge_sdk.ort_trainer import OrtTail, TrainGraph

        x = await self._forward(ch, ins, prog)
        graph = TrainGraph.from_bytes(await self._fetch(ch, ins.round, str(ins.config[p.TRAIN_GRAPH_KEY]), prog))
        if graph.model != self.welcome.model or graph.split != ins.split:
            raise p.ProtocolError("malformed", f"training graph of {graph.model} split {graph.split}, instruction "
                                               f"for {self.welcome.model} split {ins.split}")
        state = p.decode_tensors(await self._fetch(ch, ins.round, ins.model_id, prog), self.limits)
        return x, state, OrtTail(graph, threads=self.config.threads)

    def _train_config(self, ins: p.Instruction, *, evaluating: bool = False):
        from edge_sdk.training import TrainConfig

        welcome = self.welcome
        assert welcome is not None
        # Samples of the loss a train report carries, before and after training: one batch, two
        # forward passes, a fraction of the training step's cost (a pass over 512 samples cost more
        # than 5 local steps of 32 train: a device's round time nearly doubled). The server averages
        # the reports, so its round loss still covers many batches. An evaluate phase scores 512.
        # A strategy may ask for another count (config "eval_samples").
        default = 512 if evaluating else welcome.batch_size
        return TrainConfig(
            local_steps=ins.local_steps, batch_size=welcome.batch_size, lr=ins.lr if ins.lr > 0 else 1e-3,
            momentum=float(welcome.config.get("momentum", 0.9)), weight_decay=float(welcome.config.get("weight_decay", 1e-4)),
            seed=device_seed(int(ins.config.get("seed", 0)), self.config.device_id), threads=self.config.threads,
            prox_mu=float(ins.config.get("prox_mu", 0.0)),
            eval_samples=max(1, int(ins.config.get("eval_samples", default))),
            loss_after=ins.config.get("loss_after", True) is not False,
        )

    async def _trained(self, ch: Channel, ins: p.Instruction, prog: _RoundProgress) -> TrainedUpdate:
        """This round's update for the instruction's model payload: trained once, then reused."""
        done = prog.trained.get(ins.model_id)
        if done is not None:
            return done
        rows: dict[str, np.ndarray] = {}
        if not self.config.registry.selection(ins.selection).trains_graph and (
                ins.config.get(p.TRAIN_GRAPH_KEY) or "torch" not in hello_runtimes(self.config.backend)):
            # No training graph trains this cut (a width slice): torch only. The server never sends
            # one to a device without torch (it skips the device instead).
            raise p.ProtocolError("unexpected", f"a {ins.selection} selection trains with torch, "
                                                "which this device does not use")
        if ins.config.get(p.TRAIN_GRAPH_KEY):
            from edge_sdk.ort_trainer import train_tail_ort

            x, state, tail = await self._graph_tail(ch, ins, prog)
            t = time.monotonic()
            result = await asyncio.to_thread(train_tail_ort, tail, state, x, self.y, self._train_config(ins))
            backend = "onnxruntime"
        else:
            x, state, rows, options = await self._model_inputs(ch, ins, prog)
            t = time.monotonic()
            result = await asyncio.to_thread(self._train_torch, ins, x, state, rows, options, self._train_config(ins))
            backend = "torch"
        prog.timings["train_s"] += time.monotonic() - t
        deltas: Tensors = dict(result.deltas)
        for name, idx in rows.items():
            deltas[name] = p.RowSparse(idx, deltas[name], state[name].num_rows)
        losses = {"loss_before": result.loss_before, "loss_after": result.loss_after, "loss_steps": result.loss_steps}
        done = TrainedUpdate(deltas, result.num_samples, (ins.split, self.welcome.num_blocks),
                             {**{k: v for k, v in losses.items() if math.isfinite(v)},  # a loss not scored is left out
                              "steps": result.steps, "backend": backend})
        prog.trained[ins.model_id] = done
        return done

    async def _evaluate(self, ch: Channel, ins: p.Instruction, prog: _RoundProgress) -> dict[str, p.Scalar]:
        """Loss (and accuracy) of the received model on the local data, without training."""
        if ins.config.get(p.TRAIN_GRAPH_KEY):
            from edge_sdk.ort_trainer import evaluate_tail_ort

            x, state, tail = await self._graph_tail(ch, ins, prog)
            t = time.monotonic()
            metrics = await asyncio.to_thread(evaluate_tail_ort, tail, state, x, self.y,
                                            self._train_config(ins, evaluating=True))
        else:
            x, state, rows, options = await self._model_inputs(ch, ins, prog)
            t = time.monotonic()
            metrics = await asyncio.to_thread(self._evaluate_torch, ins, x, state, rows, options,
                                              self._train_config(ins, evaluating=True))
        prog.timings["eval_s"] = prog.timings.get("eval_s", 0.0) + time.monotonic() - t
        return dict(metrics)

    # -- downloads ------------------------------------------------------------------------
    async def _fetch(self, ch: Channel, round: int, payload_id: str, prog: _RoundProgress, *,
                     block_range: tuple[int, int] | None = None) -> memoryview:
        """Download one payload; a download cut by a dropped connection resumes from its offset.
        A payload the device's bundle holds with the same bytes is not downloaded."""
        t = time.monotonic()
        incoming = prog.partial.get(payload_id)
        welcome = self.welcome
        held = None
        if self._held is not None and incoming is None and welcome is not None \
                and self._held.serves(welcome.model, welcome.num_blocks):
            held = self._held.find(payload_id, block_range)
        if held is not None:
            data = await self._fetch_held(ch, round, payload_id, held)
            if data is not None:
                return data
        while True:
            await send_msg(ch, p.Fetch(round, payload_id, incoming.offset if incoming else 0))
            begin = await self._recv(ch)
            if isinstance(begin, p.Ack) and not begin.accepted:
                raise RoundAborted(begin.reason)
            if not isinstance(begin, p.TransferBegin):
                raise p.ProtocolError("unexpected", f"expected a transfer, got {begin.TYPE}")
            if incoming is None:
                incoming = p.IncomingTransfer(begin, self.limits)
                break
            if incoming.begin.sha256 == begin.sha256 and begin.offset == incoming.offset:
                incoming.resume(begin)
                self.on_event("download_resumed", {"device": self.config.device_id, "round": round,
                                                   "payload": payload_id, "offset": begin.offset,
                                                   "total": begin.total_size})
                break
            # The payload changed since the partial download: drop it and start again from 0.
            await self._drain(ch, begin)
            incoming = None
        prog.partial[payload_id] = incoming
        # Verified, and no second copy of a payload that may be most of the budget. The device hashes
        # each frame as it lands (hash_in_feed): no worker thread, whose stack and arena count too.
        data = await recv_payload(ch, incoming.begin, self.limits, incoming=incoming)
        del prog.partial[payload_id]
        prog.timings["download_s"] += time.monotonic() - t
        return data

    async def _fetch_held(self, ch: Channel, round: int, payload_id: str, held: Any) -> memoryview | None:
        """The bundle's bytes of ``payload_id`` if the server's have the same size and sha256: asked
        as a fetch from the held size on, which costs no payload byte when they match. None (and
        downloaded from then on) when the server's payload changed."""
        assert self._held is not None
        self._held.forget(payload_id)
        await send_msg(ch, p.Fetch(round, payload_id, held.size))
        begin = await self._recv(ch)
        if isinstance(begin, p.Ack) and not begin.accepted:
            raise RoundAborted(begin.reason)
        if not isinstance(begin, p.TransferBegin):
            raise p.ProtocolError("unexpected", f"expected a transfer, got {begin.TYPE}")
        if begin.offset == held.size and self._held.confirm(payload_id, held, begin.total_size, begin.sha256):
            self.on_event("from_bundle", {"device": self.config.device_id, "round": round, "payload": payload_id,
                                          "kind": held.kind, "bytes": held.size})
            return memoryview(await asyncio.to_thread(self._held.read, held))
        await self._drain(ch, begin)
        return None

    async def _drain(self, ch: Channel, begin: p.TransferBegin) -> None:
        """Read and discard the frames of a transfer this device no longer wants."""
        received = begin.offset
        while received < begin.total_size:
            frame = await recv_msg(ch)
            if not isinstance(frame, p.TransferFrame):
                raise p.ProtocolError("unexpected", f"expected a frame, got {frame.TYPE}")
            received += len(frame.data)
        if not begin.sha256:  # the digest follows the last frame
            end = await recv_msg(ch)
            if not isinstance(end, p.TransferEnd):
                raise p.ProtocolError("unexpected", f"expected transfer_end, got {end.TYPE}")

    # -- resources ------------------------------------------------------------------------
    def _storage(self, runner, *, graph: bool = False) -> str:
        """Keep a chunk's activations in memory only if they fit beside the plan's footprint.

        The planner counts one batch of cached activations (the rest on disk); the budget left
        over the planned footprint decides whether the whole cache may stay in memory. A tail
        trained from a training graph (``graph``) reads a disk cache a batch at a time without
        keeping its pages resident (edge_sdk.forward.take_rows), so there the cache goes to disk.
        """
        if self.config.storage != "auto":
            return self.config.storage
        if graph or any(d is None for d in runner.output_shape):
            return "disk"
        need = len(self.x) * math.prod(runner.output_shape) * np.dtype(runner.output_dtype).itemsize
        return "memory" if need <= self.config.budget_bytes - self._planned_footprint() else "disk"

    def _work_dir(self) -> Path:
        if self.config.work_dir is not None:
            self.config.work_dir.mkdir(parents=True, exist_ok=True)
            return self.config.work_dir
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"edgetrain-{self.config.device_id}-")
        return Path(self._tmp.name)

    def _planned_footprint(self) -> int:
        """The plan's peak bytes (runtime included); the whole budget before a plan or without one."""
        given = self.welcome.config.get("footprint_bytes") if self.welcome else None
        return self.config.budget_bytes if given is None else int(given)

    def _allocator_for_plan(self) -> None:
        """Reuse freed buffers where the budget has room over the planned footprint: page faults on
        every large tensor of every step cost a device process a fifth to two fifths of its
        training CPU (edge_sdk.memory). A plan close to the budget keeps each buffer returned at once."""
        if not self.config.trim_memory or self.welcome is None:
            return
        keep = may_keep_freed_buffers(self.config.budget_bytes, self._planned_footprint())
        self.keeps_freed_buffers = keep_freed_buffers(keep) and keep

    def _release(self) -> None:
        if self.config.trim_memory:
            release_memory()

    def _released_after_report(self) -> None:
        """A report is done: trim now, or, keeping freed buffers, once idle for ``idle_trim_s``."""
        if not self.config.trim_memory:
            return
        if not self.keeps_freed_buffers:
            self._release()
            return
        if self._idle_trim is not None:
            self._idle_trim.cancel()
        self._idle_trim = asyncio.get_running_loop().call_later(self.config.idle_trim_s, self._trim_when_idle)

    def _trim_when_idle(self) -> None:
        self._idle_trim = None
        self._release()

    def _busy(self) -> None:
        """A phase starts: the buffers are about to be used again, no trim under it."""
        if self._idle_trim is not None:
            self._idle_trim.cancel()
            self._idle_trim = None

    def _drop_progress(self) -> None:
        prog, self._progress = self._progress, None
        if prog is not None and prog.activations is not None:
            with contextlib.suppress(Exception):
                prog.activations.close()


def _open_bundle(path: Path):
    """The payloads of the device's bundle (checked as it opens: a damaged one is refused here)."""
    from edge_sdk.bundle import HeldPayloads

    return HeldPayloads.open(path)


class _PhaseContext:
    """The device as a phase handler sees it (edge_sdk.phases.PhaseContext): one instruction on one
    connection, with the round's progress, so each step is done once per round."""

    def __init__(self, client: DeviceClient, ch: Channel, ins: p.Instruction, prog: _RoundProgress) -> None:
        self._client, self._ch, self._prog = client, ch, prog
        self.instruction = ins

    @property
    def device_id(self) -> str:
        return self._client.config.device_id

    @property
    def x(self) -> np.ndarray:
        return self._client.x

    @property
    def y(self) -> np.ndarray:
        return self._client.y

    @property
    def notes(self) -> dict[str, p.Scalar]:
        return self._prog.notes

    async def trained(self) -> TrainedUpdate:
        return await self._client._trained(self._ch, self.instruction, self._prog)

    async def evaluate(self) -> dict[str, p.Scalar]:
        return await self._client._evaluate(self._ch, self.instruction, self._prog)

    async def fetch_tensors(self, payload_id: str) -> Tensors:
        data = await self._client._fetch(self._ch, self.instruction.round, payload_id, self._prog)
        return p.decode_tensors(data, self._client.limits)

    def usage(self) -> dict[str, p.Scalar]:
        return {**{k: round(v, 6) for k, v in self._prog.timings.items()}, "peak_rss_bytes": peak_rss_bytes(),
                "storage": self._prog.storage}

    def event(self, kind: str, data: Mapping[str, object]) -> None:
        self._client.on_event(kind, dict(data))
