"""Privacy mechanisms written outside the package, each one class, registered with
``@register_mechanism`` (``dp_mechanism = "exact_for_tests"``) or named by reference
(``dp_mechanism = "tests.dp_mechanisms:ExactRelease"``).

:class:`ExactRelease` clips on the server and sums as central DP does, then releases each block's clipped
sum over its expected cohort *without noise*, and records the event its plan would have: a mechanism
that protects nothing, here so that a test can tell exactly what the release step computed and what the
ledger recorded."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from orchestrator.aggregation.pipeline import BlockSums, Bound
from orchestrator.aggregation.privacy.accountant import BlockRelease
from orchestrator.aggregation.privacy.clipping import AdaptiveClip, AdaptiveClipping, ClipAndSum
from orchestrator.aggregation.privacy.mechanism import PrivacyMechanism, register_mechanism
from orchestrator.config import ServerConfig
from orchestrator.strategies import RoundContext, RoundResult

__all__ = ["ExactRelease"]


@register_mechanism("exact_for_tests")
class ExactRelease(PrivacyMechanism):
    """Each block's clipped sum over its expected cohort, un-noised; accounted at the plan's multiplier."""

    name = "exact_for_tests"
    formats = frozenset({"plain"})

    def __init__(self, config: ServerConfig, blocks: Sequence[str], block_of: Mapping[str, int]) -> None:
        super().__init__(config, blocks, block_of)
        self.clip = ClipAndSum(self.block_of, AdaptiveClipping({
            b: AdaptiveClip(self.plan.block_clip) for b in range(len(self.blocks))}))

    def server_clip(self) -> Bound:
        return self.clip

    def releases(self, sums: BlockSums | None, expected: Mapping[int, float]) -> dict[int, BlockRelease]:
        return {b: BlockRelease(self.plan.block_multiplier) for b in expected}

    def release(self, ctx: RoundContext, result: RoundResult, sums: BlockSums | None, expected: Mapping[int, float],
                released: Mapping[int, BlockRelease]) -> tuple[dict[str, np.ndarray], dict[str, object]]:
        state = dict(result.state)
        for name, old in ctx.global_state.items():
            block = self.block_of[name]
            if old.dtype.kind == "f" and block in released:
                total = self.clip.sums.get(name, np.zeros(old.shape))
                state[name] = np.asarray(old.astype(np.float64) + total / expected[block], dtype=old.dtype)
        return state, {"exact": True, "cohorts": {self.blocks[b]: self.clip.counts.get(b, 0) for b in released}}
