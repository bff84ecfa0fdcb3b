"""What a device downloads, and the server's replies it waits for.

A payload (a frozen chunk, the trainable tail, a training graph, a broadcast) moves as frames under
one sha256 (docs/protocol.md, "Transfers"). A download cut by a dropped connection resumes from the
bytes already held (``Fetch.offset``); a payload the device's offline bundle holds under the digest
its instruction names (:class:`edge_sdk.bundle.HeldPayloads`: the bundle records the digest the server
names each payload by under its transfer settings) is not downloaded at all, nor is one the device's
own store holds by that digest (:class:`edge_sdk.payload_store.PayloadStore`); both are asked with
``Fetch.held``, and the server sends no byte of them. Where the server delta-codes downloads
(``download_delta``), a device asks for a changed chunk or tail with the digest of the version it
holds of the same payload (its slot, :func:`download_slot`) and rebuilds the new one from the
quantized difference (:mod:`edge_sdk.codecs.delta`); the frames of a
transfer the device no longer wants are drained. :func:`next_reply` reads the server's next answer,
leaving follow-up instructions queued in the session, and turns an ``Error`` or ``Bye`` into
:class:`DeviceRefused` or :class:`RoundAborted`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_sdk import protocol as p
from edge_sdk.payload_store import PayloadStore
from edge_sdk.transport import Channel, recv_msg, recv_payload, send_msg
from edge_sdk.wire_codecs import CODEC_META, DELTA_BASE_META, DELTA_CODEC, RECON_META, decode_payload

__all__ = ["DeviceRefused", "Downloads", "RoundAborted", "download_slot", "drain", "expect", "next_reply"]


def download_slot(ins: p.Instruction, payload_id: str) -> str:
    """Which payload of the previous rounds ``payload_id`` replaces (its slot): the instruction's
    i-th chunk or its model, at its split and selection; "" for others (never delta-coded). The
    server checks that a base fits (same regions), so a slot is a guess that costs nothing if wrong."""
    if payload_id in ins.chunk_ids:
        return f"{ins.split}:chunk:{ins.chunk_ids.index(payload_id)}"
    return f"{ins.split}:model:{ins.selection}" if payload_id == ins.model_id else ""


class DeviceRefused(RuntimeError):
    """The server turned the device away (bad credentials, budget too small): retrying will not help."""


class RoundAborted(RuntimeError):
    """The server closed the round this device was working on."""


async def next_reply(ch: Channel) -> p.Message:
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


async def expect(ch: Channel, kind: type) -> p.Message:
    """The next reply, which must be a ``kind``."""
    msg = await next_reply(ch)
    if not isinstance(msg, kind):
        raise p.ProtocolError("unexpected", f"expected {kind.TYPE}, got {msg.TYPE}")
    return msg


async def _transfer_begin(ch: Channel) -> p.TransferBegin:
    begin = await next_reply(ch)
    if isinstance(begin, p.Ack) and not begin.accepted:
        raise RoundAborted(begin.reason)
    if not isinstance(begin, p.TransferBegin):
        raise p.ProtocolError("unexpected", f"expected a transfer, got {begin.TYPE}")
    return begin


async def drain(ch: Channel, begin: p.TransferBegin) -> None:
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


class Downloads:
    """One device's downloads: resumed across reconnects, served from its bundle where they can be.

    ``welcome`` is the server's latest (set by the client at each hello): the bundle serves only
    payloads of the model and depth it was written for."""

    def __init__(self, device_id: str, limits: p.Limits, on_event: Callable[[str, dict], None],
                 bundle: Path | None = None, store: PayloadStore | None = None) -> None:
        self.device_id, self.limits, self.on_event = device_id, limits, on_event
        self.held = None if bundle is None else _open_bundle(bundle)
        self.store = store
        self.welcome: p.Welcome | None = None

    def welcomed(self, welcome: p.Welcome) -> None:
        """The server welcomed the device (at each hello): held payloads are checked against its model."""
        self.welcome = welcome

    async def fetch(self, ch: Channel, round_no: int, payload_id: str, partial: dict[str, p.IncomingTransfer],
                    timings: dict[str, float], *, block_range: tuple[int, int] | None = None,
                    sha256: str = "", slot: str = "") -> memoryview:
        """Download one payload; ``partial`` holds the round's cut downloads (resumed from their
        offset), ``timings["download_s"]`` counts the time. A payload of ``sha256`` (the instruction's
        digest) that the device's bundle or its store holds is not downloaded: the fetch names the
        digest (``Fetch.held``) and the server sends none of its bytes."""
        t = time.monotonic()
        incoming = partial.get(payload_id)
        held = self._held(payload_id, block_range) if incoming is None else None
        bundled = held is not None and self.held is not None and self.held.matches(held, sha256)
        stored: bytes | None = None
        if bundled:
            stored = await asyncio.to_thread(self.held.read, held)  # type: ignore[union-attr]
        elif self.store is not None and sha256 and incoming is None:
            stored = self.store.get(sha256)
        base = self.store.slot(slot) if stored is None and incoming is None and self.store is not None else ""
        while True:
            await send_msg(ch, p.Fetch(round_no, payload_id, incoming.offset if incoming else 0,
                                       held=sha256 if stored is not None else base))
            begin = await _transfer_begin(ch)
            if stored is not None:
                if begin.offset == begin.total_size and sha256 in (begin.sha256, begin.meta.get(RECON_META)):
                    timings["download_s"] += time.monotonic() - t
                    return self._from_held(round_no, payload_id, begin, stored, held if bundled else None, slot)
                stored = None  # the server's bytes differ: it sends them from 0
            if incoming is None:
                incoming = p.IncomingTransfer(begin, self.limits)
                break
            if incoming.begin.sha256 == begin.sha256 and begin.offset == incoming.offset:
                incoming.resume(begin)
                self.on_event("download_resumed", {"device": self.device_id, "round": round_no, "payload": payload_id,
                                                   "offset": begin.offset, "total": begin.total_size})
                break
            # The payload changed since the partial download: drop it and start again from 0.
            await drain(ch, begin)
            incoming = None
        if held is not None and self.held is not None:
            self._tell_mismatch(round_no, held.kind, incoming.begin.meta)
        partial[payload_id] = incoming
        # Verified, and no second copy of a payload that may be most of the budget. The device hashes
        # each frame as it lands (hash_in_feed): no worker thread, whose stack and arena count too.
        data = await recv_payload(ch, incoming.begin, self.limits, incoming=incoming)
        del partial[payload_id]
        timings["download_s"] += time.monotonic() - t
        if incoming.begin.meta.get(CODEC_META) == DELTA_CODEC:
            return await self._rebuilt(data, incoming.begin, slot, round_no)
        return self._decoded(self._keep(data, incoming.begin.sha256), incoming.begin)

    def _held(self, payload_id: str, block_range: tuple[int, int] | None) -> Any:
        """The bundle's payload the server may be shipping as ``payload_id``, for a server of the bundle's model."""
        if self.held is None or self.welcome is None or not self.held.serves(self.welcome.model,
                                                                              self.welcome.num_blocks):
            return None
        return self.held.find(payload_id, block_range)

    def _from_held(self, round_no: int, payload_id: str, begin: p.TransferBegin, stored: bytes, bundled: Any,
                   slot: str) -> memoryview:
        """A payload the server confirmed the device holds: the bundle's bytes (``bundled``: its entry,
        held as the device would after downloading it; kept in the store, as the base of the next
        round's delta, where the digest names them) or the store's (as they travelled)."""
        source = "from_store" if bundled is None else "from_bundle"
        self.on_event(source, {"device": self.device_id, "round": round_no, "payload": payload_id,
                               "kind": begin.kind, "bytes": len(stored)})
        if bundled is not None:
            if bundled.plain and self.store is not None:
                self._keep(memoryview(stored), bundled.sha256)
                if slot:
                    self.store.set_slot(slot, bundled.sha256)
            return memoryview(stored)
        return memoryview(stored) if RECON_META in begin.meta else self._decoded(memoryview(stored), begin)

    def _tell_mismatch(self, round_no: int, kind: str, meta: dict) -> None:
        """Say once (a ``bundle_mismatch`` event, one line on the device's console) that the bundle was
        written for other transfer settings than the server's."""
        message = self.held.mismatch(kind, meta)  # type: ignore[union-attr]
        if message is not None:
            self.on_event("bundle_mismatch", {"device": self.device_id, "round": round_no, "kind": kind,
                                              "message": message})

    async def _rebuilt(self, data: memoryview, begin: p.TransferBegin, slot: str, round_no: int) -> memoryview:
        """A delta download's payload: rebuilt on the base it names (from the store), checked against
        the digest the server computed for the same bytes, kept for the next round's delta."""
        base_digest, digest = str(begin.meta.get(DELTA_BASE_META, "")), str(begin.meta.get(RECON_META, ""))
        base = self.store.get(base_digest) if base_digest and self.store is not None else None
        if base_digest and base is None:
            raise p.ProtocolError(p.ErrorCode.MALFORMED, f"a delta on {base_digest[:16]}, which this device does not hold")
        # In a worker thread: a model's worth of float32 work would stall the event loop.
        out = await asyncio.to_thread(_apply, data, base, begin.kind, digest, self.limits)
        self.on_event("delta_applied", {"device": self.device_id, "round": round_no, "kind": begin.kind,
                                        "bytes": begin.total_size, "rebuilt": len(out), "base": bool(base_digest)})
        if self._keep(memoryview(out), digest) is not None and slot and self.store is not None:
            self.store.set_slot(slot, digest)
        return memoryview(out)

    def _decoded(self, data: memoryview, begin: p.TransferBegin) -> memoryview:
        """The payload's bytes as its consumer reads them: through the codec ``begin.meta`` names
        (edge_sdk.wire_codecs), if any. The store keeps what travelled, under the server's sha256."""
        name = begin.meta.get(CODEC_META, "none")
        if name == "none":
            return data
        return memoryview(decode_payload(data, str(name), begin.kind, self.limits))

    def _keep(self, data: memoryview, sha256: str) -> memoryview:
        """Keep a verified payload of digest ``sha256`` in the device's store for later rounds."""
        if self.store is not None and sha256:
            self.store.put(sha256, data)
        return data


def _apply(data: memoryview, base: bytes | None, kind: str, digest: str, limits: p.Limits) -> bytes:
    """The bytes a delta payload rebuilds on ``base``, which must hash to the server's ``digest``."""
    from edge_sdk.codecs import CodecError
    from edge_sdk.codecs.delta import apply_delta

    try:
        out = apply_delta(data, base, max_bytes=limits.max_transfer_bytes)
    except CodecError as exc:
        raise p.ProtocolError(p.ErrorCode.MALFORMED, f"a {kind} delta: {exc}") from None
    if p.sha256_hex(out) != digest:
        raise p.ProtocolError(p.ErrorCode.MALFORMED, f"a {kind} delta rebuilds other bytes than the server's")
    return out


def _open_bundle(path: Path):
    """The payloads of the device's bundle (checked as it opens: a damaged one is refused here)."""
    from edge_sdk.bundle import HeldPayloads

    return HeldPayloads.open(path)
