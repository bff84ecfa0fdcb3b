"""The masked upload format: a secure round's ring words, one vector per trained block plus its weight
word (docs/security.md, "Secure aggregation"). Only their shapes can be checked: the values are masked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.models import LayeredModel
from edge_sdk.secagg.exchange import CLIP_KEY, upload_name
from edge_sdk.secagg.layout import block_entries
from orchestrator.aggregation.pipeline import Bound, Pending, Tensors, UploadFormat
from orchestrator.config import ServerConfig
from orchestrator.parts import Session, Work

__all__ = ["BlockLayout", "DeviceClip", "MaskedUpload"]


@dataclass(frozen=True)
class BlockLayout:
    """The model as a secure round sums it: each block's float entries in order (``entries``), their
    shapes, and each block's count of coordinates (``sizes``)."""

    block_names: tuple[str, ...]
    shapes: Mapping[str, tuple[int, ...]]
    entries: Mapping[int, list[str]]
    sizes: Mapping[int, int]

    @classmethod
    def of(cls, template: LayeredModel) -> BlockLayout:
        state = template.state_dict()
        shapes = {n: tuple(t.shape) for n, t in state.items() if t.is_floating_point()}
        block_names = tuple(template.block_names)
        entries = block_entries(sorted(shapes), list(block_names), 0)
        sizes = {b: sum(int(np.prod(shapes[n], dtype=np.int64)) for n in names) for b, names in entries.items()}
        return cls(block_names, shapes, entries, sizes)


class MaskedUpload(UploadFormat):
    """``encode_tensors`` of int32 ring words named by block (``edge_sdk.secagg.exchange.upload_name``), or
    in a compressed round the words packed at the ring's bits (uint8; the round unpacks and checks them)."""

    name = "masked"
    sees_updates = False
    resumable = False  # a cut masked upload is a dropout: the device is presumed dropped for the round
    combiner = "secure_sums"
    bounded_sums = True  # each secure group's sum goes through the bounds that read updates

    def __init__(self, config: ServerConfig, template: LayeredModel, limits: p.Limits) -> None:
        self.layout, self.limits = BlockLayout.of(template), limits

    def bound(self, session: Session, work: Work | None) -> int:
        """One int32 word per coordinate of each trained block, plus its weight word."""
        split = work.selection.split if work is not None else session.plan.split
        sizes = self.layout.sizes
        return 4 * sum(sizes[b] + 1 for b in range(split, len(self.layout.block_names))) + (64 << 10)

    def decode(self, data: bytes) -> Tensors:
        return p.decode_tensors(data, self.limits)

    def check(self, msg: p.Report, work: Work, tensors: Tensors, state: Mapping[str, np.ndarray]) -> None:
        """A train report of the instruction's tail with samples, whose upload is exactly int32 words (or
        packed bytes, uint8) named by each trained block; their sizes are the round's to check."""
        split, last = work.selection.split, len(self.layout.block_names)
        if msg.phase != "train" or tuple(msg.trained) != (split, last) or msg.num_samples <= 0:
            raise p.ProtocolError("malformed", f"a secure report trains [{split}, {last}) with samples, got "
                                               f"{tuple(msg.trained)} and {msg.num_samples}")
        if set(tensors) != {upload_name(b) for b in range(split, last)} \
                or any(np.asarray(t).dtype not in (np.dtype("<i4"), np.dtype(np.uint8)) for t in tensors.values()):
            raise p.ProtocolError("malformed", "a secure report's upload is not int32 ring words (or packed "
                                               "uint8 words) named by block")

    def words(self, work: Work, tensors: Tensors) -> dict[int, np.ndarray]:
        """A checked upload's words per block, as the ring's unsigned words (packed bytes as they came)."""
        out = {}
        for b in range(work.selection.split, len(self.layout.block_names)):
            t = np.asarray(tensors[upload_name(b)])
            out[b] = t if t.dtype == np.uint8 else t.view(np.uint32).ravel()
        return out


class DeviceClip(Bound):
    """Under masking the server sees no update: each device clips each block of its own to ``clip``
    before it masks it (``edge_sdk.secagg.fixedpoint``), as every train instruction tells it; the secure
    round's fixed point is sized for that clip, so a larger value cannot be encoded."""

    name = "device_clip"

    def __init__(self, clip: float) -> None:
        self.clip = clip

    def apply(self, pending: Pending) -> Pending:
        """Nothing the server can do: the words are masked."""
        return pending

    def instruction_config(self, work: Work) -> Mapping[str, p.Scalar]:
        return {CLIP_KEY: self.clip} if work.wire.phase == "train" else {}
