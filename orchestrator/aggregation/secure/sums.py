"""Secure block sums: the combiner of masked uploads, which applies the strategy's declared mean rule to
sums the server unmasks per block (docs/security.md, "Secure aggregation"; docs/architecture.md,
"Report intake").

Each round gets a fresh :class:`~orchestrator.aggregation.secure.round.SecureRound` (a new scope, so no
signature, seal or mask of another attempt verifies, opens or cancels in it), whose stages
:class:`~orchestrator.aggregation.secure.stages.SecureStages` drives over the connections. A masked
upload from a device of the round's cohort is added to each of its blocks' sums; when the round stops
taking reports the survivors' shares unmask them. The rule is the strategy's, as it declares it
(``Strategy.combines``: a weighted mean of whole blocks, FedAvg's and EmbracingFL's), on sums:
x_{t+1}[k] = x_t[k] + (sum_i w_i delta_i[k]) / (sum_i w_i) over block k's cohort, with w_i =
min(1, n_i / scale) fixed by the device (scale: the largest sample count registered in the round; for
uniform weighting every w_i is 1). The server never holds one device's update.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.secagg import Scope, SecAggError
from edge_sdk.secagg.exchange import BLOCKS_KEY
from edge_sdk.secagg.fixedpoint import Compression
from orchestrator.aggregation.pipeline import BlockSums, Combiner, Pending
from orchestrator.aggregation.secure.groups import GroupedRound
from orchestrator.aggregation.secure.round import BlockOutcome, NoisePlan
from orchestrator.aggregation.secure.stages import RoundAccess, SecureStages
from orchestrator.aggregation.secure.upload import MaskedUpload
from orchestrator.config import ServerConfig
from orchestrator.parts import Folded, Session, Work
from orchestrator.store import Store
from orchestrator.strategies import RoundContext, RoundResult
from orchestrator.strategies.selection import Selection

__all__ = ["SecureSums"]

log = logging.getLogger("edgetrain.server")


class SecureSums(Combiner):
    """Masked uploads in, block sums out, each block's weighted mean of its cohort's updates."""

    def __init__(self, config: ServerConfig, upload: MaskedUpload, store: Store, access: RoundAccess, *,
                 clip: float, uniform: bool, plan_noise: Callable[[Mapping[int, int]], NoisePlan | None]) -> None:
        self.config, self.upload, self.layout, self.clip = config, upload, upload.layout, clip
        self.store = store
        self.stages = SecureStages(config, store, access, uniform=uniform, plan_noise=plan_noise)
        self.secure: GroupedRound | None = None
        self.reports: dict[str, dict[str, object]] = {}
        self.outcomes: list[BlockOutcome] = []
        self.bounded: dict[int, Pending] = {}  # group -> its mean as the sums' bounds left it
        self.unmask_s = 0.0

    # -- a round's life -------------------------------------------------------------------------
    def begin_round(self, state: Mapping[str, np.ndarray], round: int) -> None:
        # A fresh scope for every attempt, in this process or after a restart: no signature, seal or
        # mask of another attempt verifies, opens or cancels in this one.
        scope = Scope(f"{self.config.model}/{self.config.seed}/{os.urandom(12).hex()}", round)
        self.secure = GroupedRound(scope, len(self.layout.block_names), self.layout.sizes, clip=self.clip,
                                   identities=self.store.credentials.identities(), degree=self.config.secure_degree,
                                   min_survivors=self.config.secure_threshold, group_size=self.config.secure_group_size,
                                   compression=Compression(self.config.secure_value_bits)
                                   if self.config.secure_value_bits else None)
        self.stages.open(self.secure)

    def instruction_config(self, work: Work) -> dict[str, p.Scalar]:
        """What a train instruction of a secure round carries: its scope and the blocks in order (the
        clip the devices apply is the chain's ``device_clip``)."""
        if self.secure is None or work.wire.phase != "train":
            return {}
        return {p.SECAGG_KEY: self.secure.scope.session, BLOCKS_KEY: ",".join(self.layout.block_names)}

    def end_round(self) -> None:
        self.stages.close()
        self.secure, self.reports, self.outcomes, self.unmask_s, self.bounded = None, {}, [], 0.0, {}

    # -- the masked uploads ---------------------------------------------------------------------
    @staticmethod
    def _info(session: Session, msg: p.Report) -> dict[str, object]:
        return {"phase": msg.phase, "role": session.plan.role, "trained": list(msg.trained), "secure": True,
                "num_samples": msg.num_samples, "loss_before": msg.metrics.get("loss_before"),
                "loss_after": msg.metrics.get("loss_after")}

    def turned_away(self, session: Session, msg: p.Report) -> Folded | None:
        """A masked upload from a device outside U_1, late, or presumed dropped is refused."""
        if self.stages.taking(session.device_id):
            return None
        reason = "secure round: not in the round's cohort (late, or presumed dropped)"
        return Folded(False, reason, {**self._info(session, msg), "accepted": False, "reason": reason})

    def take(self, session: Session, msg: p.Report, work: Work, pending: Pending, ctx: RoundContext) -> Folded:
        """Add a checked masked upload to its blocks' sums."""
        assert self.secure is not None
        try:
            self.secure.take_masked(session.device_id, self.upload.words(work, pending.tensors))
        except SecAggError as exc:
            raise p.ProtocolError("malformed", f"secure round: {exc}") from None
        info = self.reports[session.device_id] = self._info(session, msg)
        return Folded(True, "", {**info, "accepted": True, "reason": ""})

    # -- unmasking ------------------------------------------------------------------------------
    async def settle(self, ctx: RoundContext) -> None:
        """The round stopped taking uploads: the survivors' shares, then each block unmasked that can be."""
        secure, started = self.secure, time.monotonic()
        if secure is None:
            return
        if not await self.stages.unmask(ctx.round):
            self.outcomes = secure.finish()
            return
        self.outcomes = await asyncio.to_thread(secure.finish)
        self.stages.blame()
        self.unmask_s = time.monotonic() - started

    def sum_updates(self) -> list[Pending]:
        """Each group's mean over its revealed blocks, (sum_i w_i delta_i[k]) / (sum_i w_i) with the
        server's weights, as one update for the sums' bounds (docs/security.md, "Secure groups")."""
        by_group: dict[int, list[BlockOutcome]] = {}
        for out in self.outcomes:
            if out.values is not None and out.weight > 0:
                by_group.setdefault(out.group, []).append(out)
        return [Pending(f"group {g}", Selection.tail(min(o.block for o in outs)),
                        {n: v for o in outs for n, v in self._sums([o]).split(o.block, o.weight).items()},
                        max(1, round(sum(o.weight for o in outs) / len(outs))))
                for g, outs in sorted(by_group.items())]

    def take_sum(self, pending: Pending) -> None:
        self.bounded[int(pending.device_id.split()[-1])] = pending

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        """x[k] + the weighted mean over groups of each group's bounded mean at block k, each group
        weighing its server-fixed weight sum times its trust (one group, unbounded: (sum w_i delta_i[k]) /
        (sum w_i)); a block no group revealed, or every group's trust was 0 for, keeps its value."""
        state = {k: np.asarray(v) for k, v in ctx.global_state.items()}
        contributors = dict.fromkeys(state, 0)
        folded: dict[str, list[tuple[float, np.ndarray, int]]] = {}
        for out in self.outcomes:
            pending = self.bounded.get(out.group)
            if out.values is None or out.weight <= 0 or pending is None or pending.refusal:
                if out.cohort:
                    log.info("secure round %d: group %d, block %d not revealed: %s", ctx.round, out.group, out.block,
                             out.reason or (pending.refusal if pending else "no weight"))
                continue
            for name in self.layout.entries[out.block]:
                weight = out.weight * pending.entry_weights.get(name, 1.0)
                folded.setdefault(name, []).append((weight, np.asarray(pending.tensors[name]), out.cohort))
        for name, parts in folded.items():
            total = sum(w for w, _, _ in parts)
            if total > 0:
                delta = sum(w * d for w, d, _ in parts) / total
                state[name] = np.asarray(state[name] + delta, dtype=state[name].dtype)
                contributors[name] = sum(c for w, _, c in parts if w > 0)
        return RoundResult(ctx.round, state, tuple(self.reports), sum(int(r["num_samples"]) for r in self.reports.values()),
                           contributors, self._roles(), len(ctx.state.refused()), *self._losses(),
                           extra={"secure": self.summary()})

    def block_sums(self) -> BlockSums:
        """The revealed blocks' sums, cohorts and the noise multipliers their survivors' shares gave."""
        return self._sums([o for o in self.outcomes if o.values is not None])

    def _sums(self, revealed: list[BlockOutcome]) -> BlockSums:
        """``revealed``'s sums per block (a block's groups summed: under DP there is one group)."""
        values: dict[int, np.ndarray] = {}
        cohorts: dict[int, int] = {}
        for o in revealed:
            values[o.block] = o.values if o.block not in values else values[o.block] + o.values  # type: ignore[operator]
            cohorts[o.block] = cohorts.get(o.block, 0) + o.cohort
        return BlockSums(values, cohorts, {o.block: o.multiplier for o in revealed}, self.layout.entries,
                         self.layout.shapes)

    def _roles(self) -> dict[str, int]:
        roles: dict[str, int] = {}
        for info in self.reports.values():
            roles[str(info["role"])] = roles.get(str(info["role"]), 0) + 1
        return roles

    def _losses(self) -> tuple[float | None, float | None]:
        """The sample-weighted mean losses the devices reported (metrics, not updates: in the clear)."""
        out = []
        for key in ("loss_before", "loss_after"):
            pairs = [(r[key], r["num_samples"]) for r in self.reports.values() if isinstance(r.get(key), (int, float))]
            total = sum(n for _, n in pairs)  # type: ignore[misc]
            out.append(sum(v * n for v, n in pairs) / total if total else None)  # type: ignore[operator]
        return out[0], out[1]

    def summary(self) -> dict[str, object]:
        """What the round's metrics say of it: secure, each block's cohort, dropouts recovered, cost."""
        secure, stages = self.secure, self.stages
        blocks = {self.layout.block_names[o.block]: _outcome(o) for o in self.outcomes}
        return {"blocks": blocks, "cohort": 0 if secure is None else len(secure.keys),
                "shared": 0 if secure is None else len(secure.shared), "masked": len(self.reports),
                "left_out": {} if secure is None else dict(secure.left_out),
                "threshold": 0 if secure is None else secure.t,
                "blamed": {} if secure is None else dict(secure.blamed),
                "recovered": sorted({d for o in self.outcomes for d in o.recovered}),
                "groups": self._groups(),
                "presumed_dropped": sorted(stages.presumed_dropped), **stages.cost, "unmask_s": self.unmask_s}

    def _groups(self) -> list[dict[str, object]]:
        """Each secure group: its members, and what the sums' bounds did to its mean (trust, clip, refusal)."""
        if self.secure is None:
            return []
        out = []
        for i, members in enumerate(self.secure.members):
            pending = self.bounded.get(i)
            row: dict[str, object] = {"members": members}
            if pending is not None:
                row.update({**pending.scored, **pending.changed, **({"refused": pending.refusal} if pending.refusal else {})})
            if i in self.secure.weight_mismatch:
                row["weight_word"] = self.secure.weight_mismatch[i]
            out.append(row)
        return out

    # -- the conversation beyond reports --------------------------------------------------------
    async def on_message(self, session: Session, msg: p.Message) -> None:
        await self.stages.on_message(session, msg)

    def returned(self, session: Session) -> None:
        self.stages.returned(session)

    def dropped(self, device_id: str) -> None:
        self.stages.dropped(device_id)

    def refused_frame(self, device_id: str, exc: p.ProtocolError) -> None:
        self.stages.refused_frame(device_id, exc)


def _outcome(o: BlockOutcome) -> dict[str, object]:
    return {"cohort": o.cohort, "revealed": o.values is not None, **({"reason": o.reason} if o.reason else {})}
