"""Buffered asynchronous rounds (FedBuff, Nguyen et al., AISTATS 2022, Algorithm 1): the round driver of
``round_mode = "buffered"`` (docs/buffered.md), beside the synchronous :class:`RoundLoop`.

Up to ``concurrency`` devices train at once, each on the model version it was sent (its instruction's
``model_version``; the report echoes it). A "round" is a buffer: buffer r serves model version r - 1,
takes every report that arrives while it is open, from whichever version, and closes after
``buffer_size`` folded updates (Algorithm 1's K); its combiner
(:class:`~orchestrator.aggregation.buffered.BufferedFold`) weighs each update by its staleness and steps
the model with the server learning rate; the new version is checked and committed as a synchronous
round's is. A device that reports is sent a model again as soon as it may (Algorithm 1's "sample a
new client"): at once if it did not report into the open buffer yet, else when that buffer closes,
on the version it makes (a device gives a buffer at most one update); nobody is cut for being slow: its update is folded later, staler and weighed less, unless
it is more than ``max_staleness`` versions behind (then it is wasted, and counted).

The parts are the synchronous rounds' own: the strategy's ``configure`` shapes each instruction (over
the devices started now), :class:`~orchestrator.server.dispatch.Dispatch` prepares and sends it,
report intake receives, checks, bounds (per update) and folds it. What differs is what this class
overrides: which devices are idle (not in flight), when a buffer closes, a report of an earlier
version being folded into the open buffer, and the payloads of versions still out kept servable.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from types import MappingProxyType

from edge_sdk import protocol as p
from orchestrator.parts import Session, Work
from orchestrator.rounds import RoundState, sample_devices
from orchestrator.server.roundloop import RoundLoop
from orchestrator.strategies import RoundContext, RoundResult

__all__ = ["BufferedLoop"]


class BufferedLoop(RoundLoop):
    """FedBuff's server loop over the synchronous rounds' parts; ``inflight``: device -> the train
    instruction it is working on (None while it is being prepared)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.inflight: dict[str, Work | None] = {}
        self.folded = 0  # updates folded into the open buffer
        self.wasted: dict[str, int] = {}  # updates lost since the last buffer closed, by why
        self.started = 0  # instructions sent over the run: each fill's sample draws anew
        self.opened = asyncio.Event()  # set while a buffer takes reports (and once the run is over)
        self.over = False  # the last version is made: no buffer opens again

    async def run(self, start: asyncio.Event | None = None) -> None:
        """Every version; then the reports still waiting for a buffer are answered (late: no buffer opens
        again), or their connections' handlers would wait for ever and the server could not close."""
        try:
            await super().run(start)
        finally:
            self.over = True
            self.opened.set()

    # -- devices --------------------------------------------------------------------------------
    def idle(self) -> list[str]:
        """Connected devices not training now, none known to be silent, none that reported into the open
        buffer: a device gives a buffer at most one update, and one that reported trains next on the
        version the buffer makes (sent as soon as it opens)."""
        taken = self.round.selected if self.round is not None else set()
        return [d for d in self.sessions if d not in self.inflight and d not in taken and self.attendance.selectable(d)]

    def idle_count(self) -> int:
        """Devices a buffer can count on: idle, or training (they report into it)."""
        return len(self.idle()) + len(self.inflight)

    def kept_payloads(self) -> tuple[str, ...]:
        """The payloads of every instruction still out: a device may fetch them after the version moved on."""
        return tuple(pid for w in self.inflight.values() if w is not None for pid in w.payload_ids)

    def serves_fetch(self, device_id: str, round: int) -> bool:
        work = self.inflight.get(device_id)
        return work is not None and work.wire.round == round

    def work_of(self, device_id: str) -> list[Work]:
        work = self.inflight.get(device_id)
        return [] if work is None else [work]

    def work_for(self, device_id: str, phase: str) -> Work | None:
        work = self.inflight.get(device_id)
        return work if work is not None and work.wire.phase == phase else None

    def forget_round(self) -> None:
        """The buffer closed: its instructions' records go (those still out are in ``inflight``), its
        payloads stay until the next buffer keeps those still out."""
        self.instructions.clear()

    # -- the buffer -----------------------------------------------------------------------------
    async def collect(self, rs: RoundState, ctx: RoundContext, t0: float) -> tuple[str, float]:
        """Open buffer ``rs.round`` on the current version, keep ``concurrency`` devices training, and
        take reports until ``buffer_size`` are folded (or the deadline passes with at least one)."""
        r = rs.round
        self.intake.begin_round(self.global_state, r)  # a resumed run's first buffer refolds what the journal kept
        restored = self.store.buffer.held(r)
        for row in restored:  # in the buffer already: these devices give it no second update
            rs.issue(row["device_id"], row["phase"])
            rs.on_report(row["device_id"], row["phase"], True)
        self.store.rounds.begin(r, sorted(self.inflight))
        for row in restored:  # the round's journal, begun anew, keeps the restored reports' rows
            self.store.reports.record(r, row["device_id"], {**row["info"]["journal"], "restored": True},
                                      phase=row["phase"])
        self.emit("round_start", {"round": r, "model_version": r - 1, "in_flight": len(self.inflight),
                                  "restored": len(restored)})
        self._prepared = asyncio.ensure_future(asyncio.to_thread(self._prepare, self.global_state, r))
        self.folded = len(restored)
        self.opened.set()
        while (closed_by := self._closing(rs)) is None:
            await self.fill()
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=0.25)
        self.opened.clear()
        rs.close()
        return closed_by, await self.prepared()

    def _closing(self, rs: RoundState) -> str | None:
        """Why the buffer closes now: it holds ``buffer_size`` updates, or the deadline passed with one."""
        if self.folded >= self.config.buffer_size:
            return "buffer"
        return "deadline" if self.folded and time.monotonic() >= rs.deadline else None

    async def fill(self) -> None:
        """Start idle devices on the current version until ``concurrency`` train (Algorithm 1: a
        finished client is replaced at once); the strategy's ``configure`` shapes their instructions."""
        rs, ctx = self.round, self.ctx
        free = self.config.concurrency - len(self.inflight)
        idle = self.idle() if rs is not None and ctx is not None and free > 0 else []
        if not idle:
            return
        self.started += 1
        chosen = sample_devices(idle, 1.0, ctx.round, self.config.seed + self.started, k=min(free, len(idle)))
        window = replace(ctx, devices=MappingProxyType({d: self.sessions[d].info for d in chosen}), fraction=1.0)
        batch = [i for i in self.strategy.configure(window) if i.phase == "train" and i.device_id in window.devices]
        for ins in batch:  # reserved before the first await: a concurrent fill does not start them twice
            self.inflight[ins.device_id] = None
        try:
            await self.instructions.dispatch(batch)
        finally:
            for ins in batch:
                work = self.instructions.of(ins.device_id, "train") if self.round is rs else None
                if work is None:  # skipped, gone, or the buffer closed while it was prepared
                    self.inflight.pop(ins.device_id, None)
                else:
                    self.inflight[ins.device_id] = work

    def metrics(self, rs: RoundState, result: RoundResult) -> dict[str, object]:
        """A buffer's line: the version it made, the staleness it folded, devices still training (not
        stragglers: they fold into a later buffer) and the updates wasted since the last one."""
        metrics = {**super().metrics(rs, result), "stragglers": [], "model_version": rs.round,
                   "in_flight": sum(w is not None for w in self.inflight.values()),
                   "wasted": dict(self.wasted), "wasted_total": sum(self.wasted.values())}
        self.wasted = {}
        return metrics

    def _waste(self, why: str) -> None:
        self.wasted[why] = self.wasted.get(why, 0) + 1

    # -- reports --------------------------------------------------------------------------------
    async def _fold(self, session: Session, msg: p.Report, tensors: dict | MappingProxyType) -> None:
        """Fold a report into the open buffer whatever version it trained on (waiting while a buffer
        closes), journal and ack it, and start the device on the current version."""
        while not self.over:  # a full buffer takes no more: the report waits for the next one
            while not self.over and (self.round is None or not self.opened.is_set()):
                await self.opened.wait()
            if not self.over:
                await self.prepared()
            if self.opened.is_set() and self.round is not None:
                break
        rs, ctx, device = self.round, self.ctx, session.device_id
        work = self.work_for(device, msg.phase)
        if self.over or rs is None or ctx is None or work is None or msg.round != work.wire.round:
            self.attendance.alive(device)
            why = "late: the run is over" if self.over else "late: not an instruction out to this device"
            await self.send(session, p.Ack(msg.round, False, why, msg.phase))
            self.emit("late", {"device": device, "round": msg.round, "phase": msg.phase, "over": self.over})
            return
        if msg.model_version not in (-1, work.wire.model_version):
            raise p.ProtocolError("malformed", f"report.model_version {msg.model_version} is not the instruction's "
                                               f"{work.wire.model_version}")
        if not rs.expects(device, msg.phase):
            rs.issue(device, msg.phase)  # sent by an earlier buffer: this one takes its report
        del self.inflight[device]
        folded = self.intake.fold(session, msg, work, tensors, ctx)  # raises: journaled by journal_refusal
        rs.on_report(device, msg.phase, folded.accepted)
        if folded.accepted:
            self.folded += 1
            if self.folded >= self.config.buffer_size:  # Algorithm 1: the K-th update closes the buffer
                self.opened.clear()
        else:
            self._waste("stale" if str(folded.reason).startswith("stale") else "refused")
        self.store.reports.record(rs.round, device, folded.journal, phase=msg.phase)
        await self.send(session, p.Ack(msg.round, folded.accepted, folded.reason, msg.phase))
        self.emit("update", {"device": device, "round": rs.round, "role": session.plan.role, "phase": msg.phase,
                             "accepted": folded.accepted, "reason": folded.reason,
                             "model_version": work.wire.model_version, "staleness": folded.journal.get("staleness"),
                             "reported": self.folded, "selected": self.config.buffer_size})
        self.changed.set()

    def journal_refusal(self, device_id: str, msg: p.Report, exc: p.ProtocolError) -> None:
        """A malformed report: its work is lost (the connection closes), and journaled as the round's."""
        if self.inflight.pop(device_id, None) is not None:
            self._waste("malformed")
        super().journal_refusal(device_id, msg, exc)

    # -- arrivals and departures ----------------------------------------------------------------
    async def arrived(self, session: Session) -> None:
        """A device was welcomed: it is started at the buffer's next fill."""
        self.attendance.alive(session.device_id)
        self.changed.set()

    async def on_disconnect(self, device_id: str) -> None:
        """A device's connection ended: the work it had out is lost (counted as wasted); it trains anew
        on the current version when it comes back."""
        if device_id in self.inflight:
            self.inflight.pop(device_id)
            self.intake.drop_upload(device_id)
            self._waste("gone")
            await self.gone(device_id)
        self.changed.set()
