"""The device's connection: connect, say hello, take the instructions, upload reports, reconnect on drops.

:class:`DeviceClient` runs a device against an orchestrator until the server says goodbye. It owns
the connection: the session (:class:`edge_sdk.protocol.session.DeviceSession`), the hello, the
message loop, uploads and their resume, and reconnecting with capped, jittered backoff. What an
instruction asks for is :class:`edge_sdk.roundwork.RoundWork`'s (the forward pass, the phases, the
round's progress), which trains with the instruction's backend (:mod:`edge_sdk.backends`), downloads
through :class:`edge_sdk.downloads.Downloads` and keeps to the budget with
:class:`edge_sdk.memory_policy.MemoryPolicy`. Each of those imports only modules below it. The client
carries no test hooks: emulation wraps its connection from outside (``connect``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from edge_sdk import protocol as p
from edge_sdk.backends import backend_class, measure_probe
from edge_sdk.credentials import make_proof
from edge_sdk.data.sources import DataSource, as_source, source_arrays
from edge_sdk.downloads import DeviceRefused, Downloads, RoundAborted, expect
from edge_sdk.memory import peak_rss_bytes
from edge_sdk.memory_policy import MemoryPolicy
from edge_sdk.payload_store import PayloadStore
from edge_sdk.privacy import private_hello_ext, private_hello_fields
from edge_sdk.protocol.session import DeviceSession
from edge_sdk.roundwork import DeviceWork, RoundProgress, RoundWork, device_seed
from edge_sdk.settings import FOREVER, DeviceSettings
from edge_sdk.transport import Channel, client_tls, recv_msg, send_error, send_msg, send_payload, ws_options

__all__ = ["DeviceClient", "DeviceRefused", "DeviceSettings", "RoundAborted", "RoundReport", "backoff_delay",
           "declared_rows", "device_seed"]

log = logging.getLogger("edgetrain.device")

#: Integer inputs with at most this many columns are declared per column in the hello (their rows).
MAX_ROW_COLUMNS = 16


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


def backoff_delay(attempt: int, max_delay_s: float, *, first_s: float = 0.2) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): doubling from ``first_s``, capped at
    ``max_delay_s``, with jitter (a random 50-100%) so a fleet that lost its server at once does not
    come back at once."""
    return min(max_delay_s, first_s * 2 ** min(attempt, 32)) * (0.5 + random.random() / 2)


def _reason(exc: BaseException) -> str:
    """One line on why a connection failed ("Connection refused", "server closed: 1012 ...")."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


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
    ``connect`` opens the connection (``websockets``' by default; emulation's injects faults).
    """

    def __init__(self, config: DeviceSettings, data: DataSource | np.ndarray | Any, y: np.ndarray | None = None, *,
                 on_event: Callable[[str, dict], None] | None = None, connect: Callable[..., Any] | None = None) -> None:
        source = as_source(data, y)
        x, y = source_arrays(source)
        if len(x) != len(y) or len(x) == 0:
            raise ValueError("a device needs a non-empty local dataset with one label per sample")
        self.config = config = config.resolved()  # the budget and cores this machine offers, if not given
        self.x, self.y = x, y
        #: What the local data is, for the hello: one sample's shape and the label count (None: regression).
        self.input_shape: tuple[int, ...] = tuple(source.input_shape)
        self.num_classes: int | None = source.num_classes
        self.rows = declared_rows(x)
        self.row_bits: dict[str, bytes] = {}
        if config.private_heat is not None:
            # Drawn once: every connection repeats one noisy report (no fresh draws to average).
            self.rows, self.row_bits = private_hello_fields(self.rows, config.private_heat, np.random.default_rng())
        self.on_event = on_event or (lambda kind, data: None)
        self._connect = connect or ws_connect
        # Frames this side sends are config.frame_size; it accepts any peer's up to the default bound.
        self.limits = p.Limits(max_frame_bytes=max(config.frame_size, p.DEFAULT_LIMITS.max_frame_bytes))
        self.welcome: p.Welcome | None = None
        self.reports: list[RoundReport] = []
        self.backend = backend_class(config.backend)  # the device's own; its runtimes go in the hello
        self.memory = MemoryPolicy(device_id=config.device_id, budget_bytes=config.budget_bytes, storage=config.storage,
                                   trim_memory=config.trim_memory, idle_trim_s=config.idle_trim_s,
                                   work_dir=config.work_dir)
        store = None if config.payload_cache is None else PayloadStore(config.payload_cache, config.payload_cache_bytes)
        self.downloads = Downloads(config.device_id, self.limits, self.on_event, config.bundle, store)
        self.work = RoundWork(
            DeviceWork(config.device_id, x, y, config.registry, self.backend, config.threads, config.forward_batch,
                       config.warm_tails, config.secret or "", config.secure_min_survivors),
            limits=self.limits, downloads=self.downloads, memory=self.memory, on_event=self.on_event)

    async def run(self) -> list[RoundReport]:
        """Connect (and reconnect with exponential backoff and jitter) until the server sends ``Bye``;
        ``config.reconnect_retries`` -1 retries forever (a service waiting for its server)."""
        attempt = 0
        try:
            while True:
                try:
                    async with self._connect(self.config.server, ssl=self._tls(), additional_headers=self._authorization(),
                                             **ws_options(self.limits)) as ws:
                        attempt = 0
                        if await self._serve(Channel(ws, DeviceSession(), self.limits)):
                            return self.reports
                except (ConnectionClosed, OSError, InvalidHandshake, asyncio.TimeoutError) as exc:
                    if isinstance(exc, InvalidStatus) and exc.response.status_code == 401:  # the door's refusal
                        raise DeviceRefused(f"unauthorized: {exc.response.body.decode(errors='replace').strip()}") from exc
                    await self._before_retry(attempt, exc)
                    attempt += 1
        finally:
            self.work.drop()
            self.memory.close()

    async def _before_retry(self, attempt: int, exc: BaseException) -> None:
        """Wait before reconnect ``attempt``; ConnectionError once the retries are spent."""
        c = self.config
        if not c.reconnect or (c.reconnect_retries != FOREVER and attempt >= c.reconnect_retries):
            raise ConnectionError(f"{c.device_id}: lost the server {c.server} after {attempt} retries: "
                                  f"{_reason(exc)}") from exc
        delay = backoff_delay(attempt, c.reconnect_max_delay)
        self.on_event("reconnect", {"device": c.device_id, "server": c.server, "attempt": attempt + 1,
                                    "delay_s": round(delay, 2), "error": _reason(exc)})
        await asyncio.sleep(delay)

    def _authorization(self) -> dict[str, str]:
        """The upgrade request's ``Authorization`` header: a fresh credential proof, or the shared
        token. A server proves the connection before the websocket opens (HTTP 401 if wrong), so a
        flood of connections that never say hello cannot hold the door against this device
        (docs/security.md, "The door"); the hello still carries its own proof."""
        c = self.config
        if c.secret:
            return {"Authorization": f"Edgetrain {c.device_id} {make_proof(c.device_id, c.secret, purpose='upgrade')}"}
        return {"Authorization": f"Bearer {c.token}"} if c.token else {}

    def _tls(self) -> ssl.SSLContext | None:
        """The TLS settings for a ``wss://`` server (None for ``ws://``)."""
        if not self.config.server.startswith("wss://"):
            if self.config.tls_ca is not None:
                raise ValueError(f"tls_ca is set but {self.config.server!r} is not a wss:// URL")
            return None
        return client_tls(self.config.tls_ca)

    async def _serve(self, ch: Channel) -> bool:
        """One connection (:meth:`_session`). An error of this side's own (a phase its registry lacks, a
        malformed payload) is told to the server before it ends the device: retrying would meet it
        again. Closed under a round's work, a goodbye sent first (read only now) ends the run."""
        try:
            return await self._session(ch)
        except p.ProtocolError as exc:
            if not exc.remote:
                await send_error(ch, exc)
            raise
        except ConnectionClosed:
            if await ch.farewell():
                return True
            raise

    async def _hello(self, ch: Channel) -> p.Welcome:
        c, probe = self.config, await asyncio.to_thread(measure_probe, self.backend)  # once per backend: its pace's seed
        resume = self.work.progress.round if self.work.progress else -1
        await send_msg(ch, p.Hello(
            device_id=c.device_id, token=make_proof(c.device_id, c.secret, purpose="hello") if c.secret else c.token,
            budget_bytes=c.budget_bytes, cores=c.cores, runtimes=list(self.backend.runtimes), num_samples=len(self.x),
            device_class=c.device_class, labels=dict(c.labels), resume_round=resume, rows=self.rows,
            ext={**c.hello_ext, **private_hello_ext(self.row_bits, c.private_heat)}, probe_step_s=probe,
            input_shape=list(self.input_shape), num_classes=-1 if self.num_classes is None else self.num_classes,
        ))
        welcome = await expect(ch, p.Welcome)
        self.welcome = welcome
        self.work.welcomed(welcome)
        self.downloads.welcomed(welcome)
        self.memory.plan(welcome)
        self.on_event("welcome", {"device": c.device_id, "role": welcome.role, "split": welcome.split,
                                  "chunks": [list(ch) for ch in welcome.chunks],
                                  "keeps_freed_buffers": self.memory.keeps_freed_buffers})
        return welcome

    async def _session(self, ch: Channel) -> bool:
        """One connection's life. True when the server said goodbye (training over)."""
        await self._hello(ch)
        while True:
            msg = await recv_msg(ch)
            if isinstance(msg, p.Bye):
                return True
            if isinstance(msg, p.Error):
                raise DeviceRefused(f"{msg.code}: {msg.message}")
            if isinstance(msg, p.SecAggUnmask):  # a secure round's last step, after its report's ack
                await self.work.reveal(ch, msg)  # a refused request leaves the device connected
                continue
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
                    self.on_event("aborted", {"device": self.config.device_id, "round": instruction.round})
                    self.work.drop()
                    if ch.session.closed:  # the server's goodbye mid-round (a buffered run's end): not a drop
                        return True
                instruction = ch.session.next_instruction()

    async def _carry_out(self, ch: Channel, ins: p.Instruction) -> None:
        """Do the instruction's phase and report; a report already made (before a reconnect) is sent again."""
        report, payload = await self.work.report(ch, ins)
        await send_msg(ch, report)
        await self._upload(ch, self.work.round(ins.round), report, payload, offset=0)

    async def _resume_upload(self, ch: Channel, msg: p.Resume) -> None:
        """The server holds the first ``msg.offset`` bytes of this round's update: send the rest."""
        prog = self.work.progress
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

    async def _upload(self, ch: Channel, prog: RoundProgress, report: p.Report, payload: bytes | None, *,
                      offset: int) -> None:
        """Stream the report's tensors from ``offset`` (if it has any) and wait for the server's verdict."""
        started = time.monotonic()
        try:
            if payload is not None:
                await send_payload(ch, payload, transfer_id=report.transfer_id, kind="update",
                                   meta={"round": report.round}, frame_size=self.config.frame_size, offset=offset)
            ack = await expect(ch, p.Ack)
        finally:
            prog.timings["upload_s"] += time.monotonic() - started
        del prog.reports[report.phase]  # acknowledged: the encoded update is not needed any more
        prog.acked.add(report.phase)
        self.memory.released_after_report()
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


def __getattr__(name: str) -> Any:  # DeviceConfig: the API's name of DeviceSettings before the one record
    if name != "DeviceConfig":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from edge_sdk import settings

    return settings.DeviceConfig
