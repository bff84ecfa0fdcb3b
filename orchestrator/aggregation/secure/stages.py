"""A secure round's conversation with its devices: the stages a :class:`~orchestrator.aggregation.secure.groups.GroupedRound`
runs through, driven over the connections (docs/security.md, "Secure aggregation").

After training each device of the round sends ``SecAggKeys``; the key stage closes when every device
the round awaits has advertised (or ``secure_stage_s`` after the first advertisement), and each member
gets ``SecAggPeers``; the share stage closes the same way and each member gets ``SecAggInbox``. A masked
upload arrives as the device's report (the combiner, :mod:`.sums`, takes it); when the round stops
taking reports, :meth:`SecureStages.unmask` asks the survivors for their shares and waits up to
``secure_stage_s`` for their answers.

A device the server refuses for the round (late to a stage, left alone in its first block, presumed
dropped and back) gets ``Ack(accepted=false)`` with the reason, journaled; a message that breaks the
protocol (a replayed advertisement, shares for a stranger, an answer for a peer it was not given) is
journaled and answered with an error frame that closes the connection. Nothing received is unpickled or
evaluated: every value is msgpack bytes of a checked size.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edge_sdk import protocol as p
from edge_sdk.secagg import SecAggError
from orchestrator.aggregation.pipeline import registered_samples
from orchestrator.aggregation.secure.groups import GroupedRound
from orchestrator.aggregation.secure.round import NoisePlan, SecureStage
from orchestrator.config import ServerConfig
from orchestrator.parts import Emit, Send, Session, Work
from orchestrator.rounds import RoundState
from orchestrator.store import Store

__all__ = ["RoundAccess", "SecureStages"]

log = logging.getLogger("edgetrain.server")


@dataclass(frozen=True)
class RoundAccess:
    """What a part that talks to devices beyond their reports reads of the server: the open round,
    the train instruction out to a device, the connected devices; how it sends and reports; and how it
    tells selection that a device answered (``alive``: a secure round's message is a sign of life, as a
    late report is: :meth:`orchestrator.rounds.Attendance.alive`)."""

    round_state: Callable[[], RoundState | None]
    work_of: Callable[[str], Work | None]
    sessions: Mapping[str, Session]
    send: Send
    emit: Emit
    alive: Callable[[str], None]


class SecureStages:
    """The key, share and unmasking stages of each secure round, over the devices' connections."""

    def __init__(self, config: ServerConfig, store: Store, access: RoundAccess, *, uniform: bool,
                 plan_noise: Callable[[Mapping[int, int]], NoisePlan | None]) -> None:
        self.config, self.store, self.access = config, store, access
        self.uniform, self.plan_noise = uniform, plan_noise
        self.secure: GroupedRound | None = None
        self._clear()

    def _clear(self) -> None:
        self.secure = None
        self.presumed_dropped: set[str] = set()
        self._timer: asyncio.Task | None = None
        self._answered = asyncio.Event()
        self.cost = {"messages_in": 0, "bytes_in": 0}

    def open(self, secure: GroupedRound) -> None:
        """Round ``secure`` starts taking key advertisements."""
        self.secure = secure

    def close(self) -> None:
        """The round is over: its timers stop, nothing of it is kept."""
        if self._timer is not None:
            self._timer.cancel()
        self._clear()

    def taking(self, device: str) -> bool:
        """Whether ``device``'s masked upload is taken now: in U_1, the uploads open, not presumed dropped."""
        secure = self.secure
        return (secure is not None and device in secure.shared and secure.stage is SecureStage.MASKED
                and device not in self.presumed_dropped)

    # -- the stages -----------------------------------------------------------------------------
    async def on_message(self, session: Session, msg: p.Message) -> None:
        """A device's SecAggKeys, SecAggShares or SecAggReveal."""
        if not isinstance(msg, p.SECAGG_MESSAGES):
            raise p.ProtocolError("unexpected", f"a device may not send {msg.TYPE} here")
        rs, secure, device = self.access.round_state(), self.secure, session.device_id
        # The device answered: whatever becomes of the message, it is not silent. A round that closes in
        # a stage (its deadline) leaves every device of it without a report; were they held out as
        # silent, with nothing more to send that selection counts, no round would select them again.
        self.access.alive(device)
        self.cost["messages_in"] += 1
        self.cost["bytes_in"] += len(p.encode(msg))
        if rs is None or secure is None or getattr(msg, "round", -1) != secure.scope.round:
            return await self._turn_away(session, msg, rs, "its round is not open")
        try:
            if isinstance(msg, p.SecAggKeys):
                await self._keys(session, msg, rs, secure)
            elif isinstance(msg, p.SecAggShares):
                await self._shares(session, msg, rs, secure)
            elif isinstance(msg, p.SecAggReveal) and secure.stage is SecureStage.DONE:
                log.info("secure round %d: %s answered the unmasking after it ended", rs.round, device)
            elif isinstance(msg, p.SecAggReveal) and msg.consent and device not in secure.asked:
                log.info("secure round %d: %s signed the survivor set after its stage closed", rs.round, device)
            elif isinstance(msg, p.SecAggReveal) and msg.consent:
                secure.take_consent(device, msg.consent)
                if set(secure.asked) <= set(secure.consents):
                    self._answered.set()
            elif isinstance(msg, p.SecAggReveal):
                secure.take_reveal(device, msg.seed_shares, msg.key_shares)
                if not secure.asked:
                    self._answered.set()
        except SecAggError as exc:
            self._journal(rs, device, f"secure round: {exc}", closed=True)
            raise p.ProtocolError("refused" if "twice" in str(exc) else "malformed", f"secure round: {exc}") from None

    async def _keys(self, session: Session, msg: p.SecAggKeys, rs: RoundState, secure: GroupedRound) -> None:
        device = session.device_id
        work = self.access.work_of(device)
        if device in self.presumed_dropped or secure.stage is not SecureStage.KEYS or work is None:
            why = "presumed dropped this round" if device in self.presumed_dropped else "the key stage is closed"
            return await self._turn_away(session, msg, rs, why)
        secure.advertise(device, work.selection.split, msg.cipher_public, msg.mask_public, msg.signature,
                         msg.commitments)
        await self._progress(rs)

    async def _shares(self, session: Session, msg: p.SecAggShares, rs: RoundState, secure: GroupedRound) -> None:
        if secure.stage is not SecureStage.SHARES:
            return await self._turn_away(session, msg, rs, "the share stage is closed")
        secure.take_shares(session.device_id, msg.sealed)
        await self._progress(rs)

    async def _progress(self, rs: RoundState) -> None:
        """Close the open stage if every device it awaits has answered (else its timer runs)."""
        secure = self.secure
        if secure is not None and secure.stage is SecureStage.KEYS:
            await self._close_when(rs, set(secure.keys), self._close_keys, rs.selected)
        elif secure is not None and secure.stage is SecureStage.SHARES and secure.graph is not None:
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
        """The cohort is fixed: its weights' scale and the noise its devices add go in with the close."""
        secure = self.secure
        assert secure is not None
        if secure.stage is not SecureStage.KEYS:
            return
        scale = self._weight_scale(secure.keys)
        closed = secure.close_keys(weight_scale=scale, noise=self.plan_noise(secure.advertised_cohorts()),
                                   weights=self._weights(secure.keys, scale))
        for b, why in secure.unsecured.items():  # said once, at the close, not only in the round's outcome
            log.warning("secure round %d: block %d: %s", rs.round, b, why)
        for u, fields in closed.items():
            await self.send_to(u, p.SecAggPeers(round=rs.round, **fields))
        await self._left_out(rs, secure)

    def _weight_scale(self, devices: Mapping[str, object]) -> float:
        """The scale of the devices' weights w = min(1, samples / scale): the largest sample count
        registered for the round's devices (``registered_samples``: what they declared, capped by
        the operator), or, for uniform weighting, one so small that every weight is 1."""
        if self.uniform:
            return 1e-9
        sessions = self.access.sessions
        counts = [registered_samples(self.config, s) for d in devices if (s := sessions.get(d)) is not None]
        return float(max(counts, default=1) or 1)

    def _weights(self, devices: Mapping[str, object], scale: float) -> dict[str, float]:
        """Each device's weight w = min(1, registered samples / scale), fixed by the server (the device
        is told it and multiplies by it; the server sums it itself): 1 for uniform weighting."""
        sessions = self.access.sessions
        return {d: 1.0 if self.uniform or (s := sessions.get(d)) is None
                else min(1.0, registered_samples(self.config, s) / scale) for d in devices}

    async def _close_shares(self, rs: RoundState) -> None:
        secure = self.secure
        assert secure is not None
        if secure.stage is not SecureStage.SHARES:
            return
        for u, sealed in secure.close_shares().items():
            await self.send_to(u, p.SecAggInbox(rs.round, sealed))
        await self._left_out(rs, secure)

    async def _left_out(self, rs: RoundState, secure: GroupedRound) -> None:
        for device, why in list(secure.left_out.items()):
            session = self.access.sessions.get(device)
            if session is not None and rs.expects(device, "train"):
                await self._turn_away(session, None, rs, why)

    async def _turn_away(self, session: Session, msg: p.Message | None, rs: RoundState | None, why: str) -> None:
        """Refuse a device for this round: a negative ack of its train instruction, journaled."""
        device, r = session.device_id, getattr(msg, "round", rs.round if rs else 0)
        if rs is not None and r == rs.round and rs.expects(device, "train"):
            rs.on_report(device, "train", False)
            self._journal(rs, device, f"refused for this secure round: {why}", closed=False)
        if msg is None or isinstance(msg, (p.SecAggKeys, p.SecAggShares)):
            await self.access.send(session, p.Ack(r, False, f"secure round: {why}", "train"))

    def _journal(self, rs: RoundState | None, device: str, reason: str, *, closed: bool, phase: str = "train") -> None:
        log.info("secure round: %s: %s", device, reason)
        if rs is not None:
            self.store.reports.record(rs.round, device, {"accepted": False, "reason": reason, "secure": True,
                                                        "closed": closed}, phase=phase)
            self.access.emit("rejected", {"device": device, "round": rs.round, "refusal": "secure", "reason": reason})

    async def send_to(self, device: str, msg: p.Message) -> None:
        """Send ``msg`` to ``device`` if it is connected; one gone meanwhile is a dropout."""
        session = self.access.sessions.get(device)
        if session is not None:
            try:
                await self.access.send(session, msg)
            except Exception as exc:  # gone meanwhile: it is a dropout
                log.info("secure round: %s left before %s: %s", device, msg.TYPE, exc)

    # -- unmasking ------------------------------------------------------------------------------
    async def unmask(self, ctx_round: int) -> bool:
        """The round stopped taking uploads: ask each survivor for its shares and wait for the answers
        (at most ``secure_stage_s``; SecAgg+ round 3). False if nobody got as far as a masked upload
        (those waiting are released with a negative ack)."""
        secure = self.secure
        assert secure is not None
        if secure.stage in (SecureStage.KEYS, SecureStage.SHARES):
            waiting = secure.keys if secure.stage is SecureStage.KEYS else secure.shared
            why, rs = f"the round closed in its {secure.stage.value} stage", self.access.round_state()
            for device in list(waiting):
                self._journal(rs, device, f"refused for this secure round: {why}", closed=False)
                await self.send_to(device, p.Ack(ctx_round, False, f"secure round: {why}", "train"))
            return False
        asks = secure.close_uploads()
        if not asks:  # no block's survivors reach t: nothing to unmask
            return True
        # ConsistencyCheck (Bonawitz et al. 2017): each survivor signs the survivor set; each then sees
        # the signatures it can check, and answers with shares only if at least t devices signed it.
        await self._ask(ctx_round, {u: p.SecAggUnmask(ctx_round, *ask, secure.survivor_set(u)) for u, ask in asks.items()},
                        lambda: set(secure.asked) <= set(secure.consents))
        if not secure.consistent():
            log.info("secure round %d: %d of %d survivors signed the survivor set, fewer than t = %d: nothing is "
                     "unmasked", ctx_round, len(secure.consents), len(asks), secure.t)
            secure.abandon_unmasking()
            return True
        for group in secure.abandon_inconsistent():
            log.info("secure round %d: group %d: fewer than t survivors signed its survivor set: nothing of it is "
                     "unmasked", ctx_round, group)
        await self._ask(ctx_round, {u: p.SecAggUnmask(ctx_round, *asks[u], secure.survivor_set(u),
                                                      secure.signatures_for(u))
                                    for u in list(secure.asked) if u in secure.consents}, lambda: not secure.asked)
        return True

    async def _ask(self, ctx_round: int, requests: Mapping[str, p.SecAggUnmask], done: Callable[[], bool]) -> None:
        """Send each survivor its request and wait (at most ``secure_stage_s``) until ``done``; a
        survivor gone, or not asked again, is not awaited."""
        secure = self.secure
        assert secure is not None
        self._answered.clear()
        for u in [u for u in secure.asked if u not in requests]:
            secure.forget_asked(u)
        for u, request in requests.items():
            if u in self.access.sessions:
                await self.send_to(u, request)
            else:  # gone since its upload: it cannot answer
                secure.forget_asked(u)
        if not done():
            try:
                await asyncio.wait_for(self._answered.wait(), timeout=self.config.secure_stage_s)
            except asyncio.TimeoutError:
                log.info("secure round %d: %d survivors did not answer the unmasking", ctx_round, len(secure.asked))

    def blame(self) -> None:
        """Journal, after the round's unmasking, whoever sent a wrong share (found against its owner's
        commitment: its other shares were set aside, as a dropped device's) and whose sealed shares a
        holder said did not open (the holder's word: the server cannot open them), each under phase
        ``secagg`` so the device's own report of the round stays as it was."""
        secure, rs = self.secure, self.access.round_state()
        if secure is None or rs is None:
            return
        for device, why in secure.blamed.items():
            self._journal(rs, device, f"secure round: {why}: its shares set aside, treated as dropped",
                          closed=False, phase="secagg")
        for group, why in secure.weight_mismatch.items():  # a masked word: the group, not one device, is named
            self._journal(rs, f"group {group}", f"secure round: {why}", closed=False, phase="secagg")
        for holder, peers in secure.unopened.items():
            for v in peers:
                self._journal(rs, v, f"secure round: its sealed shares did not open for {holder!r}", closed=False,
                              phase="secagg")

    # -- the connection hooks -------------------------------------------------------------------
    def returned(self, session: Session) -> None:
        """A device back in the round it dropped out of: refused for it, journaled (SecAgg+ must
        not see both of its masks); it is selectable again next round."""
        rs = self.access.round_state()
        if rs is not None and session.hello.resume_round == rs.round and session.device_id in self.presumed_dropped:
            self._journal(rs, session.device_id, "refused for this secure round: presumed dropped, it came back",
                          closed=False)

    def refused_frame(self, device_id: str, exc: p.ProtocolError) -> None:
        """A frame of a device in the open secure round failed the codec's checks (an oversized or
        malformed share, say) before any stage saw it: journaled like the stages' refusals; the
        server closes the connection with the error."""
        rs = self.access.round_state()
        if self.secure is not None and self.secure.stage is not SecureStage.DONE and rs is not None \
                and device_id in rs.selected:
            self._journal(rs, device_id, f"secure round: a frame refused: {exc.code} {exc.message[:256]}", closed=True)

    def dropped(self, device_id: str) -> None:
        """A device's connection ended during a secure round it was selected for: it is presumed
        dropped for the round."""
        rs = self.access.round_state()
        if self.secure is not None and self.secure.stage is not SecureStage.DONE and rs is not None \
                and device_id in rs.selected:
            self.presumed_dropped.add(device_id)
            # Once the round loop has marked it gone, a stage that awaited only it closes now, not at its timeout.
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self._recheck(rs)))

    async def _recheck(self, rs: RoundState) -> None:
        if self.access.round_state() is rs:
            await self._progress(rs)
