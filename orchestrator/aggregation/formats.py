"""The plain upload format: an update the server sees, decoded through the configured update codec.

An upload format (:class:`~orchestrator.aggregation.pipeline.UploadFormat`) is what an update is on
the wire and what the server checks of it before anything else looks at it. The formats, by name
(``UPLOAD_FORMATS`` in :mod:`orchestrator.aggregation.assembly`): ``plain`` (here) and ``masked``
(secure aggregation's ring words, :mod:`orchestrator.aggregation.secure.upload`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.models import LayeredModel
from edge_sdk.wire_codecs import decode_state
from orchestrator.aggregation.pipeline import Tensors, UploadFormat
from orchestrator.config import ServerConfig
from orchestrator.parts import Session, Work

__all__ = ["PlainUpload"]


class PlainUpload(UploadFormat):
    """Deltas of exactly what the instruction sent, encoded by ``encode_tensors`` or, with an update
    codec, as codec records (``edge_sdk.wire_codecs``)."""

    name = "plain"
    sees_updates = True
    resumable = True
    combiner = "strategy"

    def __init__(self, config: ServerConfig, template: LayeredModel, limits: p.Limits) -> None:
        self.codec, self.template, self.limits = config.update_codec, template, limits
        self.num_blocks = len(template)
        self._entry_bytes = {k: v.numel() * v.element_size() for k, v in template.state_dict().items()}

    def bound(self, session: Session, work: Work | None) -> int:
        """An update's deltas have the names, shapes and rows of the model payload the device was sent,
        so they encode to at most that payload's size (plus headers); nothing larger is ever received.
        A late report (no work: its round closed) is bounded by the device's planned tail, so that it
        can still be read and answered."""
        if work is not None:
            return work.model_bytes + (64 << 10)
        names = self.template.state_names(session.plan.split)
        return sum(self._entry_bytes[n] for n in names) + 256 * len(names) + (64 << 10)

    def decode(self, data: bytes) -> Tensors:
        """The tensors, through the configured update codec's records: NaN, infinity, sizes over the
        limits and a record that does not decode are refused."""
        if self.codec == "none":
            return p.decode_tensors(data, self.limits)
        return decode_state(data, self.limits)

    def check(self, msg: p.Report, work: Work, tensors: Tensors, state: Mapping[str, np.ndarray]) -> None:
        """The tensors are deltas of exactly what was sent (finite: checked on decode), with a
        positive sample count (whose weight the intake caps at the registered one)."""
        if msg.num_samples <= 0:
            raise p.ProtocolError("malformed", f"implausible sample count {msg.num_samples}")
        if msg.phase in p.TENSOR_PHASES or tensors:
            expected = (work.selection.split, self.num_blocks)
            if tuple(msg.trained) != expected:
                raise p.ProtocolError("malformed", f"trained {tuple(msg.trained)} but the instruction sent {expected}")
            reason = work.selection.check(tensors, state, work.names)
            if reason is not None:
                raise p.ProtocolError("malformed", f"report rejected: {reason}")
