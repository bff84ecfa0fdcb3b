"""Delta downloads, the server's side: what each device holds, and the quantized difference that takes it to now.

With ``download_delta`` set, a frozen chunk or a tail travels as an :mod:`edge_sdk.codecs.delta`
payload: whole (``Q(current)``) to a device holding nothing of it, and ``Q(current - held)`` to a
device whose ``Fetch.held`` names a reconstruction this server sent. The server keeps the
reconstructions it sent (by the sha256 of their bytes, the digest the device names) for
``download_delta_keep`` rounds: memory of K rounds' payloads, not of the devices, because every
device that applies a delta to the same base rebuilds the same bytes. A delta is computed once per
payload and base, however many devices ask for it. A device holding an older or unknown base, or one
of another structure (other regions), is sent the whole payload: nothing it holds is trusted beyond
its digest.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.codecs.delta import encode_delta
from edge_sdk.wire_codecs import CODEC_META, DELTA_BASE_META, DELTA_CODEC, RECON_META, tensor_regions
from orchestrator.parts import Payload

__all__ = ["DeltaDownloads", "delta_bits"]

def delta_bits(setting: str) -> int:
    """Bits a weight of a ``download_delta`` setting (``none``: 0, downloads travel whole; ``int4``: 4)."""
    return 0 if setting == "none" else int(setting.removeprefix("int"))


@dataclass(frozen=True)
class _Recon:
    regions: np.ndarray
    data: bytes
    generation: int


class DeltaDownloads:
    """The reconstructions sent in the last ``keep`` rounds, and this round's deltas from them."""

    def __init__(self, bits: int, keep: int) -> None:
        self.bits, self.keep = bits, keep
        self.generation = 0
        self._recons: OrderedDict[str, _Recon] = OrderedDict()
        self._exact: dict[str, tuple[bytes, np.ndarray]] = {}  # payload id -> its exact bytes and regions
        self._deltas: dict[tuple[str, str], Payload] = {}
        self._lock = threading.Lock()

    def next_round(self) -> None:
        """A new round: its payloads and deltas start empty; reconstructions older than ``keep`` rounds go."""
        with self._lock:
            self.generation += 1
            self._exact, self._deltas = {}, {}
            for digest in [d for d, r in self._recons.items() if r.generation <= self.generation - self.keep]:
                del self._recons[digest]

    def whole(self, payload_id: str, kind: str, data: bytes, meta: dict) -> Payload:
        """The payload ``payload_id`` as a device holding nothing receives it: ``Q(data)``."""
        regions = _regions(kind, data)
        travel, recon = encode_delta(data, regions, None, self.bits)
        digest = self._keep(regions, recon)
        with self._lock:
            self._exact[payload_id] = (data, regions)
        meta = {**meta, CODEC_META: DELTA_CODEC, RECON_META: digest, "decoded_size": len(data)}
        return Payload(kind, travel, p.sha256_hex(travel), meta)

    def answer(self, payload_id: str, payload: Payload, held: str) -> Payload | None:
        """The delta taking the device's ``held`` reconstruction to ``payload``'s weights, or None
        when the server does not hold that base (or it has other regions): send the payload whole."""
        with self._lock:
            made = self._deltas.get((payload_id, held))
            exact, base = self._exact.get(payload_id), self._recons.get(held)
        if made is not None:
            return made
        if exact is None or base is None or len(base.data) != len(exact[0]) \
                or not np.array_equal(base.regions, exact[1]):
            return None
        travel, recon = encode_delta(exact[0], exact[1], base.data, self.bits)
        meta = {**payload.meta, DELTA_BASE_META: held, RECON_META: self._keep(exact[1], recon)}
        made = Payload(payload.kind, travel, p.sha256_hex(travel), meta)
        with self._lock:
            return self._deltas.setdefault((payload_id, held), made)

    def _keep(self, regions: np.ndarray, recon: bytes) -> str:
        digest = p.sha256_hex(recon)
        with self._lock:
            self._recons[digest] = _Recon(regions, recon, self.generation)
            self._recons.move_to_end(digest)
        return digest

    @property
    def held_bytes(self) -> int:
        """Bytes of reconstructions kept as bases."""
        with self._lock:
            return sum(len(r.data) for r in self._recons.values())


def _regions(kind: str, data: bytes) -> np.ndarray:
    """Where ``data``'s float32 weights sit: an ONNX chunk's initializers, a tail's float32 tensors."""
    if kind == "chunk":
        from exporters.weights import onnx_regions

        return onnx_regions(data)
    return tensor_regions(data)
