"""The device: connect, say hello, follow the plan, train its share each round, reconnect on drops.

One round on a device (DESIGN.md "One round, as data flows", EmbracingFL Algorithms 1-2):
fetch frozen chunk 1, run it over the local data, cache the activations, free the chunk, fetch
chunk 2 ... then fetch the trainable tail, train tau local steps on the cached activations and
send the parameter deltas. A strong device has no chunks and trains the whole model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import resource
import ssl
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from edge_sdk import protocol as p
from edge_sdk.memory import release_memory, tune_allocator
from edge_sdk.transport import client_tls, recv_msg, recv_payload, send_msg, send_payload, ws_options

log = logging.getLogger("edgetrain.device")


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
    token: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    storage: str = "auto"  # where cached activations live: memory, disk, or auto (disk for weak devices)
    work_dir: Path | None = None
    threads: int = 1
    forward_batch: int = 0  # batch of the multi-step forward pass; 0: the planned batch size
    reconnect: bool = True
    max_retries: int = 30
    max_backoff_s: float = 5.0
    frame_size: int = p.DEFAULT_FRAME_SIZE
    tls_ca: str | None = None  # for a wss:// server: trust only this PEM file (private CA, self-signed)
    # Fault injection for emulation and tests: vanish mid-round (the process exits after its
    # downloads) in the listed rounds or with a probability per round; lose the connection half-way
    # through the round's first download or through the update's upload in the listed rounds (the
    # link drops, the device reconnects and the transfer resumes); add network delay.
    drop_rounds: frozenset[int] = frozenset()
    drop_prob: float = 0.0
    drop_seed: int = 0
    cut_download_rounds: frozenset[int] = frozenset()
    cut_upload_rounds: frozenset[int] = frozenset()
    delay_s: float = 0.0


#: Exit status of a device process that vanished on purpose (fault injection).
DROP_EXIT = 75


@dataclass
class RoundReport:
    round: int
    role: str
    trained: tuple[int, int]
    loss_before: float
    loss_after: float
    timings: dict[str, float]


@dataclass
class _RoundProgress:
    """What survives a reconnect within one round: the activations computed so far, partial
    downloads, and the update once trained (until the server acknowledges it)."""

    round: int
    chunks_done: int = 0
    activations: object | None = None  # ActivationCache
    partial: dict[tuple[str, int], p.IncomingTransfer] = field(default_factory=dict)
    storage: str = "memory"  # where the last chunk's activations went
    update: p.Update | None = None  # sent before its payload
    payload: bytes | None = None  # encode_tensors of the update's deltas
    download_cut: bool = False  # the fault injections have cut this round's transfers
    upload_cut: bool = False
    timings: dict[str, float] = field(default_factory=lambda: {"download_s": 0.0, "forward_s": 0.0, "train_s": 0.0, "upload_s": 0.0})


def device_seed(round_seed: int, device_id: str) -> int:
    """The local sampling seed: differs per device and round, the same on every run (no salted hash())."""
    return (round_seed * 1_000_003 + zlib.crc32(device_id.encode())) % (1 << 31)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far.

    Linux's VmHWM belongs to the process's own address space. ``ru_maxrss`` is not used where
    VmHWM exists: it survives fork and exec, so a device started by a large parent would report
    the parent's peak as its own.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class DeviceClient:
    """Runs a device against an orchestrator until the server says goodbye."""

    def __init__(
        self, config: DeviceConfig, x: np.ndarray, y: np.ndarray, *,
        on_event: Callable[[str, dict], None] | None = None,
    ) -> None:
        if len(x) != len(y) or len(x) == 0:
            raise ValueError("a device needs a non-empty local dataset with one label per sample")
        tune_allocator()
        self.config = config
        self.x, self.y = x, y
        self.on_event = on_event or (lambda kind, data: None)
        # Frames this side sends are config.frame_size; it accepts any peer's up to the default bound.
        self.limits = p.Limits(max_frame_bytes=max(config.frame_size, p.DEFAULT_LIMITS.max_frame_bytes))
        self.welcome: p.Welcome | None = None
        self.reports: list[RoundReport] = []
        self._progress: _RoundProgress | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    # -- connection -----------------------------------------------------------------------
    async def run(self) -> list[RoundReport]:
        """Connect (and reconnect with exponential backoff) until the server sends ``Bye``."""
        attempt = 0
        try:
            while True:
                try:
                    async with connect(self.config.server, ssl=self._tls(), **ws_options(self.limits)) as ws:
                        attempt = 0
                        if await self._session(ws):
                            return self.reports
                except (ConnectionClosed, OSError, InvalidHandshake, asyncio.TimeoutError) as exc:
                    if not self.config.reconnect or attempt >= self.config.max_retries:
                        raise ConnectionError(f"{self.config.device_id}: lost the server after {attempt} retries: {exc}") from exc
                    delay = min(self.config.max_backoff_s, 0.2 * 2**attempt) * (0.5 + random.random() / 2)
                    attempt += 1
                    self.on_event("reconnect", {"device": self.config.device_id, "attempt": attempt, "delay_s": delay})
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

    async def _session(self, ws: ClientConnection) -> bool:
        """One connection's life. True when the server said goodbye (training over)."""
        c = self.config
        resume = self._progress.round if self._progress else -1
        await send_msg(ws, p.Hello(
            device_id=c.device_id, token=c.token, budget_bytes=c.budget_bytes, cores=c.cores,
            runtimes=["onnxruntime", "torch"], num_samples=len(self.x), device_class=c.device_class,
            labels=dict(c.labels), resume_round=resume,
        ))
        welcome = await self._expect(ws, p.Welcome)
        self.welcome = welcome
        self.on_event("welcome", {"device": c.device_id, "role": welcome.role, "split": welcome.split,
                                  "chunks": [list(ch) for ch in welcome.chunks]})
        while True:
            msg = await recv_msg(ws, self.limits)
            if isinstance(msg, p.Bye):
                return True
            if isinstance(msg, (p.Task, p.Resume)):
                try:
                    if isinstance(msg, p.Task):
                        await self._round(ws, msg)
                    else:
                        await self._resume_upload(ws, msg)
                except RoundAborted:
                    self.on_event("aborted", {"device": c.device_id, "round": self._progress.round if self._progress else -1})
                    self._drop_progress()
            elif isinstance(msg, p.Error):
                raise DeviceRefused(f"{msg.code}: {msg.message}")
            else:
                raise p.ProtocolError("unexpected", f"did not expect {msg.TYPE} while idle")

    async def _expect(self, ws: ClientConnection, kind: type) -> p.Message:
        msg = await recv_msg(ws, self.limits)
        if isinstance(msg, p.Error):
            raise DeviceRefused(f"{msg.code}: {msg.message}")
        if isinstance(msg, p.Bye):
            raise RoundAborted("server said goodbye")
        if not isinstance(msg, kind):
            raise p.ProtocolError("unexpected", f"expected {kind.TYPE}, got {msg.TYPE}")
        return msg

    # -- one round ------------------------------------------------------------------------
    async def _round(self, ws: ClientConnection, task: p.Task) -> None:
        welcome = self.welcome
        assert welcome is not None
        if self._progress is None or self._progress.round != task.round:
            self._drop_progress()
            self._progress = _RoundProgress(task.round)
        prog = self._progress
        if prog.update is None:
            await self._compute_update(ws, task, prog, welcome)
        # Else trained already (the round's task again after a reconnect): only the upload is left.
        assert prog.update is not None and prog.payload is not None
        t = time.monotonic()
        if self.config.delay_s > 0:
            await asyncio.sleep(self.config.delay_s)
        await send_msg(ws, prog.update)
        await self._upload(ws, prog, offset=0, started=t)

    async def _compute_update(self, ws: ClientConnection, task: p.Task, prog: _RoundProgress,
                              welcome: p.Welcome) -> None:
        """Download, run forward and train: the update and its encoded deltas, kept in ``prog``."""
        from edge_sdk.forward import ActivationCache, ChunkRunner  # onnxruntime loads on first use

        if prog.activations is None:
            prog.activations = ActivationCache.from_array(self.x)
        # Algorithm 1: receive chunk i, feed the local data forward, keep the output, discard chunk i.
        for i in range(prog.chunks_done, len(task.chunk_ids)):
            # One copy as bytes, the receive buffer freed before the session parses it: a chunk
            # then costs its bytes plus ONNX Runtime's two copies (profiles.accounting frozen_copies).
            data = bytes(await self._fetch(ws, task.round, "chunk", i, prog))
            t = time.monotonic()
            runner = ChunkRunner(data, threads=self.config.threads)
            del data
            prog.storage = self._storage(runner)
            previous = prog.activations
            prog.activations = await asyncio.to_thread(
                previous.apply, runner, batch_size=self.config.forward_batch or welcome.batch_size,
                storage=self._storage(runner), directory=self._work_dir(),
            )
            runner.close()
            del runner
            release_memory()
            prog.chunks_done = i + 1
            prog.timings["forward_s"] += time.monotonic() - t
        tail = p.decode_tensors(await self._fetch(ws, task.round, "tail", 0, prog), self.limits)
        if self._drops(task.round):
            self.on_event("dropped", {"device": self.config.device_id, "round": task.round})
            os._exit(DROP_EXIT)

        t = time.monotonic()
        result = await asyncio.to_thread(self._train, welcome, task, tail, prog.activations.array)
        prog.timings["train_s"] += time.monotonic() - t
        del tail
        metrics = {**{k: round(v, 6) for k, v in prog.timings.items()}, "peak_rss_bytes": peak_rss_bytes(),
                   "storage": prog.storage, "steps": result.steps}
        prog.update = p.Update(task.round, result.num_samples, (welcome.split, welcome.num_blocks), result.loss_before,
                               result.loss_after, uuid.uuid4().hex, metrics)
        prog.payload = p.encode_tensors(result.deltas)
        del result
        release_memory()

    async def _resume_upload(self, ws: ClientConnection, msg: p.Resume) -> None:
        """The server holds the first ``msg.offset`` bytes of this round's update: send the rest."""
        prog = self._progress
        if prog is None or prog.update is None or prog.payload is None or prog.update.transfer_id != msg.transfer_id:
            raise p.ProtocolError("unexpected", f"resume of transfer {msg.transfer_id[:64]!r}, which this device is not sending")
        if msg.offset > len(prog.payload):
            raise p.ProtocolError("malformed", f"resume at offset {msg.offset}, past the update's {len(prog.payload)} bytes")
        self.on_event("upload_resumed", {"device": self.config.device_id, "round": prog.round, "offset": msg.offset,
                                         "total": len(prog.payload)})
        await self._upload(ws, prog, offset=msg.offset, started=time.monotonic())

    async def _upload(self, ws: ClientConnection, prog: _RoundProgress, *, offset: int, started: float) -> None:
        """Stream the update's deltas from ``offset``, wait for the server's verdict, close the round."""
        update, welcome = prog.update, self.welcome
        assert update is not None and prog.payload is not None and welcome is not None
        try:
            if prog.round in self.config.cut_upload_rounds and not prog.upload_cut:
                prog.upload_cut = True
                await self._send_half_and_cut(ws, prog)
            else:
                await send_payload(ws, prog.payload, transfer_id=update.transfer_id, kind="update",
                                   meta={"round": prog.round}, frame_size=self.config.frame_size, offset=offset)
            ack = await self._expect(ws, p.Ack)
        finally:
            prog.timings["upload_s"] += time.monotonic() - started
        release_memory()
        report = RoundReport(prog.round, welcome.role, update.trained, update.loss_before, update.loss_after,
                             dict(prog.timings))
        self.reports.append(report)
        self.on_event("round_done", {"device": self.config.device_id, "round": prog.round, "accepted": ack.accepted,
                                     "reason": ack.reason, "role": welcome.role, "trained": list(update.trained),
                                     **prog.timings, "peak_rss_bytes": peak_rss_bytes()})
        self._drop_progress()

    async def _receive_half_and_cut(self, ws: ClientConnection, incoming: p.IncomingTransfer) -> None:
        """Fault injection: take a download's frames up to half its size, then drop the link. What
        is held stays in the round's progress, and the download resumes from it after the reconnect."""
        while incoming.offset < incoming.total_size // 2:
            frame = await recv_msg(ws, self.limits)
            if not isinstance(frame, p.TransferFrame):
                raise p.ProtocolError("unexpected", f"expected a frame, got {frame.TYPE}")
            incoming.feed(frame)
        self.on_event("download_cut", {"device": self.config.device_id, "round": self._progress.round if self._progress
                                       else -1, "kind": incoming.kind, "held": incoming.offset,
                                       "total": incoming.total_size})
        await self._drop_link(ws)

    async def _send_half_and_cut(self, ws: ClientConnection, prog: _RoundProgress) -> None:
        """Fault injection: send the update's frames up to half its size, then drop the link. The
        server keeps what reached it, and asks for the rest after the reconnect."""
        assert prog.update is not None and prog.payload is not None
        half, sent = len(prog.payload) // 2, 0
        for msg in p.frames(prog.payload, transfer_id=prog.update.transfer_id, kind="update",
                            meta={"round": prog.round}, frame_size=self.config.frame_size):
            if isinstance(msg, p.TransferFrame):
                if msg.offset >= half:
                    break
                sent = msg.offset + len(msg.data)
            await send_msg(ws, msg)
        self.on_event("upload_cut", {"device": self.config.device_id, "round": prog.round, "sent": sent,
                                     "total": len(prog.payload)})
        await self._drop_link(ws)

    @staticmethod
    async def _drop_link(ws: ClientConnection) -> NoReturn:
        """Reset the connection as a failing network would (no closing handshake; bytes in flight may
        be lost) and raise what any later use of it would."""
        ws.transport.abort()
        await ws.wait_closed()
        raise ws.protocol.close_exc

    def _train(self, welcome: p.Welcome, task: p.Task, tail: dict[str, np.ndarray], x: np.ndarray):
        from edge_sdk.trainer import TrainConfig, build_tail, load_tail_state, train_tail  # torch loads here

        model = build_tail(welcome.model, welcome.split)
        load_tail_state(model, welcome.split, tail)
        cfg = TrainConfig(
            local_steps=task.local_steps, batch_size=welcome.batch_size, lr=task.lr,
            momentum=float(welcome.config.get("momentum", 0.9)), weight_decay=float(welcome.config.get("weight_decay", 1e-4)),
            seed=device_seed(int(task.config.get("seed", 0)), self.config.device_id), threads=self.config.threads,
        )
        return train_tail(model, welcome.split, x, self.y, cfg, initial=tail)

    async def _fetch(self, ws: ClientConnection, round: int, kind: str, index: int, prog: _RoundProgress) -> memoryview:
        """Download one payload; a download cut by a dropped connection resumes from its offset."""
        t = time.monotonic()
        key = (kind, index)
        incoming = prog.partial.get(key)
        while True:
            await send_msg(ws, p.Fetch(round, kind, index, incoming.offset if incoming else 0))
            begin = await recv_msg(ws, self.limits)
            if isinstance(begin, p.Ack) and not begin.accepted:
                raise RoundAborted(begin.reason)
            if not isinstance(begin, p.TransferBegin):
                raise p.ProtocolError("unexpected", f"expected a transfer, got {begin.TYPE}")
            if incoming is None:
                incoming = p.IncomingTransfer(begin, self.limits)
                break
            if incoming.begin.sha256 == begin.sha256 and begin.offset == incoming.offset:
                incoming.resume(begin)
                self.on_event("download_resumed", {"device": self.config.device_id, "round": round, "kind": kind,
                                                   "index": index, "offset": begin.offset, "total": begin.total_size})
                break
            # The payload changed since the partial download: drop it and start again from 0.
            await self._drain(ws, begin)
            incoming = None
        prog.partial[key] = incoming
        if round in self.config.cut_download_rounds and not prog.download_cut:
            prog.download_cut = True
            await self._receive_half_and_cut(ws, incoming)
        # Verified, and no second copy of a payload that may be most of the budget. The device hashes
        # each frame as it lands (hash_in_feed): no worker thread, whose stack and arena count too.
        data = await recv_payload(ws, incoming.begin, self.limits, incoming=incoming)
        del prog.partial[key]
        prog.timings["download_s"] += time.monotonic() - t
        return data

    def _drops(self, round: int) -> bool:
        c = self.config
        if round in c.drop_rounds:
            return True
        if c.drop_prob <= 0:
            return False
        return bool(np.random.default_rng([c.drop_seed, zlib.crc32(c.device_id.encode()), round]).random() < c.drop_prob)

    async def _drain(self, ws: ClientConnection, begin: p.TransferBegin) -> None:
        """Read and discard the frames of a transfer this device no longer wants."""
        received = begin.offset
        while received < begin.total_size:
            frame = await recv_msg(ws, self.limits)
            if not isinstance(frame, p.TransferFrame):
                raise p.ProtocolError("unexpected", f"expected a frame, got {frame.TYPE}")
            received += len(frame.data)
        if not begin.sha256:  # the digest follows the last frame
            end = await recv_msg(ws, self.limits)
            if not isinstance(end, p.TransferEnd):
                raise p.ProtocolError("unexpected", f"expected transfer_end, got {end.TYPE}")

    # -- resources ------------------------------------------------------------------------
    def _storage(self, runner) -> str:
        """Keep a chunk's activations in memory only if they fit beside the plan's footprint.

        The planner counts one batch of cached activations (the rest on disk); the budget left
        over the planned footprint decides whether the whole cache may stay in memory.
        """
        if self.config.storage != "auto":
            return self.config.storage
        if any(d is None for d in runner.output_shape):
            return "disk"
        need = len(self.x) * math.prod(runner.output_shape) * np.dtype(runner.output_dtype).itemsize
        footprint = int(self.welcome.config.get("footprint_bytes", self.config.budget_bytes)) if self.welcome else self.config.budget_bytes
        return "memory" if need <= self.config.budget_bytes - footprint else "disk"

    def _work_dir(self) -> Path:
        if self.config.work_dir is not None:
            self.config.work_dir.mkdir(parents=True, exist_ok=True)
            return self.config.work_dir
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"edgetrain-{self.config.device_id}-")
        return Path(self._tmp.name)

    def _drop_progress(self) -> None:
        prog, self._progress = self._progress, None
        if prog is not None and prog.activations is not None:
            with contextlib.suppress(Exception):
                prog.activations.close()
