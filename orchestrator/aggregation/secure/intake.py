"""Report intake for secure rounds: drives a :class:`~orchestrator.aggregation.secure.round.SecureRound` over the
connections and turns its revealed block sums into the round's state (docs/security.md, "Secure
aggregation"; docs/architecture.md, "Report intake").

The round loop sends each selected device a train instruction whose config names the round's scope
(``secagg_session``: run, round and attempt), the blocks in order and the clip. After training each
device sends ``SecAggKeys``; the key stage closes when every device the round awaits has advertised
(or ``secure_stage_s`` after the first advertisement), and each member gets ``SecAggPeers``; the
share stage closes the same way and each member gets ``SecAggInbox``. A masked upload arrives as
the device's report; the round closes as the round loop says (all in, its quorum, its deadline);
then :meth:`SecureIntake.settle` asks the survivors to unmask and waits up to ``secure_stage_s``
for their answers. :meth:`SecureIntake.aggregate` is the EmbracingFL / FedAvg rule on sums:
x_{t+1}[k] = x_t[k] + (sum_i w_i delta_i[k]) / (sum_i w_i) over block k's cohort, with w_i =
min(1, n_i / scale) fixed by the device (scale: the largest sample count registered in the round).

A device the server refuses for the round (late to a stage, left alone in its first block,
presumed dropped and back) gets ``Ack(accepted=false)`` with the reason, journaled; a message that
breaks the protocol (a replayed advertisement, shares for a stranger, an answer for a peer it was
not given, a malformed masked update) is journaled and answered with an error frame that closes
the connection. Nothing received is unpickled or evaluated: every value is msgpack bytes of a
checked size.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.models import LayeredModel
from edge_sdk.secagg import Scope, SecAggError
from edge_sdk.secagg.exchange import BLOCKS_KEY, CLIP_KEY, upload_name
from edge_sdk.secagg.layout import block_entries, split_vector
from orchestrator.aggregation.intake import PlainIntake
from orchestrator.aggregation.secure.round import BlockOutcome, SecureRound
from orchestrator.config import ServerConfig
from orchestrator.parts import Folded, Session, Work
from orchestrator.rounds import RoundState
from orchestrator.store import Store
from orchestrator.strategies import RoundContext, RoundResult, Strategy

__all__ = ["SecureIntake"]

log = logging.getLogger("edgetrain.server")


class SecureIntake(PlainIntake):
    """Masked uploads in, block sums out; the server never holds one device's update."""

    def __init__(self, config: ServerConfig, template: LayeredModel, strategy: Strategy, store: Store, *,
                 round_state: Callable[[], RoundState | None], work_of: Callable[[str], Work | None],
                 sessions: Mapping[str, Session],
                 send: Callable[[Session, p.Message], Any], emit: Callable[[str, dict], None], **parts: Any) -> None:
        if getattr(strategy, "aggregation", "mean") != "mean":
            raise ValueError(f"secure aggregation: strategy {strategy.name} is set to a robust aggregation, which "
                             "needs individual updates; secure rounds take the weighted mean")
        super().__init__(replace(config, norm_bound=0.0, direction_trust=False), template, strategy, store, **parts)
        self.round_state, self.work_of, self.sessions = round_state, work_of, sessions
        self.send, self.emit = send, emit
        self.uniform = getattr(strategy, "weighting", "samples") == "uniform"
        self.block_names = list(template.block_names)
        state = template.state_dict()
        self.shapes = {n: tuple(t.shape) for n, t in state.items() if t.is_floating_point()}
        self.entries = block_entries(sorted(self.shapes), self.block_names, 0)
        self.sizes = {b: sum(int(np.prod(self.shapes[n], dtype=np.int64)) for n in names)
                      for b, names in self.entries.items()}
        self.secure: SecureRound | None = None
        self._clear()

    def _clear(self) -> None:
        self.secure, self.reports, self.outcomes = None, {}, []
        self.presumed_dropped: set[str] = set()
        self._timer: asyncio.Task | None = None
        self._answered = asyncio.Event()
        self.cost = {"messages_in": 0, "bytes_in": 0, "unmask_s": 0.0}

    # -- a round's life -------------------------------------------------------------------------
    def begin_round(self, state: Mapping[str, np.ndarray], round: int) -> None:
        super().begin_round(state, round)
        # A fresh scope for every attempt, in this process or after a restart: no signature, seal or
        # mask of another attempt verifies, opens or cancels in this one.
        scope = Scope(f"{self.config.model}/{self.config.seed}/{os.urandom(12).hex()}", round)
        self.secure = SecureRound(scope, len(self.block_names), self.sizes, clip=self.config.secure_clip,
                                  identities=self.store.credentials.identities(), weight_scale=1.0,
                                  degree=self.config.secure_degree, min_survivors=self.config.secure_threshold)

    def instruction_config(self, work: Work) -> dict[str, p.Scalar]:
        """What a train instruction of a secure round carries: its scope, the blocks in order, the clip."""
        if self.secure is None or work.wire.phase != "train":
            return {}
        return {p.SECAGG_KEY: self.secure.scope.session, BLOCKS_KEY: ",".join(self.block_names),
                CLIP_KEY: self.config.secure_clip}

    def end_round(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        super().end_round()
        self._clear()

    # -- the stages -----------------------------------------------------------------------------
    async def on_message(self, session: Session, msg: p.Message) -> None:
        """A device's SecAggKeys, SecAggShares or SecAggReveal."""
        rs, secure, device = self.round_state(), self.secure, session.device_id
        self.cost["messages_in"] += 1
        self.cost["bytes_in"] += len(p.encode(msg))
        if rs is None or secure is None or getattr(msg, "round", -1) != secure.scope.round:
            return await self._turn_away(session, msg, rs, "its round is not open")
        try:
            if isinstance(msg, p.SecAggKeys):
                await self._keys(session, msg, rs, secure)
            elif isinstance(msg, p.SecAggShares):
                await self._shares(session, msg, rs, secure)
            elif isinstance(msg, p.SecAggReveal) and secure.stage == "done":
                log.info("secure round %d: %s answered the unmasking after it ended", rs.round, device)
            elif isinstance(msg, p.SecAggReveal):
                secure.take_reveal(device, msg.seed_shares, msg.key_shares)
                if not secure.asked:
                    self._answered.set()
        except SecAggError as exc:
            self._journal(rs, device, f"secure round: {exc}", closed=True)
            raise p.ProtocolError("refused" if "twice" in str(exc) else "malformed", f"secure round: {exc}") from None

    async def _keys(self, session: Session, msg: p.SecAggKeys, rs: RoundState, secure: SecureRound) -> None:
        device = session.device_id
        work = self.work_of(device)
        if device in self.presumed_dropped or secure.stage != "keys" or work is None:
            why = "presumed dropped this round" if device in self.presumed_dropped else "the key stage is closed"
            return await self._turn_away(session, msg, rs, why)
        secure.advertise(device, work.selection.split, msg.cipher_public, msg.mask_public, msg.signature)
        await self._progress(rs)

    async def _shares(self, session: Session, msg: p.SecAggShares, rs: RoundState, secure: SecureRound) -> None:
        if secure.stage != "shares":
            return await self._turn_away(session, msg, rs, "the share stage is closed")
        secure.take_shares(session.device_id, msg.sealed)
        await self._progress(rs)

    async def _progress(self, rs: RoundState) -> None:
        """Close the open stage if every device it awaits has answered (else its timer runs)."""
        secure = self.secure
        if secure is not None and secure.stage == "keys":
            await self._close_when(rs, set(secure.keys), self._close_keys, rs.selected)
        elif secure is not None and secure.stage == "shares" and secure.graph is not None:
            await self._close_when(rs, set(secure.shared), self._close_shares, set(secure.graph.neighbours))

    async def _close_when(self, rs: RoundState, done: set[str], close: Callable[[RoundState], Any],
                          among: set[str]) -> None:
        """Close the stage once every awaited device of ``among`` is in ``done``, else within ``secure_stage_s``."""
        awaited = {d for d in among if rs.expects(d, "train")}
        if awaited <= done:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            await close(rs)
        elif self._timer is None:
            self._timer = asyncio.ensure_future(self._stage_timeout(rs, close))

    async def _stage_timeout(self, rs: RoundState, close: Callable[[RoundState], Any]) -> None:
        await asyncio.sleep(self.config.secure_stage_s)
        self._timer = None
        await close(rs)

    async def _close_keys(self, rs: RoundState) -> None:
        secure = self.secure
        assert secure is not None
        if secure.stage != "keys":
            return
        secure.weight_scale = self._weight_scale(secure.keys)
        self.plan_noise(secure)
        for u, fields in secure.close_keys().items():
            await self._send(u, p.SecAggPeers(round=rs.round, **fields))
        await self._left_out(rs, secure)

    def plan_noise(self, secure: SecureRound) -> None:
        """Before the cohort is sent: the noise each device adds to its blocks (none here; distributed
        DP's intake, ``orchestrator.aggregation.privacy.distributed``, sizes it from the advertised cohorts)."""

    def _weight_scale(self, devices: Mapping[str, object]) -> float:
        """The scale of the devices' weights w = min(1, samples / scale): the largest sample count
        registered for the round's devices (``registered_samples``: what they declared, capped by
        the operator), or, for uniform weighting, one so small that every weight is 1."""
        if self.uniform:
            return 1e-9
        counts = [self.registered_samples(s) for d in devices if (s := self.sessions.get(d)) is not None]
        return float(max(counts, default=1) or 1)

    async def _close_shares(self, rs: RoundState) -> None:
        secure = self.secure
        assert secure is not None
        if secure.stage != "shares":
            return
        for u, sealed in secure.close_shares().items():
            await self._send(u, p.SecAggInbox(rs.round, sealed))
        await self._left_out(rs, secure)

    async def _left_out(self, rs: RoundState, secure: SecureRound) -> None:
        for device, why in list(secure.left_out.items()):
            session = self.sessions.get(device)
            if session is not None and rs.expects(device, "train"):
                await self._turn_away(session, None, rs, why)

    async def _turn_away(self, session: Session, msg: p.Message | None, rs: RoundState | None, why: str) -> None:
        """Refuse a device for this round: a negative ack of its train instruction, journaled."""
        device, r = session.device_id, getattr(msg, "round", rs.round if rs else 0)
        if rs is not None and r == rs.round and rs.expects(device, "train"):
            rs.on_report(device, "train", False)
            self._journal(rs, device, f"refused for this secure round: {why}", closed=False)
        if msg is None or isinstance(msg, (p.SecAggKeys, p.SecAggShares)):
            await self.send(session, p.Ack(r, False, f"secure round: {why}", "train"))

    def _journal(self, rs: RoundState | None, device: str, reason: str, *, closed: bool) -> None:
        log.info("secure round: %s: %s", device, reason)
        if rs is not None:
            self.store.reports.record(rs.round, device, {"accepted": False, "reason": reason, "secure": True,
                                                        "closed": closed}, phase="train")
            self.emit("rejected", {"device": device, "round": rs.round, "refusal": "secure", "reason": reason})

    async def _send(self, device: str, msg: p.Message) -> None:
        session = self.sessions.get(device)
        if session is not None:
            try:
                await self.send(session, msg)
            except Exception as exc:  # gone meanwhile: it is a dropout
                log.info("secure round: %s left before %s: %s", device, msg.TYPE, exc)

    def returned(self, session: Session) -> None:
        """A device back in the round it dropped out of: refused for it, journaled (SecAgg+ must
        not see both of its masks); it is selectable again next round."""
        rs = self.round_state()
        if rs is not None and session.hello.resume_round == rs.round and session.device_id in self.presumed_dropped:
            self._journal(rs, session.device_id, "refused for this secure round: presumed dropped, it came back",
                          closed=False)

    def refused_frame(self, device_id: str, exc: p.ProtocolError) -> None:
        """A frame of a device in the open secure round failed the codec's checks (an oversized or
        malformed share, say) before any stage saw it: journaled like the stages' refusals; the
        server closes the connection with the error."""
        rs = self.round_state()
        if self.secure is not None and self.secure.stage != "done" and rs is not None and device_id in rs.selected:
            self._journal(rs, device_id, f"secure round: a frame refused: {exc.code} {exc.message[:256]}", closed=True)

    def dropped(self, device_id: str) -> None:
        """A device's connection ended during a secure round it was selected for: it is presumed
        dropped for the round."""
        rs = self.round_state()
        if self.secure is not None and self.secure.stage != "done" and rs is not None and device_id in rs.selected:
            self.presumed_dropped.add(device_id)
            # Once the round loop has marked it gone, a stage that awaited only it closes now, not at its timeout.
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self._recheck(rs)))

    async def _recheck(self, rs: RoundState) -> None:
        if self.round_state() is rs:
            await self._progress(rs)

    # -- the masked uploads ---------------------------------------------------------------------
    def update_bound(self, session: Session, work: Work | None) -> int:
        """A masked upload: one int32 word per coordinate of each trained block, plus its weight word."""
        split = work.selection.split if work is not None else session.plan.split
        return 4 * sum(self.sizes[b] + 1 for b in range(split, len(self.block_names))) + (64 << 10)

    def _decoded(self, session: Session, data: bytes) -> dict[str, Any]:
        self.check_revoked(session)
        return p.decode_tensors(data, self.limits)

    def holds_upload(self, device_id: str) -> bool:
        return False  # a cut masked upload is a dropout: the device is presumed dropped for the round

    async def resume(self, session: Session, rs: RoundState) -> None:
        self.uploads.drop(session.device_id)
        return None

    def fold(self, session: Session, msg: p.Report, work: Work, tensors: Any, ctx: RoundContext) -> Folded:
        """Add a masked upload to its blocks' sums; refuse one from a device outside U_1."""
        secure, device = self.secure, session.device_id
        info = {"phase": msg.phase, "role": session.plan.role, "trained": list(msg.trained), "secure": True,
                "num_samples": msg.num_samples, "loss_before": msg.metrics.get("loss_before"),
                "loss_after": msg.metrics.get("loss_after")}
        if secure is None or device not in secure.shared or secure.stage != "masked" or device in self.presumed_dropped:
            reason = "secure round: not in the round's cohort (late, or presumed dropped)"
            return Folded(False, reason, {**info, "accepted": False, "reason": reason})
        split, last = work.selection.split, len(self.block_names)
        if msg.phase != "train" or tuple(msg.trained) != (split, last) or msg.num_samples <= 0:
            raise p.ProtocolError("malformed", f"a secure report trains [{split}, {last}) with samples, got "
                                               f"{tuple(msg.trained)} and {msg.num_samples}")
        expected = {upload_name(b): b for b in range(split, last)}
        if set(tensors) != set(expected) or any(np.asarray(t).dtype != np.dtype("<i4") for t in tensors.values()):
            raise p.ProtocolError("malformed", "a secure report's upload is not int32 ring words named by block")
        try:
            secure.take_masked(device, {b: np.asarray(tensors[n]).view(np.uint32).ravel() for n, b in expected.items()})
        except SecAggError as exc:
            raise p.ProtocolError("malformed", f"secure round: {exc}") from None
        self.reports[device] = info
        return Folded(True, "", {**info, "accepted": True, "reason": ""})

    # -- unmasking ------------------------------------------------------------------------------
    async def settle(self, ctx: RoundContext) -> None:
        """The round stopped taking uploads: ask each survivor for its shares, wait for the answers
        (at most ``secure_stage_s``), and unmask each block that can be (SecAgg+ round 3)."""
        secure, started = self.secure, time.monotonic()
        if secure is None:
            return
        if secure.stage in ("keys", "shares"):  # nobody got as far as a masked upload: release who waits
            waiting = secure.keys if secure.stage == "keys" else secure.shared
            for device in list(waiting):
                await self._send(device, p.Ack(ctx.round, False, f"secure round: the round closed in its "
                                                                 f"{secure.stage} stage", "train"))
            secure.stage = "done"
            self.outcomes = secure.finish()
            return
        self._answered.clear()
        for u, (alive, gone) in secure.close_uploads().items():
            if u in self.sessions:
                await self._send(u, p.SecAggUnmask(ctx.round, alive, gone))
            else:  # gone since its upload: it cannot answer
                secure.asked.pop(u, None)
        if secure.asked:
            try:
                await asyncio.wait_for(self._answered.wait(), timeout=self.config.secure_stage_s)
            except asyncio.TimeoutError:
                log.info("secure round %d: %d survivors did not answer the unmasking", ctx.round, len(secure.asked))
        self.outcomes = await asyncio.to_thread(secure.finish)
        self.cost["unmask_s"] = time.monotonic() - started

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        """x[k] + (sum w_i delta_i[k]) / (sum w_i) for each revealed block; the rest keep their value."""
        state = {k: np.asarray(v) for k, v in ctx.global_state.items()}
        contributors = dict.fromkeys(state, 0)
        for out in self.outcomes:
            if out.values is None or out.weight <= 0:
                if out.cohort:
                    log.info("secure round %d: block %d not revealed: %s", ctx.round, out.block, out.reason)
                continue
            for name, delta in split_vector(out.values / out.weight, self.entries[out.block], self.shapes).items():
                state[name] = np.asarray(state[name] + delta, dtype=state[name].dtype)
                contributors[name] = out.cohort
        return RoundResult(ctx.round, state, tuple(self.reports), sum(r["num_samples"] for r in self.reports.values()),
                           contributors, self._roles(), len(ctx.state.refused()), *self._losses(),
                           extra={"secure": self.summary()})

    def _roles(self) -> dict[str, int]:
        roles: dict[str, int] = {}
        for info in self.reports.values():
            roles[info["role"]] = roles.get(info["role"], 0) + 1
        return roles

    def _losses(self) -> tuple[float | None, float | None]:
        """The sample-weighted mean losses the devices reported (metrics, not updates: in the clear)."""
        out = []
        for key in ("loss_before", "loss_after"):
            pairs = [(r[key], r["num_samples"]) for r in self.reports.values() if isinstance(r.get(key), (int, float))]
            total = sum(n for _, n in pairs)
            out.append(sum(v * n for v, n in pairs) / total if total else None)
        return out[0], out[1]

    def summary(self) -> dict[str, object]:
        """What the round's metrics say of it: secure, each block's cohort, dropouts recovered, cost."""
        secure = self.secure
        blocks = {self.block_names[o.block]: _outcome(o) for o in self.outcomes}
        return {"blocks": blocks, "cohort": 0 if secure is None else len(secure.keys),
                "shared": 0 if secure is None else len(secure.shared), "masked": len(self.reports),
                "left_out": {} if secure is None else dict(secure.left_out),
                "recovered": sorted({d for o in self.outcomes for d in o.recovered}),
                "presumed_dropped": sorted(self.presumed_dropped), **self.cost}


def _outcome(o: BlockOutcome) -> dict[str, object]:
    return {"cohort": o.cohort, "revealed": o.values is not None, **({"reason": o.reason} if o.reason else {})}
