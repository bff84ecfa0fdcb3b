"""DP-FTRL: noise correlated across rounds by tree aggregation, accounted without sampling
(docs/security.md, "DP-FTRL"; the ``ftrl`` privacy mechanism).

Amplification by sampling needs a secret, uniformly drawn cohort; phones that check in when they are
charging and idle give none. DP-FTRL (Kairouz, McMahan, Song, Thakkar, Thakurta, Xu, 2021,
"Practical and Private (Deep) Learning without Sampling or Shuffling", Algorithm 1) needs only that
each device takes part at most once per tree. Each round t of a tree (per block b):

1. each taken update is clipped to C_b (:class:`FtrlClip`, the server's clip of plain uploads) and
   summed: x_t; a device that already took part in the tree is refused, and the selection leaves it
   out (:meth:`FtrlMechanism.excluded`), so a device reaches a tree's sums at most once;
2. the prefix sum S_t = x_1 + ... + x_t is released through the online binary tree (Algorithm 1's
   ``InitializeTree`` / ``AddToTree`` / ``GetSum``; Honaker's estimator is not used): the dyadic
   intervals that cover [1, t], one node per set bit of t, each node carrying its own
   N(0, (z_b C_b)^2) per coordinate (:class:`TreeNoise`), so that the noise on S_t is the sum of
   popcount(t) node noises and two prefix sums share the noise of the nodes they share;
3. the model is the FTRL iterate (Algorithm 1, line ``theta_t = theta_0 - eta/lambda * (S_t + noise)``
   without the regulariser's rescaling): theta_t = theta_0 + eta (S_t + noise_t) / m_b, where the
   updates are model deltas (the descent direction, hence + not -), theta_0 the model the tree
   began from, eta ``dp_ftrl_lr`` and m_b the block's expected cohort when the tree began (a fixed
   denominator, as DP-FedAvg's);
4. after ``dp_ftrl_epoch`` rounds the tree restarts from the current model (Section 4, "tree
   restarts"): the devices may take part again.

Accounting (:mod:`~orchestrator.aggregation.privacy.accountant`, ``sampling = "tree"``): one device's
update reaches ceil(log2(T + 1)) nodes of a tree of T rounds, so each tree is a Gaussian of
multiplier z composed that many times (Theorem 4.1, Appendix D), per block at z_b and for the model
at the multiplier of every block combined; dp-accounting's tree-aggregation RDP composes the trees.
The plan (:func:`plan_ftrl`) calibrates z from ``dp_target_epsilon`` over the run's trees, and
refuses in one line a schedule whose trees need a device twice (K devices a round for b rounds need
b K <= N devices).

State across rounds. The tree's node noise is secret and model-sized; it is not journaled. A resumed
run restarts the tree from the resumed model: the ledger starts a new tree at that round (step 1),
which is what the restarted mechanism does, and the devices may take part in it once more.

Not here: adaptive clipping (its count would need a tree of its own) and Poisson sampling (DP-FTRL
samples nothing) are refused. Under secure aggregation ``ftrl`` is refused (:attr:`formats_why`): a
node spanning rounds i..t is the un-noised sum x_i + ... + x_t plus one fresh noise, and a secure round
reveals only its own round's sum; the released increment S_t - S_{t-1} would need noise correlated with
the earlier rounds' node noise, which no device (and by design not the server) knows. Doing it takes
noise seeds shared among the devices and hidden from the server, not built here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from orchestrator.aggregation.pipeline import BlockSums, Bound, Pending
from orchestrator.aggregation.privacy.accountant import TREE, BlockRelease, RoundEvent
from orchestrator.aggregation.privacy.calibrate import (PrivacyPlanError, check_cohort, check_delta, default_delta,
                                                        ftrl_epoch, tree_multiplier)
from orchestrator.aggregation.privacy.calibrate import trees as tree_sizes
from orchestrator.aggregation.privacy.central import CentralPlan
from orchestrator.aggregation.privacy.clipping import AdaptiveClip, AdaptiveClipping, ClipAndSum
from orchestrator.aggregation.privacy.mechanism import PrivacyMechanism
from orchestrator.aggregation.privacy.noise import gaussian
from orchestrator.config import ServerConfig
from orchestrator.strategies import RoundContext, RoundResult

__all__ = ["FTRL", "FtrlClip", "FtrlMechanism", "FtrlPlan", "TreeNoise", "plan_ftrl"]

#: Where this mechanism's noise is added, as a run's journaled ledger says.
FTRL = "ftrl"

#: A source of N(0, stddev^2) samples of a shape: the OS CSPRNG's (:func:`~.noise.gaussian`) in a run.
Normal = Callable[[tuple[int, ...], float], np.ndarray]


@dataclass(frozen=True)
class FtrlPlan:
    """A DP-FTRL run's plan: the central plan's multiplier, delta, clips (``central``), the rounds
    per tree and the trees' sizes, and the planned cohort K of the fleet N."""

    central: CentralPlan
    epoch: int
    trees: tuple[int, ...]

    def to_dict(self) -> dict[str, object]:
        return {**self.central.to_dict(), "mechanism": FTRL, "rounds_per_tree": self.epoch, "trees": list(self.trees)}


def plan_ftrl(config: ServerConfig, num_blocks: int) -> FtrlPlan:
    """The DP-FTRL plan of ``config`` over a model of ``num_blocks`` blocks (see the module
    docstring); :class:`PrivacyPlanError` in one line for settings that cannot work."""
    if config.dp_sampling == "poisson":
        raise PrivacyPlanError("dp_mechanism ftrl samples nothing: it is accounted without sampling, not with "
                               "dp_sampling poisson")
    if config.dp_adaptive_clip:
        raise PrivacyPlanError("dp_mechanism ftrl keeps a fixed clip: adaptive clipping's count would need a tree "
                               "of its own")
    fleet = max(1, config.min_devices)
    cohort = min(fleet, max(1, math.ceil(config.fraction * fleet)))
    check_cohort(cohort, f"fraction {config.fraction:g} of --min-devices {fleet}", minimum=config.dp_min_cohort)
    epoch = ftrl_epoch(fleet, cohort, config.rounds, config.dp_ftrl_epoch)
    delta = config.dp_delta if config.dp_delta is not None else default_delta(fleet)
    check_delta(delta, fleet)
    sizes = tuple(tree_sizes(config.rounds, epoch))
    z, target = config.dp_noise_multiplier, config.dp_target_epsilon
    if z is None and target is None:
        raise PrivacyPlanError("dp needs dp_noise_multiplier or dp_target_epsilon (or both)")
    if z is None:
        z = tree_multiplier(target, config.rounds, epoch, delta)
    elif target is not None and z < (needed := tree_multiplier(target, config.rounds, epoch, delta)):
        raise PrivacyPlanError(f"noise multiplier {z:g} spends more than the target {target:g} with DP-FTRL in "
                               f"{config.rounds} rounds (trees of {epoch}): use at least {needed:.4g}")
    central = CentralPlan(float(z), float(delta), target, fleet, cohort, num_blocks, config.dp_clip, None)
    return FtrlPlan(central, epoch, sizes)


@dataclass
class TreeNoise:
    """The online binary tree's noise for one tree (Kairouz et al., 2021, Algorithm 1; Dwork et al.,
    2010; Chan, Shi, Song, 2011): ``stack`` holds the nodes covering [1, t] as (level, noise per
    entry), a node of level l covering 2^l rounds. :meth:`step` adds leaf t + 1: the nodes of equal
    level merge into their parent, which gets noise of its own (the children's is never used
    again), and returns the noise on the prefix sum S_{t+1}, the sum of the stack's nodes."""

    stddevs: Mapping[str, float]
    shapes: Mapping[str, tuple[int, ...]]
    normal: Normal = gaussian
    stack: list[tuple[int, dict[str, np.ndarray]]] = field(default_factory=list)
    steps: int = 0

    def step(self) -> dict[str, np.ndarray]:
        self.steps += 1
        level = 0
        while self.stack and self.stack[-1][0] == level:
            self.stack.pop()
            level += 1
        self.stack.append((level, {k: self.normal(s, self.stddevs[k]) for k, s in self.shapes.items()}))
        return {k: sum(node[k] for _, node in self.stack) for k in self.shapes}


class FtrlClip(ClipAndSum):
    """The server's per-block clip and sum (:class:`~.clipping.ClipAndSum`) that refuses a second
    update of a device in one tree: the participation DP-FTRL's accounting assumes."""

    def __init__(self, block_of: Mapping[str, int], clipping: AdaptiveClipping) -> None:
        super().__init__(block_of, clipping)
        self.participants: set[str] = set()

    def apply(self, pending: Pending) -> Pending:
        if pending.device_id in self.participants:
            return pending.with_(refusal="DP-FTRL: the device took part in this tree already (once per tree)")
        return super().apply(pending)

    def taken(self, pending: Pending) -> None:
        super().taken(pending)
        self.participants.add(pending.device_id)


@dataclass
class _Tree:
    """The open tree: the model it began from, its noise, each block's multiplier and denominator,
    the clipped sums' prefix."""

    start: dict[str, np.ndarray]
    noise: TreeNoise
    z: dict[int, float]
    cohorts: dict[int, float]
    prefix: dict[str, np.ndarray] = field(default_factory=dict)


class FtrlMechanism(PrivacyMechanism):
    """DP-FTRL with tree aggregation, central noise on plain uploads (see the module docstring)."""

    name = FTRL
    mode = FTRL
    formats = frozenset({"plain"})
    formats_why = ("a tree node spanning several rounds is their un-noised sum plus one fresh noise, and a secure "
                   "round reveals only its own round's sum; the devices do not add tree noise shares")

    def __init__(self, config: ServerConfig, blocks: Sequence[str], block_of: Mapping[str, int], *,
                 normal: Normal = gaussian) -> None:
        self.config, self.blocks, self.block_of = config, tuple(blocks), dict(block_of)
        self.ftrl = plan_ftrl(config, len(self.blocks))
        self.plan = self.ftrl.central
        self.normal = normal
        self.clip = FtrlClip(self.block_of, AdaptiveClipping({
            i: AdaptiveClip(self.plan.block_clip, config.dp_target_quantile, config.dp_clip_lr, 0.0)
            for i in range(len(self.blocks))}))
        self.tree: _Tree | None = None

    @property
    def sampling(self) -> str:
        return TREE

    def multipliers(self, expected: Mapping[int, float]) -> dict[int, float]:
        """Each block's multiplier per tree node, z_b: the open tree's (fixed for a tree: its nodes
        are accounted at one multiplier), or, for a new tree, :meth:`block_multipliers` of the
        blocks the round expects (uniform, or the per-block allocation)."""
        return dict(self.tree.z) if self.tree is not None else self.block_multipliers(expected)

    def server_clip(self) -> Bound:
        return self.clip

    def excluded(self) -> frozenset[str]:
        """The devices the round's selection leaves out: those in the open tree already."""
        return frozenset(self.clip.participants)

    def _next_step(self) -> int:
        return 1 if self.tree is None else self.tree.noise.steps + 1

    def releases(self, sums: BlockSums | None, expected: Mapping[int, float]) -> dict[int, BlockRelease]:
        """Every block some idle device can train, at its node multiplier (a zero sum included); a
        block no device could train when the tree began waits for the next tree."""
        z = self.multipliers(expected)
        return {b: BlockRelease(z[b]) for b in expected if b in z}

    def event(self, rate: float, fleet: int, cohort: int, blocks: Mapping[str, BlockRelease]) -> RoundEvent:
        """The round as the tree's step ``t`` (no sampling rate is accounted; ``rate`` is kept as said)."""
        return RoundEvent(min(1.0, rate), blocks, tree_step=self._next_step())

    def _open(self, ctx: RoundContext, expected: Mapping[int, float]) -> _Tree:
        if self.tree is None:
            z = self.multipliers(expected)
            floats = {k: np.asarray(v) for k, v in ctx.global_state.items()
                      if np.asarray(v).dtype.kind == "f" and self.block_of[k] in z}
            stddevs = {k: z[self.block_of[k]] * self.plan.block_clip for k in floats}
            noise = TreeNoise(stddevs, {k: v.shape for k, v in floats.items()}, self.normal)
            self.tree = _Tree({k: v.astype(np.float64) for k, v in floats.items()}, noise, z, dict(expected),
                              {k: np.zeros(v.shape) for k, v in floats.items()})
        return self.tree

    def release(self, ctx: RoundContext, result: RoundResult, sums: BlockSums | None, expected: Mapping[int, float],
                released: Mapping[int, BlockRelease]) -> tuple[dict[str, np.ndarray], dict[str, object]]:
        """Steps 2-4: the tree's next prefix sum, noised, and the FTRL iterate from it."""
        tree = self._open(ctx, expected)
        noise = tree.noise.step()
        state, stddev = dict(result.state), {}
        for name, start in tree.start.items():
            b = self.block_of[name]
            if name in self.clip.sums:
                tree.prefix[name] += self.clip.sums[name]
            if b not in released:
                continue
            m = tree.cohorts[b]
            step = self.config.dp_ftrl_lr * (tree.prefix[name] + noise[name]) / m
            state[name] = np.asarray(start + step, dtype=np.asarray(ctx.global_state[name]).dtype)
            stddev[self.blocks[b]] = tree.noise.stddevs[name] * math.sqrt(len(tree.noise.stack)) / m
        said = {"tree_step": tree.noise.steps, "rounds_per_tree": self.ftrl.epoch, "noise_stddev": stddev,
                "expected_cohorts": {self.blocks[b]: tree.cohorts[b] for b in released},
                "multipliers": {self.blocks[b]: r.noise_multiplier for b, r in released.items()}}
        if tree.noise.steps >= self.ftrl.epoch:  # Section 4's restart: the next round begins a tree
            self.tree = None
            self.clip.participants.clear()
        return state, said

    def withheld(self, ctx: RoundContext, result: RoundResult) -> dict[str, np.ndarray]:
        """No block released: the model keeps its value."""
        return dict(ctx.global_state)
