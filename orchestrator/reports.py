"""Reports: what the server guarantees every strategy about a report before the strategy sees it.

An update is bounded in size before it is received (:meth:`Reports.update_bound`), checked against
the instruction it answers (:meth:`Reports.check`: the tensors are deltas of exactly what was
sent), weighed by the sample count registered for the device, never the one it claims
(:meth:`Reports.registered_samples`), and bounded in norm per layer group
(:mod:`orchestrator.normbound`). An upload cut by a dropped connection is kept for the rest of the
round so that the device's reconnect continues it (:meth:`Reports.cut`, docs/protocol.md, "Resume").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from edge_sdk import protocol as p
from orchestrator.admission import Session
from orchestrator.config import ServerConfig
from orchestrator.payloads import Payload, Work
from orchestrator.strategies import DeviceReport

__all__ = ["PartialUpload", "Reports", "TENSOR_PHASES", "report_info"]

#: Phases whose reports must carry tensors (deltas of the state the selection sent).
TENSOR_PHASES = frozenset({"train"})


@dataclass
class PartialUpload:
    """An update whose transfer a dropped connection cut short. Kept until the round ends, so that
    the device's reconnect continues it from the bytes held (docs/protocol.md, "Resume")."""

    report: p.Report
    incoming: p.IncomingTransfer


def report_info(r: DeviceReport) -> dict[str, object]:
    """What the journal keeps of a folded or refused report."""
    return {"phase": r.phase, "role": r.role, "trained": list(r.trained), "num_samples": r.num_samples,
            "loss_before": r.metrics.get("loss_before"), "loss_after": r.metrics.get("loss_after"),
            "selection": r.selection.kind, "metrics": dict(r.metrics)}


class Reports:
    """Report checks and bounds, and the uploads a dropped connection cut short this round."""

    def __init__(self, config: ServerConfig, num_blocks: int) -> None:
        self.config = config
        self.num_blocks = num_blocks
        self.partial: dict[str, PartialUpload] = {}  # by device

    def update_bound(self, payload: Payload | None, tail_bytes: int, tail_entries: int) -> int:
        """The largest update a device may send for an instruction: its deltas have the names, shapes
        and rows of the model ``payload`` it was sent, so they encode to at most that payload's size
        (plus headers); nothing larger is ever received. A late report (no payload: its round
        closed) is bounded by the device's planned tail, so that it can still be read and answered."""
        if payload is not None:
            return len(payload.data) + (64 << 10)
        return tail_bytes + 256 * tail_entries + (64 << 10)

    def check(self, msg: p.Report, work: Work, tensors: dict, state: Mapping[str, np.ndarray]) -> None:
        """The tensors are deltas of exactly what was sent (finite: checked on decode), with a
        positive sample count (whose weight is capped by :meth:`registered_samples`)."""
        if msg.num_samples <= 0:
            raise p.ProtocolError("malformed", f"implausible sample count {msg.num_samples}")
        if msg.phase in TENSOR_PHASES or tensors:
            expected = (work.selection.split, self.num_blocks)
            if tuple(msg.trained) != expected:
                raise p.ProtocolError("malformed", f"trained {tuple(msg.trained)} but the instruction sent {expected}")
            reason = work.selection.check(tensors, state, work.names)
            if reason is not None:
                raise p.ProtocolError("malformed", f"report rejected: {reason}")

    def registered_samples(self, session: Session) -> int:
        """The sample count a device's reports may weigh: what it declared when it registered,
        capped by the operator's policy (``max_device_samples``, and the count fixed at its
        enrollment), never what an update claims."""
        limit = self.config.max_device_samples
        if session.enrolled_samples is not None:
            limit = min(limit, session.enrolled_samples)
        return min(session.hello.num_samples, limit)

    # -- upload resume --------------------------------------------------------------------------
    def cut(self, device_id: str, report: p.Report, incoming: p.IncomingTransfer) -> None:
        """Keep an upload a dropped connection cut short, for the device's reconnect this round."""
        self.partial[device_id] = PartialUpload(report, incoming)

    def resumable(self, device_id: str, round_no: int) -> PartialUpload | None:
        """The cut upload a device reconnecting in round ``round_no`` continues, if any (taken)."""
        partial = self.partial.pop(device_id, None)
        return partial if partial is not None and partial.report.round == round_no else None
