"""Fault injection for emulated devices, from outside the device: a wrapped connection.

The production client carries no test hooks. An emulated device hands its client a ``connect``
that opens the real websocket connection and wraps it; the wrapper decodes every message that
passes (:func:`edge_sdk.protocol.decode`, bytes level, the client's own bytes untouched), tracks the
round from any message with a ``round`` field, and applies the device's :class:`Faults`:

- drop (vanish mid-round): once the device holds the whole trained-model payload (a transfer of
  kind ``"model"``) of a round in ``drop_rounds``, or of a round drawn with probability
  ``drop_prob`` (seeded by the seed, the device id and the round), the device disappears; with
  ``drop_at = "upload"`` it vanishes later, as its upload (kind ``"update"``) is about to begin:
  it has trained, and in a secure round advertised its keys and sent its shares, so the server
  must recover its masks (the dropout SecAgg+ is built for, Bell et al. 2020, Algorithm 2). A device
  process exits with :data:`DROP_EXIT` (``os._exit``: no goodbye, like a killed app); a device that
  shares its process with others (the lightweight mode) has its link reset and
  :class:`DeviceVanished` raised, which ends that device only.
- cut download: in the rounds listed, the link is reset once the round's first incoming transfer
  holds half its bytes; the client reconnects and resumes the download from what it holds.
- cut upload: in the rounds listed, the link is reset when the upload (transfer kind ``"update"``)
  has sent half its bytes; the server keeps what reached it and asks for the rest.
- delay: ``delay_s`` of network delay before each report (``"report"``) leaves.
- slow steps: ``step_delay_s`` more seconds of every local training step, not of the connection: the
  device trains with its backend's class wrapped (:func:`slowed_backend`), so a device asked for fewer
  steps really finishes sooner, as a slow processor would (the server's pacing,
  :mod:`orchestrator.server.pace`, is tested with it).

A reset is what a failing network does: ``transport.abort()`` (no closing handshake, bytes in
flight may be lost), then the error any later use of the connection would raise.

The pre-``Instruction`` protocol names are accepted too (the model payload ``"tail"``, the report
``"update"``), so the wrapper works with devices of either protocol version.

Imports only the device SDK, the standard library and numpy: device processes stay lean.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.backends import TrainingBackend

__all__ = ["DROP_EXIT", "DROP_POINTS", "DeviceVanished", "FaultInjector", "FaultyConnection", "Faults",
           "slowed_backend"]

#: Exit status of a device process that vanished on purpose.
DROP_EXIT = 75

#: ``TransferBegin.kind`` of the trained-model payload a device downloads ("tail": the older name).
MODEL_KINDS = frozenset({"model", "tail"})
#: Where in a round a dropping device vanishes (``Faults.drop_at``).
DROP_POINTS = ("model", "upload")

#: ``TransferBegin.kind`` of the device's upload.
UPLOAD_KIND = "update"
#: Message types of a device's report ("update": the older name).
REPORT_TYPES = frozenset({"report", "update"})

# Observing only: generous bounds, so that whatever the client accepts is decoded here too.
_OBSERVE = p.Limits(max_frame_bytes=1 << 30, max_message_bytes=(1 << 30) + (8 << 20), max_transfer_bytes=1 << 50,
                    max_tensor_bytes=1 << 50, max_items=1 << 30, max_str_len=1 << 20)


def _rounds(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted({int(r) for r in values}))


@dataclass(frozen=True)
class Faults:
    """How an emulated device departs from a production one (all off by default).

    ``force_split`` is not a connection fault: the device asks the server for that split in its
    hello (label ``force_split``), which a server honours only when configured to."""

    drop_rounds: tuple[int, ...] = ()
    drop_prob: float = 0.0
    cut_download_rounds: tuple[int, ...] = ()
    cut_upload_rounds: tuple[int, ...] = ()
    delay_s: float = 0.0
    force_split: int | None = None
    step_delay_s: float = 0.0
    drop_at: str = "model"  # one of DROP_POINTS

    def __post_init__(self) -> None:
        for name in ("drop_rounds", "cut_download_rounds", "cut_upload_rounds"):
            object.__setattr__(self, name, _rounds(getattr(self, name)))
        object.__setattr__(self, "drop_prob", float(self.drop_prob))
        object.__setattr__(self, "delay_s", float(self.delay_s))
        object.__setattr__(self, "step_delay_s", float(self.step_delay_s))
        if not 0.0 <= self.drop_prob <= 1.0:
            raise ValueError(f"drop_prob must be in [0, 1], got {self.drop_prob}")
        for name in ("delay_s", "step_delay_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.drop_at not in DROP_POINTS:
            raise ValueError(f"drop_at must be one of {DROP_POINTS}, got {self.drop_at!r}")
        if self.force_split is not None and (isinstance(self.force_split, bool) or int(self.force_split) < 0):
            raise ValueError(f"force_split must be a block index >= 0, got {self.force_split!r}")

    @property
    def on_connection(self) -> bool:
        """True when the connection must be wrapped (any fault but ``force_split`` and ``step_delay_s``)."""
        return bool(self.drop_rounds or self.drop_prob > 0 or self.cut_download_rounds or self.cut_upload_rounds
                    or self.delay_s > 0)

    def drops(self, round: int, *, device_id: str, seed: int) -> bool:
        """Whether the device vanishes in ``round`` (listed, or drawn: the same on every run)."""
        if round in self.drop_rounds:
            return True
        if self.drop_prob <= 0:
            return False
        rng = np.random.default_rng([seed, zlib.crc32(device_id.encode()), round])
        return bool(rng.random() < self.drop_prob)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Faults:
        """The inverse of :meth:`to_dict`; unknown keys raise TypeError."""
        return cls(**dict(raw))


def slowed_backend(backend: type[TrainingBackend], step_delay_s: float) -> type[TrainingBackend]:
    """``backend``'s class, each training run ``step_delay_s`` seconds per local step slower (it sleeps
    ``local_steps * step_delay_s`` in the training thread before it trains): the device's own
    ``train_s`` and round time grow with the steps it is asked for, and its probe step (the hello's
    ``probe_step_s``) is as much slower. Same name and runtimes, so the plan is that of the device it slows."""
    if step_delay_s <= 0:
        return backend

    class Slowed(backend):  # type: ignore[valid-type, misc]
        def train(self, tail: Any, y: Any, config: Any) -> Any:
            time.sleep(step_delay_s * config.local_steps)
            return super().train(tail, y, config)

        @classmethod
        def probe_step(cls) -> None:
            time.sleep(step_delay_s)
            super().probe_step()

    Slowed.__name__ = Slowed.__qualname__ = f"Slowed{backend.__name__}"
    return Slowed


class DeviceVanished(Exception):
    """Raised out of a device's connection when it vanishes on purpose and shares its process."""


@dataclass
class _Transfer:
    kind: str
    total: int
    done: int  # bytes held (incoming) or sent (outgoing)
    digest_first: bool  # the sha256 came in TransferBegin: the last frame completes the transfer
    cut: bool = False  # the transfer the round's cut applies to


@dataclass
class _State:
    """What the injector knows; it outlives connections (a cut round is cut once, reconnects included)."""

    round: int = -1
    incoming: dict[str, _Transfer] = field(default_factory=dict)
    outgoing: dict[str, _Transfer] = field(default_factory=dict)
    downloads_cut: set[int] = field(default_factory=set)
    uploads_cut: set[int] = field(default_factory=set)


Connect = Callable[..., contextlib.AbstractAsyncContextManager[Any]]


class FaultInjector:
    """Applies one device's :class:`Faults` to every connection it opens (one per device life).

    Give :meth:`connect` to the client (``DeviceClient(..., connect=injector.connect)``).
    ``on_event`` gets ``dropped``, ``download_cut`` and ``upload_cut`` events like the device's own;
    ``in_process`` picks how a drop ends the device (see the module docstring)."""

    def __init__(self, faults: Faults, device_id: str, *, seed: int = 0,
                 on_event: Callable[[str, dict], None] | None = None, in_process: bool = False,
                 connect: Connect | None = None) -> None:
        self.faults, self.device_id, self.seed, self.in_process = faults, device_id, seed, in_process
        self.on_event = on_event or (lambda kind, data: None)
        self._connect = connect
        self._state = _State()

    @contextlib.asynccontextmanager
    async def connect(self, url: str, **kwargs: Any) -> AsyncIterator[FaultyConnection]:
        """Like ``websockets.asyncio.client.connect(url, **kwargs)``, the connection wrapped."""
        opener = self._connect
        if opener is None:
            from websockets.asyncio.client import connect as opener
        async with opener(url, **kwargs) as ws:
            yield FaultyConnection(ws, self)

    @property
    def round(self) -> int:
        """The round of the last message seen with a ``round`` field (-1 before any)."""
        return self._state.round

    # -- what passes ------------------------------------------------------------------------------
    def _note_round(self, msg: p.Message) -> None:
        value = getattr(msg, "round", None)
        if type(value) is int and value >= 0:
            self._state.round = value

    def _received(self, msg: p.Message, conn: FaultyConnection) -> bool:
        """Note an incoming message; True when the link must drop before the next use."""
        s, f = self._state, self.faults
        self._note_round(msg)
        if type(msg) is p.TransferBegin:
            t = _Transfer(msg.kind, msg.total_size, msg.offset, bool(msg.sha256))
            if s.round in f.cut_download_rounds and s.round not in s.downloads_cut:
                s.downloads_cut.add(s.round)  # the round's first download
                t.cut = True
            s.incoming[msg.transfer_id] = t
            return self._half_held(t)
        if type(msg) is p.TransferFrame:
            t = s.incoming.get(msg.transfer_id)
            if t is None:
                return False
            t.done = msg.offset + len(msg.data)
            if t.digest_first and t.done >= t.total:
                self._completed(msg.transfer_id, conn)
            return self._half_held(t)
        if type(msg) is p.TransferEnd and msg.transfer_id in s.incoming:
            self._completed(msg.transfer_id, conn)
        return False

    def _half_held(self, t: _Transfer) -> bool:
        if not t.cut or t.done < t.total // 2:
            return False
        t.cut = False
        self.on_event("download_cut", {"device": self.device_id, "round": self._state.round, "kind": t.kind,
                                       "held": t.done, "total": t.total})
        return True

    def _completed(self, transfer_id: str, conn: FaultyConnection) -> None:
        t = self._state.incoming.pop(transfer_id)
        r = self._state.round
        if (t.kind in MODEL_KINDS and self.faults.drop_at == "model"
                and self.faults.drops(r, device_id=self.device_id, seed=self.seed)):
            self._vanish(conn)

    def _vanishes_before(self, msg: p.Message) -> bool:
        """Whether the device vanishes instead of sending ``msg``: the start of its upload, in a
        round it drops in at ``drop_at = "upload"``."""
        f = self.faults
        return (f.drop_at == "upload" and type(msg) is p.TransferBegin and msg.kind == UPLOAD_KIND
                and f.drops(self._state.round, device_id=self.device_id, seed=self.seed))

    def _vanish(self, conn: FaultyConnection) -> NoReturn:
        self.on_event("dropped", {"device": self.device_id, "round": self._state.round})
        if not self.in_process:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(DROP_EXIT)
        conn.transport.abort()  # gone without a goodbye, as a dead process's socket
        raise DeviceVanished(self.device_id)

    def _cuts_before_sending(self, msg: p.Message) -> bool:
        """Note an outgoing message; True when the link must drop instead of sending it."""
        s, f = self._state, self.faults
        self._note_round(msg)
        if type(msg) is p.TransferBegin:
            t = _Transfer(msg.kind, msg.total_size, msg.offset, bool(msg.sha256))
            if (msg.kind == UPLOAD_KIND and s.round in f.cut_upload_rounds and s.round not in s.uploads_cut):
                s.uploads_cut.add(s.round)
                t.cut = True
            s.outgoing[msg.transfer_id] = t
            return False
        if type(msg) is p.TransferFrame:
            t = s.outgoing.get(msg.transfer_id)
            return t is not None and t.cut and msg.offset >= t.total // 2
        return False

    def _cuts_after_sending(self, msg: p.Message) -> bool:
        """After a message has gone: True when it completed the upload that was to be cut half-way
        (a payload of one frame has no half to stop at)."""
        s = self._state
        if type(msg) is p.TransferFrame and msg.transfer_id in s.outgoing:
            t = s.outgoing[msg.transfer_id]
            t.done = msg.offset + len(msg.data)
            return t.cut and t.digest_first and t.done >= t.total
        if type(msg) is p.TransferEnd and msg.transfer_id in s.outgoing:
            if s.outgoing[msg.transfer_id].cut:
                return True
            del s.outgoing[msg.transfer_id]
        return False

    def _upload_cut(self, transfer_id: str) -> None:
        t = self._state.outgoing.pop(transfer_id)
        self.on_event("upload_cut", {"device": self.device_id, "round": self._state.round, "sent": t.done,
                                     "total": t.total})


def _decode(data: Any) -> p.Message | None:
    """The message in a websocket message, or None for what the protocol does not know."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return None
    try:
        return p.decode(data, _OBSERVE)
    except p.ProtocolError:
        return None


class FaultyConnection:
    """A client connection whose ``send`` and ``recv`` pass through a :class:`FaultInjector`;
    everything else is the wrapped connection's."""

    def __init__(self, ws: Any, injector: FaultInjector) -> None:
        self._ws, self._injector = ws, injector
        self._drop_pending = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ws, name)

    async def recv(self, *args: Any, **kwargs: Any) -> Any:
        if self._drop_pending:
            await self._drop_link()
        data = await self._ws.recv(*args, **kwargs)
        msg = _decode(data)
        if msg is not None and self._injector._received(msg, self):
            self._drop_pending = True  # the client gets this message; its next use of the link fails
        return data

    async def send(self, message: Any, *args: Any, **kwargs: Any) -> None:
        if self._drop_pending:
            await self._drop_link()
        msg = None
        if isinstance(message, (bytes, bytearray, memoryview)):
            msg = _decode(message)
        elif isinstance(message, Iterable) and not isinstance(message, (str, Mapping)):
            message = list(message)  # fragments of one message: read them once, send them as they are
            if all(isinstance(part, (bytes, bytearray, memoryview)) for part in message):
                msg = _decode(b"".join(message))
        if msg is not None:
            if self._injector._vanishes_before(msg):
                self._injector._vanish(self)
            if msg.TYPE in REPORT_TYPES and self._injector.faults.delay_s > 0:
                await asyncio.sleep(self._injector.faults.delay_s)
            if self._injector._cuts_before_sending(msg):
                self._injector._upload_cut(msg.transfer_id)  # type: ignore[attr-defined]
                await self._drop_link()
        await self._ws.send(message, *args, **kwargs)
        if msg is not None and self._injector._cuts_after_sending(msg):
            self._injector._upload_cut(msg.transfer_id)  # type: ignore[attr-defined]
            await self._drop_link()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Any]:
        from websockets.exceptions import ConnectionClosedOK

        try:
            while True:
                yield await self.recv()
        except ConnectionClosedOK:
            return

    async def _drop_link(self) -> NoReturn:
        """Reset the connection as a failing network would and raise what any later use of it would."""
        self._drop_pending = False
        self._ws.transport.abort()
        await self._ws.wait_closed()
        raise self._ws.protocol.close_exc
