"""Secure groups: a secure round's cohort cut into groups of at least g devices, each group its own
SecAgg+ round (its own masking graph: pairwise masks and Shamir shares only within the group), so the
server learns one sum per (group, block) and can bound, weigh and compare those sums as it does updates
(docs/security.md, "Secure groups").

Why groups. A secure round that sums the whole cohort hands the server one block sum: one insider
inside it (a sign flip within the clip, an update that skips the device's clip) moves that sum and the
server has nothing to compare it with. Sums over groups are updates of their own: the server's norm
bound and direction trust (FLTrust, Cao et al. 2021, Algorithm 1: each normalised to the reference
update's norm and weighed by ReLU of its cosine with it) apply to each group's mean, so a group an
insider spoils weighs nothing and the other groups carry the round. The group size g is the dial:
each revealed sum holds at least max(g, t) devices (what a curious server learns is a sum of that
many), and the more groups, the fewer honest devices share the insider's.

Forming groups. The cohort that advertised keys is sorted by split (ties in a random order drawn
afresh each round), then dealt round-robin into k groups, so each group gets its share of every
split's devices; k is the most groups (at most n // g) for which every block that one group would
train securely (at least t trainers) still has at least t trainers in every group, with t the
threshold of the group's graph (SecAgg+'s majority of a neighbourhood, at least 3, or
``secure_threshold``). When no k > 1 keeps that, the cohort is one group: today's round, unchanged.

Weights from the server. A device's weight w_i = min(1, n_i / scale) is fixed by the server from the
sample count registered for the device and sent to it in its ``SecAggPeers`` (``weight``); the device
multiplies its clipped update by it. The server sums the weights of each (group, block)'s survivors
itself and uses that sum, never the decoded weight word; a decoded word that differs from it is
journaled against the group (the word is masked: no single device can be named from it).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from edge_sdk.secagg import Graph, Scope
from edge_sdk.secagg.fixedpoint import Compression
from orchestrator.aggregation.secure.round import LEAST_THRESHOLD, BlockOutcome, NoisePlan, SecureRefusal, SecureRound

__all__ = ["GroupedRound", "group_threshold", "partition"]


def group_threshold(size: int, min_survivors: int = 0) -> int:
    """t of a complete group of ``size`` devices: a majority of its neighbourhood (floor(size / 2) + 1,
    edge_sdk.secagg.graph), at least :data:`LEAST_THRESHOLD` and ``min_survivors``."""
    return max(LEAST_THRESHOLD, min_survivors, size // 2 + 1)


def _deal(order: Sequence[str], k: int) -> list[list[str]]:
    return [list(order[i::k]) for i in range(k)]


def partition(members: Sequence[str], splits: Mapping[str, int], size: int, num_blocks: int, *,
              min_survivors: int = 0, rng: random.Random | None = None) -> list[list[str]]:
    """The cohort's groups (module docstring): the most groups of at least ``size`` devices in which
    every block one group would train securely keeps at least t trainers in each; else one group."""
    if size <= 0 or len(members) < 2 * LEAST_THRESHOLD:
        return [sorted(members, key=str.encode)]
    rng = rng or random.Random()
    shuffled = list(members)
    rng.shuffle(shuffled)
    order = sorted(shuffled, key=lambda m: splits[m])  # stable: ties stay in the random order
    whole = group_threshold(len(order), min_survivors)
    secured = [b for b in range(num_blocks) if sum(splits[m] <= b for m in order) >= whole]
    for k in range(len(order) // max(size, 1), 1, -1):
        groups = _deal(order, k)
        if all(len(g) >= max(size, group_threshold(len(g), min_survivors)) for g in groups) and all(
                sum(splits[m] <= b for m in g) >= group_threshold(len(g), min_survivors)
                for g in groups for b in secured):
            return groups
    return [order]


def _merged(parts: Sequence[Mapping]) -> dict:
    out: dict = {}
    for part in parts:
        out.update(part)
    return out


class GroupedRound:
    """A secure round over groups: one :class:`SecureRound` takes every key advertisement (the key
    stage); when it closes, each group is a :class:`SecureRound` of its own, of the same scope, and
    every later message is routed to its sender's group. With one group it is that first round."""

    def __init__(self, scope: Scope, num_blocks: int, sizes: Mapping[int, int], *, clip: float,
                 identities: Mapping[str, bytes], degree: int = 0, min_survivors: int = 0, group_size: int = 0,
                 compression: Compression | None = None, rng: random.Random | None = None) -> None:
        self.scope, self.num_blocks, self.group_size = scope, num_blocks, group_size
        self._make = lambda: SecureRound(scope, num_blocks, sizes, clip=clip, identities=identities, degree=degree,
                                         min_survivors=min_survivors, compression=compression)
        self.min_survivors, self.rng = min_survivors, rng or random.Random()
        self.lobby = self._make()
        self.groups: list[SecureRound] = [self.lobby]
        self.members: list[list[str]] = []
        self.group_of: dict[str, int] = {}
        self.weights: dict[str, float] = {}  # device -> w_i, fixed by the server
        self.weight_mismatch: dict[int, str] = {}  # group -> why its decoded weight word was set aside
        self._closed = False

    # -- what every group shares ------------------------------------------------------------------
    @property
    def stage(self):  # noqa: ANN201 - SecureStage; every group moves together
        return self.groups[0].stage

    @property
    def keys(self) -> dict:
        return self.lobby.keys

    @property
    def t(self) -> int:
        return min(g.t for g in self.groups)

    @property
    def shared(self) -> dict:
        return _merged([g.shared for g in self.groups])

    @property
    def graph(self) -> Graph | None:
        graphs = [g.graph for g in self.groups if g.graph is not None]
        if not graphs:
            return None
        return Graph(tuple(m for g in graphs for m in g.order), _merged([g.neighbours for g in graphs]),
                     _merged([g.threshold for g in graphs]))

    @property
    def left_out(self) -> dict[str, str]:
        return _merged([self.lobby.left_out, *(g.left_out for g in self.groups)])

    @property
    def unsecured(self) -> dict[int, str]:
        out: dict[int, list[str]] = {}
        for i, g in enumerate(self.groups):
            for b, why in g.unsecured.items():
                out.setdefault(b, []).append(why if len(self.groups) == 1 else f"group {i}: {why}")
        return {b: "; ".join(whys) for b, whys in out.items()}

    @property
    def asked(self) -> dict:
        return _merged([g.asked for g in self.groups])

    @property
    def consents(self) -> dict[str, bytes]:
        return _merged([g.consents for g in self.groups])

    @property
    def blamed(self) -> dict[str, str]:
        return _merged([g.blamed for g in self.groups])

    @property
    def unopened(self) -> dict[str, list[str]]:
        return _merged([g.unopened for g in self.groups])

    def _group(self, device: str) -> SecureRound:
        if device not in self.group_of:
            raise SecureRefusal(f"a message from {device!r}, which is in no group of the round's cohort")
        return self.groups[self.group_of[device]]

    # -- 0: keys ---------------------------------------------------------------------------------
    def advertise(self, device: str, split: int, cipher: bytes, mask: bytes, signature: bytes,
                  commitments: bytes) -> None:
        if self._closed:
            raise SecureRefusal(f"a key advertisement from {device!r} in stage {self.stage.value!r} of the secure "
                                "round, not 'keys'")
        self.lobby.advertise(device, split, cipher, mask, signature, commitments)

    def advertised_cohorts(self) -> dict[int, int]:
        return self.lobby.advertised_cohorts()

    def close_keys(self, *, weight_scale: float, noise: NoisePlan | None = None,
                   weights: Mapping[str, float] | None = None) -> dict[str, dict[str, object]]:
        """Cut the advertised cohort into groups (:func:`partition`), close each group's key stage, and
        add to each member's ``SecAggPeers`` fields its server-fixed ``weight``."""
        keys = self.lobby.keys
        splits = {d: k.split for d, k in keys.items()}
        self.weights = {d: float(weights.get(d, 1.0)) if weights is not None else 1.0 for d in keys}
        groups = partition(sorted(keys, key=str.encode), splits, self.group_size, self.num_blocks,
                           min_survivors=self.min_survivors, rng=self.rng) if keys else []
        if len(groups) > 1:
            self.groups = []
            for members in groups:
                sub = self._make()
                sub.keys.update({d: keys[d] for d in members})  # advertisements the lobby verified
                self.groups.append(sub)
        closed: dict[str, dict[str, object]] = {}
        kept: list[SecureRound] = []
        for sub in self.groups:
            got = sub.close_keys(weight_scale=weight_scale, noise=noise)
            if not got and len(self.groups) > 1:  # left with fewer than 2: its devices are left out
                self.lobby.left_out.update(sub.left_out)
                continue
            self.members.append(sorted(got, key=str.encode))
            for d, fields in got.items():
                self.group_of[d] = len(kept)
                closed[d] = {**fields, "weight": self.weights[d]}
            kept.append(sub)
        self.groups = kept or self.groups[:1]
        self._closed = True
        return closed

    # -- 1, 2: shares and masked uploads ------------------------------------------------------------
    def take_shares(self, device: str, sealed: Mapping[str, bytes]) -> None:
        self._group(device).take_shares(device, sealed)

    def close_shares(self) -> dict[str, dict[str, bytes]]:
        return _merged([g.close_shares() for g in self.groups])

    def take_masked(self, device: str, blocks: Mapping[int, np.ndarray]) -> None:
        self._group(device).take_masked(device, blocks)

    # -- 3: unmasking ----------------------------------------------------------------------------
    def close_uploads(self) -> dict[str, tuple[list[str], list[str], list[int]]]:
        return _merged([g.close_uploads() for g in self.groups])

    def survivor_set(self, device: str) -> list[str]:
        """The survivor set ``device``'s group signs (each group runs its own ConsistencyCheck)."""
        return self._group(device).survivor_set()

    def take_consent(self, device: str, signature: bytes) -> None:
        self._group(device).take_consent(device, signature)

    def consistent(self) -> bool:
        """Whether some group holds t signatures on its survivor set (:meth:`abandon_inconsistent` drops the rest)."""
        return any(g.consistent() for g in self.groups if g.asked or g.consents)

    def abandon_inconsistent(self) -> list[int]:
        """Groups with fewer than t signatures on their survivor set ask for no share; which they are."""
        dropped = [i for i, g in enumerate(self.groups) if g.asked and not g.consistent()]
        for i in dropped:
            self.groups[i].abandon_unmasking()
        return dropped

    def abandon_unmasking(self) -> None:
        for g in self.groups:
            g.abandon_unmasking()

    def signatures_for(self, device: str) -> dict[str, bytes]:
        return self._group(device).signatures_for(device)

    def forget_asked(self, device: str) -> None:
        self._group(device).forget_asked(device)

    def take_reveal(self, device: str, seed_shares: Mapping[str, bytes], key_shares: Mapping[str, bytes]) -> None:
        self._group(device).take_reveal(device, seed_shares, key_shares)

    def finish(self) -> list[BlockOutcome]:
        """Each (group, block)'s outcome, its weight the sum of its survivors' server-fixed weights; a
        decoded weight word that differs from that sum by more than the encoding's error is set aside
        and the group named (:attr:`weight_mismatch`)."""
        outcomes: list[BlockOutcome] = []
        for i, g in enumerate(self.groups):
            for out in g.finish():
                out = replace(out, group=i)
                if out.values is not None:
                    fixed = g.fixed_for(out.block)  # a compressed round's weight word is each block's own
                    server = sum(self.weights.get(u, 1.0) for u in g.cohort(out.block))
                    if abs(out.weight - server) > fixed.weight_error_bound:
                        self.weight_mismatch.setdefault(i, (
                            f"group {i} ({', '.join(self.members[i])}): block {out.block}'s weight word sums to "
                            f"{out.weight:.6g}, not the {server:.6g} the server fixed; the server's sum is used"))
                    out.weight = server
                outcomes.append(out)
        return outcomes
