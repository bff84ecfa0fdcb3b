"""The bounds on a report's influence, as steps of report intake's chain (docs/security.md, "Bounded
influence by default").

Each is a :class:`~orchestrator.aggregation.pipeline.Bound`; the assembly
(:mod:`orchestrator.aggregation.assembly`) puts in the chain, in this order, those the settings ask
for and the upload format and the release allow:

- ``norm_bound`` (:class:`NormBoundStep`): each block's norm against the server's reference update and
  its peers' history (:mod:`orchestrator.aggregation.normbound`); it also keeps the round's reference
  update, which direction trust reads;
- ``direction_trust`` (:class:`TrustStep`): each block normalised to the reference update's norm and
  weighed by its cosine with it (:mod:`orchestrator.aggregation.trust`);
- ``dp_clip``: a privacy mechanism's clip of each update, per block, before its sum is noised
  (:class:`~orchestrator.aggregation.privacy.clipping.ClipAndSum`);
- ``device_clip`` (:class:`~orchestrator.aggregation.secure.upload.DeviceClip`): under masking the server cannot see an update, so the bound is
  the clip each device applies to each block before it masks it, told in every instruction.

The first two read an update in the clear and measure it against data no accountant covers (the
server's held-out data, earlier devices' norms): they are not available under masking, nor under a
privacy mechanism, whose clip bounds each update instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from orchestrator.aggregation.normbound import NormBound
from orchestrator.aggregation.pipeline import Bound, Pending
from orchestrator.aggregation.trust import DirectionTrust
from orchestrator.strategies import RoundContext, RoundResult

__all__ = ["NormBoundStep", "TrustStep"]

log = logging.getLogger("edgetrain.server")


class NormBoundStep(Bound):
    """Clip (or refuse) an update whose norm at a block exceeds ``norm_bound`` x its reference."""

    name = "norm_bound"

    def __init__(self, norms: NormBound) -> None:
        self.norms = norms

    def prepare(self, state: Mapping[str, np.ndarray], round: int) -> None:
        """The server's reference update (trained on its data), for this bound and direction trust."""
        self.norms.begin_round(state, round)

    def apply(self, pending: Pending) -> Pending:
        bounded = self.norms.bound(pending.device_id, pending.selection.split, pending.tensors)
        return pending.with_(tensors=bounded.tensors, refusal=pending.refusal or bounded.refusal,
                             changed={"clipped": bounded.clipped} if bounded.clipped else None)

    def discard(self, device_id: str) -> None:
        self.norms.discard(device_id)

    def commit(self, round: int) -> None:
        """The committed round's accepted norms become history (kept in the store)."""
        self.norms.commit(round)


class TrustStep(Bound):
    """Normalise an update, per block, to the round's reference update's norm, and weigh it by ReLU
    of its cosine with it (FLTrust, Eq. 4 and Algorithm 1)."""

    name = "direction_trust"

    def __init__(self, trust: DirectionTrust, norms: NormBound) -> None:
        self.trust, self.norms = trust, norms  # the norm bound keeps the round's reference update

    def prepare(self, state: Mapping[str, np.ndarray], round: int) -> None:
        """After the norm bound's step prepared the round's reference update."""
        self.trust.begin_round(self.norms.update)

    def apply(self, pending: Pending) -> Pending:
        tensors, factors = self.trust.normalise(pending.tensors, pending.selection)
        scores = self.trust.score(pending.device_id, tensors, pending.selection)
        scored = {"trust": self.trust.named(scores), "normalised": self.trust.named(factors)} if scores else None
        return pending.with_(tensors=tensors, entry_weights=self.trust.entry_weights(tensors, scores), scored=scored)

    def discard(self, device_id: str) -> None:
        self.trust.discard(device_id)

    def finish(self, ctx: RoundContext, result: RoundResult) -> RoundResult:
        """Blocks whose every report had trust 0 kept their value: the round names them (``untrusted``)."""
        untrusted = self.trust.untrusted()
        if untrusted:
            log.warning("round %d: %s", ctx.round, "; ".join(f"{b}: {why}" for b, why in untrusted.items()))
            result.extra["untrusted"] = untrusted
        return result
