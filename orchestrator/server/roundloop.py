"""The round loop: runs ``config.rounds`` rounds as the strategy directs, and commits each one.

One round (docs/architecture.md, "One round"): the strategy's :meth:`~Strategy.configure` chooses
instructions over the idle devices; :meth:`RoundLoop.dispatch` has their payloads prepared
(:mod:`orchestrator.server.payloads`) and sends them; each report is taken in by report intake
(:mod:`orchestrator.aggregation.intake`: received, checked, bounded and folded by :meth:`~Strategy.on_report`),
and its follow-ups are dispatched in turn (:meth:`RoundLoop.take_report`); the round closes when
nothing is outstanding, at its deadline, or when :meth:`~Strategy.round_complete` says so; the
aggregate (:meth:`ReportIntake.aggregate`) gives the new state, which is committed only if it
passes its checks (:class:`~orchestrator.server.validation.CommitCheck`: finite, its chunks export, its
validation loss did not jump); else the round runs again from the last good state
(``round_retries`` times, then it is journaled as failed). Between rounds the heap is kept or
handed back (:mod:`orchestrator.server.heap`); where the rounds begin is :mod:`orchestrator.server.resume`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.models import LayeredModel
from orchestrator.aggregation.intake import ReportIntake
from orchestrator.config import ServerConfig
from orchestrator.parts import Emit, RunStart, Send, Session, Traffic, Work
from orchestrator.rounds import Attendance, RoundState, cohort_fraction
from orchestrator.server.dispatch import Dispatch
from orchestrator.server.evaluate import Evaluator
from orchestrator.server.heap import RoundHeap
from orchestrator.server.pace import Paces
from orchestrator.server.payloads import Payloads
from orchestrator.server.validation import CommitCheck
from orchestrator.store import Store
from orchestrator.strategies import RoundContext, RoundResult, Strategy

__all__ = ["RoundHooks", "RoundLoop", "closing", "role_counts", "round_metrics"]

log = logging.getLogger("edgetrain.server")


def role_counts(sessions: Mapping[str, Session], reported: set[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for d in reported:
        s = sessions.get(d)
        role = s.plan.role if s else "gone"
        counts[role] = counts.get(role, 0) + 1
    return counts


def closing(rs: RoundState, ctx: RoundContext, strategy: Strategy, config: ServerConfig, opened: float) -> str | None:
    """Why the round closes now, if it does: all answered, the strategy's quorum, the straggler
    grace over, or the deadline. With ``straggler_policy`` grace, once ``straggler_quorum`` of the
    instructions are answered the rest get ``straggler_grace_s``, or as long as that share took
    if longer: a stalled or silent device costs the round at most that, never the deadline."""
    now = time.monotonic()
    if rs.settled():
        return "all"
    if strategy.round_complete(ctx):
        return "quorum"
    if config.straggler_policy == "grace":
        if rs.grace_end is None and rs.answered_share() >= config.straggler_quorum:
            rs.start_grace(now + max(config.straggler_grace_s, now - opened))
        if rs.grace_end is not None and now >= rs.grace_end:
            return "grace"
    return "deadline" if now >= rs.deadline else None


def round_metrics(rs: RoundState, result: RoundResult, sessions: Mapping[str, Session],
                  traffic: Traffic) -> dict[str, object]:
    """What the journal and the events say of a round: its cohort, reports and refusals, bytes, the
    folded train reports' losses and what its aggregate said of itself."""
    reported = rs.reported()
    return {
        "round": rs.round, "selected": len(rs.selected), "reported": len(reported), "rejected": len(rs.refused()),
        "stragglers": sorted(rs.stragglers()), "over_budget": sorted(rs.skipped()),
        **({"paced": dict(sorted(rs.paced.items()))} if rs.paced else {}),
        "roles": role_counts(sessions, rs.reported("train") or reported),
        "bytes_sent": traffic.sent, "bytes_received": traffic.received,
        # Per device: bytes down and up by payload kind, and those it held and was not sent.
        "bytes": {d: {k: dict(v) for k, v in by.items()} for d, by in traffic.by_device.items()},
        # The folded train reports' losses, sample-weighted (those a report does not carry are left out).
        **{k: v for k, v in (("loss_before", result.mean_loss_before), ("loss_after", result.mean_loss_after),
                             ("loss_steps", result.mean_loss_steps)) if v is not None},
        **{k: v for k, v in result.extra.items() if isinstance(v, (int, float, str, bool, list, dict))},
    }


class RoundHooks:
    """What a round driver says of its rounds, and what a driver of another mode overrides
    (:class:`~orchestrator.server.buffered.BufferedLoop`): what a closed round forgets, what its journal
    line says, which earlier payloads stay servable, whose fetches are served and which instruction a
    report answers. Here, synchronous rounds: everything belongs to the open round."""

    payloads: Payloads
    instructions: Dispatch
    round: RoundState | None
    sessions: Mapping[str, Session]
    traffic: Traffic

    def forget_round(self) -> None:
        self.payloads.clear()
        self.instructions.clear()

    def metrics(self, rs: RoundState, result: RoundResult) -> dict[str, object]:
        return round_metrics(rs, result, self.sessions, self.traffic)

    def kept_payloads(self) -> tuple[str, ...]:
        return ()  # every instruction is of its own round

    def serves_fetch(self, device_id: str, round: int) -> bool:
        return self.round is not None and round == self.round.round and self.round.expects(device_id)

    def work_of(self, device_id: str) -> list[Work]:
        return self.instructions.work_of(device_id)

    def work_for(self, device_id: str, phase: str) -> Work | None:
        return self.instructions.of(device_id, phase)


class RoundLoop(RoundHooks):
    """The rounds, their bookkeeping and the global state; devices are reached through ``send``."""

    def __init__(self, config: ServerConfig, strategy: Strategy, store: Store, template: LayeredModel,
                 sessions: Mapping[str, Session], payloads: Payloads, intake: ReportIntake, *, start: RunStart,
                 evaluator: Evaluator, heap: RoundHeap, traffic: Traffic, send: Send, emit: Emit) -> None:
        self.config, self.strategy, self.store, self.template = config, strategy, store, template
        self.sessions, self.payloads, self.intake = sessions, payloads, intake
        self.heap, self.traffic = heap, traffic
        self.send, self.emit = send, emit
        self.checks = CommitCheck(config, template, strategy, payloads, sessions, evaluator, heap)
        self.global_state = start.state
        self.start_round = start.round
        self.history: list[dict] = start.history
        self.round: RoundState | None = None
        self.ctx: RoundContext | None = None
        self.changed = asyncio.Event()
        #: The instructions out this round: sent, and read by report intake through ``Work``.
        self.pace = Paces.kept(config, store, sessions)  # each device's speed (journaled), the steps that fit a round
        self.instructions = Dispatch(strategy, sessions, payloads, intake, send=send,
                                     current=lambda: (self.round, self.ctx), prepared=self.prepared,
                                     changed=self.changed.set, sent=self.pace.sent)
        self.retried: list[str] = []  # why the current round's earlier attempts were not committed
        self.attendance = Attendance(self.start_round)  # who missed a report: not selected until seen alive
        self._prepared: asyncio.Future[float] | None = None  # the round's ReportIntake.prepare, in a thread

    # -- devices --------------------------------------------------------------------------------
    def idle(self) -> list[str]:
        """Connected devices a new round may select: none it awaits, none known to be silent, none
        resting unless only resting ones are left (:meth:`~orchestrator.rounds.Attendance.choose`)."""
        rs, excluded = self.round, self.intake.excluded()
        return self.attendance.choose(d for d in self.sessions if (rs is None or not rs.expects(d)) and d not in excluded)

    def idle_count(self) -> int:
        """``len(self.idle())``, without a scan of the registry while no round is open and no
        device is held out."""
        if self.round is None and not self.attendance.held_out() and not self.intake.excluded():
            return len(self.sessions)
        return len(self.idle())

    async def wait_for_devices(self, needed: int) -> None:
        """Wait until ``needed`` devices are selectable, saying so every 10 s (a log line and a
        ``waiting`` event); give up after ``wait_devices_s`` (``inf``: never, a service's setting)."""
        start = time.monotonic()
        deadline, said = start + self.config.wait_devices_s, start
        while self.idle_count() < needed:  # woken by every hello: O(1) between rounds
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"only {self.idle_count()} of {needed} devices were ready in time")
            if now - said >= 10.0:
                said = now
                log.warning("waiting for devices: %d of %d ready, %d held out as silent; waited %.0f s of %s",
                            self.idle_count(), needed, self.attendance.held_out(), now - start,
                            f"{self.config.wait_devices_s:.0f} s" if self.config.wait_devices_s != float("inf")
                            else "no limit")
                self.emit("waiting", {"ready": self.idle_count(), "needed": needed, "waited_s": round(now - start, 1)})
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=0.5)

    # -- rounds ---------------------------------------------------------------------------------
    async def run(self, start: asyncio.Event | None = None) -> None:
        """Every round. The first waits for ``min_devices`` to connect (and for ``start``); later
        ones go ahead with whoever is idle, so a fleet that loses a device keeps training. A round
        whose result fails its checks is not committed and runs again from the last good state
        (with another sample of devices); after ``round_retries`` failures it is journaled as
        failed, the model unchanged, and training goes on."""
        r, attempt = self.start_round, 0
        try:
            while r <= self.config.rounds:
                needed = self.config.min_devices if r == self.start_round and not attempt else 1
                if self.idle_count() < needed or (start is not None and not start.is_set()):
                    self.heap.keep(False)  # about to wait: the kept buffers go back to the OS first
                await self.wait_for_devices(needed)
                if start is not None:
                    await start.wait()
                self.heap.keep(True)
                if await self.run_round(r, attempt=attempt, last_try=attempt >= self.config.round_retries):
                    r, attempt = r + 1, 0
                else:
                    attempt += 1
        finally:
            self.heap.keep(False)

    async def run_round(self, r: int, *, attempt: int = 0, last_try: bool = True) -> bool:
        """Run round ``r``; False if its result failed the checks and it should run again."""
        t0, cpu0 = time.monotonic(), time.process_time()
        rs, ctx = self._open(r, attempt)
        closed_by, prepare_s = await self.collect(rs, ctx, t0)
        return await self.step(rs, ctx, closed_by, prepare_s, t0, cpu0, attempt=attempt, last_try=last_try)

    async def collect(self, rs: RoundState, ctx: RoundContext, t0: float) -> tuple[str, float]:
        """Configure the round, send its instructions and take reports until it closes; why it closed
        and how long report intake's preparation took."""
        r = rs.round
        self.intake.begin_round(self.global_state, r)
        instructions = list(self.strategy.configure(ctx))
        instructions, paced = self.pace.plan(instructions) if self.config.straggler_pacing else (instructions, {})
        rs.pace(paced)
        self.store.rounds.begin(r, sorted({i.device_id for i in instructions}))
        self.emit("round_start", {"round": r, "selected": len({i.device_id for i in instructions})})
        self.attendance.round_opened({i.device_id for i in instructions}, r)
        await self.instructions.dispatch(instructions)
        self._prepared = asyncio.ensure_future(asyncio.to_thread(self._prepare, self.global_state, r))
        while (closed_by := closing(rs, ctx, self.strategy, self.config, t0)) is None:
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=0.25)
        rs.close()  # an upload that completes during the awaits below is late, not folded into the aggregate
        prepare_s = await self.prepared()
        self.attendance.round_closed(rs.stragglers(), rs.reported())
        return closed_by, prepare_s

    async def step(self, rs: RoundState, ctx: RoundContext, closed_by: str, prepare_s: float, t0: float,
                   cpu0: float, *, attempt: int, last_try: bool) -> bool:
        """The round's aggregate, checked and committed (or not: False if it should run again)."""
        r = rs.round
        await self.intake.settle(ctx)
        result = self.intake.aggregate(ctx)
        candidate = {k: np.asarray(v) for k, v in result.state.items()}
        self.payloads.drop_chunks()  # the round's own are served no more; the candidate's come next
        failure = await asyncio.to_thread(self.checks.check_state, candidate)
        scored: dict[str, float] = {}
        if failure is None:
            failure, scored = await asyncio.to_thread(self.checks.validate, candidate, self.global_state)
        if failure is None:
            self.global_state = candidate
        else:
            log.warning("round %d (attempt %d) not committed: %s", r, attempt + 1, failure)
            self.emit("round_failed", {"round": r, "attempt": attempt + 1, "reason": failure,
                                       "devices": list(result.devices)})
        self.round = self.ctx = self._prepared = None
        self.forget_round()
        self.intake.end_round()
        metrics = {**self.metrics(rs, result), "attempt": attempt + 1,
                   **({"failed": failure} if failure else {}), **({"retried": list(self.retried)} if self.retried else {}),
                   "closed_by": closed_by, "prepare_s": prepare_s}
        if failure is not None and not last_try:
            self.retried.append(failure)
            return False
        await self._commit(r, metrics, t0, cpu0, scored if failure is None else {})
        return True

    def _prepare(self, state: Mapping[str, np.ndarray], r: int) -> float:
        """:meth:`ReportIntake.prepare` (in a worker thread), timed."""
        t = time.monotonic()
        self.intake.prepare(state, r)
        return time.monotonic() - t

    async def prepared(self) -> float:
        """Wait for the round's :meth:`ReportIntake.prepare` (the seconds it took; 0 outside a round).
        Every fold and every later payload waits for it: what a report is measured against must
        exist, and the server's torch work (its reference training, a payload's export) runs one at a time."""
        return await asyncio.shield(self._prepared) if self._prepared is not None else 0.0

    def _open(self, r: int, attempt: int) -> tuple[RoundState, RoundContext]:
        """A new round over the idle devices, serving the global state."""
        self.payloads.begin(self.global_state, keep=self.kept_payloads())
        self.instructions.clear()
        self.traffic.restart()
        rs = RoundState(r, deadline=time.monotonic() + self.config.deadline_s, quorum=self.config.quorum)
        ctx = RoundContext(
            round=r, global_state=MappingProxyType(self.global_state),
            devices=MappingProxyType({d: self.sessions[d].info for d in self.idle()}), state=rs,
            blocks=tuple(self.template.block_names), fraction=cohort_fraction(self.config.fraction, bool(self.intake.excluded()),
                                                       len(self.idle()), len(self.sessions)),
            seed=None if (seed := self.config.cohort_seed) is None else seed + 7919 * attempt, poisson=self.config.dp and self.config.dp_sampling == "poisson",
        )
        self.round, self.ctx = rs, ctx
        return rs, ctx

    async def _commit(self, r: int, metrics: dict[str, object], t0: float, cpu0: float,
                      scored: Mapping[str, float]) -> None:
        """Evaluate (when due; ``scored``: the committed state's validation scores, if it had one),
        checkpoint and journal round ``r``."""
        eval_s = eval_cpu = 0.0
        final = r == self.config.rounds or self.intake.ends_run()
        if self.config.eval_every and (r % self.config.eval_every == 0 or final):
            te, tc = time.monotonic(), time.process_time()
            metrics.update(await asyncio.to_thread(self.checks.evaluation, self.global_state, scored))
            eval_s, eval_cpu = time.monotonic() - te, time.process_time() - tc
        metrics.update({
            "round_wall_s": time.monotonic() - t0,
            "eval_s": eval_s,
            # The orchestrator's own work this round (CPU of this process: exporting and encoding
            # payloads, streaming, decoding and folding reports, aggregating, checkpointing), with
            # evaluation left out; waiting on devices costs none.
            "server_cpu_s": time.process_time() - cpu0 - eval_cpu,
        })
        if "failed" not in metrics:
            self.intake.commit(r)
            self.checks.committed(scored)
        self.store.transfers.record(r, self.traffic.transfers)
        self.store.rounds.complete(r, self.global_state, metrics)
        self.heap.trim_after_round()
        await asyncio.to_thread(self.payloads.prune_disk, self.config.chunk_disk_bytes)
        self.history.append(metrics)
        self.retried = []
        self.emit("round_end", metrics)

    # -- reports --------------------------------------------------------------------------------
    async def take_report(self, session: Session, msg: p.Report) -> None:
        """A report from a device: taken in by report intake (its upload received and decoded),
        then folded if this round awaits it. A report that breaks the protocol is journaled
        (:meth:`journal_refusal`) and its error raised: the device is disconnected."""
        self.pace.reported(session.device_id, msg, time.monotonic())  # in time or late: its speed is measured
        work = self.work_for(session.device_id, msg.phase)
        try:
            tensors = await self.intake.receive(session, msg, work, self.round)
            await self._fold(session, msg, tensors)
        except p.ProtocolError as exc:  # too large, a broken checksum, garbage, NaN/Inf, ...: journaled
            self.journal_refusal(session.device_id, msg, exc)
            raise

    async def _fold(self, session: Session, msg: p.Report, tensors: Mapping[str, object]) -> None:
        """Fold a received report into the round (report intake checks, bounds and hands it to the
        strategy), journal it, ack it and dispatch its follow-ups; a late one is only acked."""
        await self.prepared()
        rs, ctx = self.round, self.ctx
        work = self.instructions.of(session.device_id, msg.phase)
        if rs is None or ctx is None or msg.round != rs.round or work is None \
                or not rs.expects(session.device_id, msg.phase):
            self.attendance.alive(session.device_id)  # late, but not silent
            await self.send(session, p.Ack(msg.round, False, "late: the round is closed", msg.phase))
            self.emit("late", {"device": session.device_id, "round": msg.round, "phase": msg.phase})
            return
        folded = self.intake.fold(session, msg, work, tensors, ctx)  # raises: journaled by journal_refusal
        rs.on_report(session.device_id, msg.phase, folded.accepted)
        for ins in folded.follow:  # entered before any await: the round is not settled while they are prepared
            rs.issue(ins.device_id, ins.phase)
        self.store.reports.record(rs.round, session.device_id, folded.journal, phase=msg.phase)
        await self.send(session, p.Ack(rs.round, folded.accepted, folded.reason, msg.phase))
        self.emit("update", {"device": session.device_id, "round": rs.round, "role": session.plan.role,
                             "phase": msg.phase, "accepted": folded.accepted, "reason": folded.reason,
                             "reported": rs.num_reported(), "selected": rs.num_selected})
        await self.instructions.dispatch(folded.follow, issued=True)
        self.changed.set()

    def journal_refusal(self, device_id: str, msg: p.Report, exc: p.ProtocolError) -> None:
        """Journal a report refused as malformed, whatever the kind (too large, a broken checksum,
        garbage, NaN/Inf, wrong names or shapes, ...): its connection is then closed. A report of a
        round that is closed has no round to be journaled in; it is logged."""
        rs = self.round
        info = {"accepted": False, "refusal": exc.code, "reason": exc.message, "closed": True,
                "num_samples": msg.num_samples}
        if rs is None or msg.round != rs.round:
            log.warning("refused %s's report of closed round %d: %s %s", device_id, msg.round, exc.code, exc.message)
            return
        if rs.expects(device_id, msg.phase) and exc.code != "timeout":  # a stalled upload is a straggler's
            rs.on_report(device_id, msg.phase, False)
        self.store.reports.record(rs.round, device_id, info, phase=msg.phase)
        self.emit("rejected", {"device": device_id, "round": rs.round, "refusal": exc.code, "reason": exc.message})
        self.changed.set()

    # -- arrivals and departures ----------------------------------------------------------------
    async def arrived(self, session: Session) -> None:
        """A device was welcomed. One that drops mid-round and comes back resumes that round: the
        upload it was sending when its connection dropped, else the work it still owes. A device
        that was silent is selectable again (after its rest, if it stalled repeatedly)."""
        self.attendance.returned(session.device_id, session.hello.resume_round)
        rs = self.round
        if rs is not None and session.hello.resume_round == rs.round and rs.expects(session.device_id):
            rs.on_back(session.device_id)
            resumed = await self.intake.resume(session, rs)
            if resumed is not None:
                await self._fold(session, *resumed)
            else:
                for work in self.instructions.resend(session):
                    await self.instructions.send_instruction(session, work)
        self.changed.set()

    async def on_disconnect(self, device_id: str) -> None:
        """A device's connection ended: its open instructions are missing, unless an upload it was
        sending was cut (then it is awaited for ``upload_resume_s`` to come back and resume)."""
        rs = self.round
        if rs is not None and rs.expects(device_id):
            if self.intake.holds_upload(device_id):
                asyncio.get_running_loop().call_later(self.config.upload_resume_s, self._give_up_upload, device_id,
                                                      rs.round)
            else:
                await self.gone(device_id)
        self.changed.set()

    async def gone(self, device_id: str) -> None:
        rs, ctx = self.round, self.ctx
        if rs is None or ctx is None:
            return
        phases = rs.on_gone(device_id)
        if phases:
            await self.instructions.dispatch(self.strategy.on_missing(device_id, phases, ctx))

    def _give_up_upload(self, device_id: str, round: int) -> None:
        """The device whose upload was cut has not come back in time: stop waiting for it."""
        rs = self.round
        if rs is not None and rs.round == round and device_id not in self.sessions:
            self.intake.drop_upload(device_id)
            asyncio.ensure_future(self.gone(device_id))
            self.changed.set()
