"""The round loop: runs ``config.rounds`` rounds as the strategy directs, and commits each one.

One round (docs/architecture.md, "One round"): the strategy's :meth:`~Strategy.configure` chooses
instructions over the idle devices; :meth:`RoundLoop.dispatch` has their payloads prepared
(:mod:`orchestrator.payloads`) and sends them; each report, checked and bounded
(:mod:`orchestrator.reports`), goes to :meth:`~Strategy.on_report` (:meth:`RoundLoop.take_report`),
whose follow-ups are dispatched in turn; the round closes when nothing is outstanding, at its
deadline, or when :meth:`~Strategy.round_complete` says so; :meth:`~Strategy.aggregate` gives the
new state, which is committed only if it passes :meth:`RoundLoop.check_state` and its validation
loss did not jump (:mod:`orchestrator.validation`); else the round runs again from the last good
state (``round_retries`` times, then it is journaled as failed). Each update is bounded in norm per
layer group before the strategy sees it (:mod:`orchestrator.normbound`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

import numpy as np
import torch
from websockets.exceptions import ConnectionClosed

from edge_sdk import protocol as p
from edge_sdk.memory import KeptHeap, release_memory, rss_bytes
from edge_sdk.models import LayeredModel
from edge_sdk.trainer import train_tail
from edge_sdk.training import TrainConfig
from orchestrator.admission import Session
from orchestrator.config import ServerConfig
from orchestrator.evaluate import Evaluator
from orchestrator.normbound import NormBound
from orchestrator.payloads import Payloads, Work, model_at
from orchestrator.reports import Reports, report_info
from orchestrator.rounds import RoundState
from orchestrator.store import Store
from orchestrator.strategies import DeviceReport, Instruction, Refused, RoundContext, RoundResult, Strategy
from orchestrator.validation import RoundValidation

__all__ = ["RoundLoop", "role_counts"]

log = logging.getLogger("edgetrain.server")

Send = Callable[[Session, p.Message], Awaitable[None]]


def role_counts(sessions: Mapping[str, Session], reported: set[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for d in reported:
        s = sessions.get(d)
        role = s.plan.role if s else "gone"
        counts[role] = counts.get(role, 0) + 1
    return counts


#: How much a server keeping its heap between back-to-back rounds may grow past its size after the
#: last trim before the end of a round trims again (RoundLoop._trim_after_round).
ROUND_HEAP_SLACK = 64 << 20


class RoundLoop:
    """The rounds, their bookkeeping and the global state; devices are reached through ``send``."""

    def __init__(self, config: ServerConfig, strategy: Strategy, store: Store, template: LayeredModel,
                 sessions: Mapping[str, Session], payloads: Payloads, reports: Reports, *, send: Send,
                 emit: Callable[[str, dict], None]) -> None:
        self.config, self.strategy, self.store, self.template = config, strategy, store, template
        self.sessions, self.payloads, self.reports = sessions, payloads, reports
        self.send, self.emit = send, emit
        self.evaluator = Evaluator(config, template)
        # The server's own torch work (the reference update, the chunks' check, validation, evaluation)
        # reuses freed buffers while it runs: with a mapping per buffer (the server's setting, so its
        # memory stays flat) every activation is faulted in anew, 3x a ResNet20 evaluation's time.
        self.kept_heap = KeptHeap()
        self._heap_held = False  # kept across back-to-back rounds (_round_heap)
        self._trimmed_rss: int | None = None  # the resident size after the last trim (_trim_after_round)
        self.validator = self.evaluator.subset(config.validation_samples, config.seed)
        self.global_state = {k: v.detach().numpy().copy() for k, v in template.state_dict().items()}
        self.start_round = 1
        self.history: list[dict] = []
        self.round: RoundState | None = None
        self.ctx: RoundContext | None = None
        self.work: dict[str, dict[str, Work]] = {}  # device -> phase -> instruction out this round
        self.changed = asyncio.Event()
        self.bytes = [0, 0]  # sent, received this round
        self.retried: list[str] = []  # why the current round's earlier attempts were not committed
        self.prepare_store()
        self.norms = NormBound(config, template, store, self.reference_update)
        self.validation = RoundValidation(config.max_loss_rise)

    # -- persistence ----------------------------------------------------------------------------
    def prepare_store(self) -> None:
        """Check the store belongs to this run; with ``resume``, continue after its last round."""
        identity = {"model": self.config.model, "strategy": self.strategy.name, "seed": str(self.config.seed)}
        if self.config.resume:
            for key, value in identity.items():
                stored = self.store.get_meta(key)
                if stored is not None and stored != value:
                    raise ValueError(f"--resume: the store at {self.config.store_dir} was a run with {key}={stored}, "
                                     f"not {value}")
            last = self.store.last_completed()
            if last is not None:
                done, state = last
                missing = set(self.global_state) - set(state)
                if missing:
                    raise ValueError(f"checkpoint of round {done} lacks {sorted(missing)[:3]}")
                self.global_state = {k: np.asarray(state[k]).copy() for k in self.global_state}
                self.start_round = done + 1
                self.history = [r.get("metrics", {}) for r in self.store.rounds() if r.get("metrics")]
                log.info("resuming after round %d", done)
        elif any(r["complete"] for r in self.store.rounds()):
            raise ValueError(
                f"{self.config.store_dir} already holds a run; pass --resume to continue it or choose a fresh --store"
            )
        for key, value in identity.items():
            self.store.set_meta(key, value)

    # -- devices --------------------------------------------------------------------------------
    def idle(self) -> list[str]:
        rs = self.round
        return [d for d in self.sessions if rs is None or not rs.expects(d)]

    def idle_count(self) -> int:
        """``len(self.idle())``, without a scan of the registry while no round is open."""
        return len(self.sessions) if self.round is None else len(self.idle())

    async def wait_for_devices(self, needed: int) -> None:
        deadline = time.monotonic() + self.config.wait_devices_s
        while self.idle_count() < needed:  # woken by every hello: O(1) between rounds
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {self.idle_count()} of {needed} devices were ready in time")
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
                    self._round_heap(False)  # about to wait: the kept buffers go back to the OS first
                await self.wait_for_devices(needed)
                if start is not None:
                    await start.wait()
                self._round_heap(True)
                if await self.run_round(r, attempt=attempt, last_try=attempt >= self.config.round_retries):
                    r, attempt = r + 1, 0
                else:
                    attempt += 1
        finally:
            self._round_heap(False)

    def _trim_after_round(self) -> None:
        """The round's payloads and reports are gone: hand their heap back to the OS, unless the
        heap is kept for the next round and the process has grown less than
        :data:`ROUND_HEAP_SLACK` since the last trim (what a steady run keeps is one round's
        buffers; exports and checks of new chunks leave freed memory the next round may not fit
        in, and that is handed back)."""
        if self._heap_held:
            rss = rss_bytes()
            if self._trimmed_rss is not None and rss <= self._trimmed_rss + ROUND_HEAP_SLACK:
                return
        release_memory()
        self._trimmed_rss = rss_bytes() if self._heap_held else None

    def _round_heap(self, keep: bool) -> None:
        """Keep the freed buffers of one round for the next while rounds follow back to back, or hand
        them back (when the server waits, and when it stops). A round's receive buffers are live at
        once (its devices upload together) and, trimmed at every round's end, were faulted in anew
        each round: 9,000 page faults a round of ten mnist_cnn reports, about 3.6 us each. Rounds
        of one run reuse buffers of the same sizes, so what is kept is about one round's working set,
        and never more than :data:`ROUND_HEAP_SLACK` of growth (:meth:`_trim_after_round`)."""
        if keep and not self._heap_held:
            self.kept_heap.acquire()
        elif not keep and self._heap_held:
            self.kept_heap.release()
        self._heap_held = keep
        if not keep:
            self._trimmed_rss = None

    async def run_round(self, r: int, *, attempt: int = 0, last_try: bool = True) -> bool:
        """Run round ``r``; False if its result failed the checks and it should run again."""
        t0, cpu0 = time.monotonic(), time.process_time()
        rs, ctx = self._open(r, attempt)
        await asyncio.to_thread(self.norms.begin_round, self.global_state, r)
        instructions = list(self.strategy.configure(ctx))
        self.store.begin_round(r, sorted({i.device_id for i in instructions}))
        self.emit("round_start", {"round": r, "selected": len({i.device_id for i in instructions})})
        await self.dispatch(instructions)
        while (closed_by := self._closes(rs, ctx, t0)) is None:
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=0.25)
        rs.close()  # an upload that completes during the awaits below is late, not folded into the aggregate
        result = self.strategy.aggregate(ctx)
        candidate = {k: np.asarray(v) for k, v in result.state.items()}
        self.payloads.drop_chunks()  # the round's own are served no more; the candidate's come next
        failure = await asyncio.to_thread(self.check_state, candidate)
        scored: dict[str, float] = {}
        if failure is None:
            failure, scored = await asyncio.to_thread(self.validate, candidate)
        self._journal_capped(r, result)
        if failure is None:
            self.global_state = candidate
        else:
            log.warning("round %d (attempt %d) not committed: %s", r, attempt + 1, failure)
            self.emit("round_failed", {"round": r, "attempt": attempt + 1, "reason": failure,
                                       "devices": list(result.devices)})
        self.round = self.ctx = None
        self.payloads.clear()
        self.work = {}
        self.reports.partial.clear()
        metrics = {**self._metrics(rs, result, attempt, failure), "closed_by": closed_by}
        if failure is not None and not last_try:
            self.retried.append(failure)
            return False
        await self._commit(r, metrics, t0, cpu0, scored if failure is None else {})
        return True

    def _closes(self, rs: RoundState, ctx: RoundContext, opened: float) -> str | None:
        """Why the round closes now, if it does: all answered, the strategy's quorum, the straggler
        grace over, or the deadline. With ``straggler_policy`` grace, once ``straggler_quorum`` of the
        instructions are answered the rest get ``straggler_grace_s``, or as long as that share took
        if longer: a stalled or silent device costs the round at most that, never the deadline."""
        now = time.monotonic()
        if rs.settled():
            return "all"
        if self.strategy.round_complete(ctx):
            return "quorum"
        if self.config.straggler_policy == "grace":
            if rs.grace_end is None and rs.answered_share() >= self.config.straggler_quorum:
                rs.grace_end = now + max(self.config.straggler_grace_s, now - opened)
            if rs.grace_end is not None and now >= rs.grace_end:
                return "grace"
        return "deadline" if now >= rs.deadline else None

    def _open(self, r: int, attempt: int) -> tuple[RoundState, RoundContext]:
        """A new round over the idle devices, serving the global state."""
        self.payloads.begin(self.global_state)
        self.work, self.bytes = {}, [0, 0]
        rs = RoundState(r, deadline=time.monotonic() + self.config.deadline_s, quorum=self.config.quorum)
        ctx = RoundContext(
            round=r, global_state=MappingProxyType(self.global_state),
            devices=MappingProxyType({d: self.sessions[d].info for d in self.idle()}), state=rs,
            blocks=tuple(self.template.block_names), fraction=self.config.fraction,
            seed=self.config.seed + 7919 * attempt,
        )
        self.round, self.ctx = rs, ctx
        return rs, ctx

    def _metrics(self, rs: RoundState, result: RoundResult, attempt: int, failure: str | None) -> dict[str, object]:
        reported = rs.reported()
        return {
            "round": rs.round, "selected": len(rs.selected), "reported": len(reported), "rejected": len(rs.refused()),
            "stragglers": sorted(rs.stragglers()), "over_budget": sorted(rs.skipped()),
            "roles": role_counts(self.sessions, rs.reported("train") or reported),
            "bytes_sent": self.bytes[0], "bytes_received": self.bytes[1],
            # The folded train reports' losses, sample-weighted (those a report does not carry are left out).
            **{k: v for k, v in (("loss_before", result.mean_loss_before), ("loss_after", result.mean_loss_after),
                                 ("loss_steps", result.mean_loss_steps)) if v is not None},
            **{k: v for k, v in result.extra.items() if isinstance(v, (int, float, str, bool, list, dict))},
            "attempt": attempt + 1, **({"failed": failure} if failure else {}),
            **({"retried": list(self.retried)} if self.retried else {}),
        }

    async def _commit(self, r: int, metrics: dict[str, object], t0: float, cpu0: float,
                      scored: Mapping[str, float]) -> None:
        """Evaluate (when due; ``scored``: the committed state's validation scores, if it had one),
        checkpoint and journal round ``r``."""
        eval_s = eval_cpu = 0.0
        if self.config.eval_every and (r % self.config.eval_every == 0 or r == self.config.rounds):
            te, tc = time.monotonic(), time.process_time()
            state = self.global_state
            reuse = scored if self.validator is self.evaluator else {}  # validation scored the whole set
            metrics.update(reuse or await asyncio.to_thread(self._score, self.evaluator, state))
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
            self.norms.commit(r)
            self.validation.committed(scored)
        self.store.complete_round(r, self.global_state, metrics)
        self._trim_after_round()
        # Chunks of past versions are never asked for again: the store on disk keeps a byte budget.
        await asyncio.to_thread(self.payloads.cache.prune_disk, self.config.chunk_disk_bytes)
        self.history.append(metrics)
        self.retried = []
        self.emit("round_end", metrics)

    def _score(self, evaluator: Evaluator, state: Mapping[str, np.ndarray]) -> dict[str, float]:
        """``evaluator``'s scores of the model at ``state`` (blocking)."""
        with self.kept_heap:
            return evaluator.evaluate(model_at(self.template, state))

    def check_state(self, state: dict[str, np.ndarray]) -> str | None:
        """None if ``state`` may become the global model, else why not: every value finite, and
        the frozen chunks the connected devices will need export and verify against torch (they
        are then cached for the next round). Checked before the checkpoint is written, so a
        resumed server never starts from a state that cannot be served."""
        for name, value in state.items():
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                return f"non-finite values in {name}"
        ranges = sorted({(int(a), int(b)) for s in list(self.sessions.values()) for a, b in s.plan.chunks})
        if not ranges or not self.strategy.sends_chunks:  # width reduction sends none
            return None
        with self.kept_heap:  # torch exports and runs the chunks
            return self.payloads.check_chunks(state, ranges)

    def validate(self, state: dict[str, np.ndarray]) -> tuple[str | None, dict[str, float]]:
        """Score ``state`` on the validation samples (blocking): (why it may not be committed, or None;
        its scores). The committed model is scored first if it has not been (round 1, --resume)."""
        if not self.validation.enabled:
            return None, {}
        try:
            if self.validation.loss is None:
                self.validation.committed(self._score(self.validator, self.global_state))
            scored = self._score(self.validator, state)
        except (RuntimeError, ValueError) as exc:  # held-out data the model cannot take: no validation
            log.warning("round validation is off: the model cannot be scored on --data (%s)", exc)
            self.validation.max_rise = 0.0
            return None, {}
        return self.validation.judge(scored), scored

    def reference_update(self, state: Mapping[str, np.ndarray], round: int) -> dict[str, np.ndarray]:
        """The server's own update of the whole model from ``state``, trained on its held-out data
        with the round's settings: the norm reference of layer groups without history
        (:mod:`orchestrator.normbound`; FLTrust's root-dataset update, Cao et al., 2021)."""
        c = self.config
        config = TrainConfig(local_steps=c.local_steps, batch_size=c.batch_size, lr=c.lr_at(round),
                             momentum=c.momentum, weight_decay=c.weight_decay, seed=c.seed + round, eval_samples=64,
                             threads=torch.get_num_threads())
        x, y = self.evaluator.x, self.evaluator.y
        with self.kept_heap:
            return train_tail(model_at(self.template, state), 0, x, y, config).deltas

    def _journal_capped(self, r: int, result: RoundResult) -> None:
        """Mark the reports the weight cap reduced as such in the journal."""
        capped = result.extra.get("weight_capped")
        if not isinstance(capped, dict) or not capped:
            return
        for row in self.store.updates(r):
            if row["device_id"] in capped and row.get("accepted"):
                info = {k: v for k, v in row.items() if k not in ("round", "device_id", "phase", "received")}
                bounded = {**(info.get("bounded") or {}), "weight_kept": capped[row["device_id"]]}
                self.store.record_update(r, row["device_id"], {**info, "bounded": bounded}, phase=row["phase"])

    # -- instructions ---------------------------------------------------------------------------
    async def dispatch(self, instructions: Iterable[Instruction], *, issued: bool = False) -> None:
        """Send the strategy's instructions (payloads prepared first); a device gone meanwhile is missing.

        Every instruction is entered in the round's bookkeeping before the first ``await``, so the
        round cannot be seen as settled while its follow-ups are being prepared.
        """
        batch = list(instructions)
        rs, ctx = self.round, self.ctx
        if not batch or rs is None or ctx is None:
            return
        if not issued:
            for ins in batch:
                rs.issue(ins.device_id, ins.phase)
        prepared = await asyncio.to_thread(self.payloads.prepare, batch, dict(self.sessions), rs.round)
        missing: dict[str, list[str]] = {}
        for session, ins, work in prepared:
            if session is not None and work is None:
                rs.on_skipped(ins.device_id, ins.phase)
                missing.setdefault(ins.device_id, []).append(ins.phase)
                continue
            if session is None or work is None or self.sessions.get(ins.device_id) is not session:
                # Gone before or while its payloads were prepared. If its disconnect already told
                # the strategy (RoundLoop.gone), on_gone finds nothing open and it is not told twice.
                if ins.phase in rs.on_gone(ins.device_id):
                    missing.setdefault(ins.device_id, []).append(ins.phase)
                continue
            self.work.setdefault(ins.device_id, {})[ins.phase] = work
            try:
                await self.send_instruction(session, work)
            except (ConnectionClosed, p.ProtocolError):
                # The connection closed (or is closing: the device said bye or erred) since it was
                # looked up; its handler's cleanup tells the strategy, unless it already has.
                if ins.phase in rs.on_gone(ins.device_id):
                    missing.setdefault(ins.device_id, []).append(ins.phase)
        self.changed.set()
        for device_id, phases in missing.items():
            await self.dispatch(self.strategy.on_missing(device_id, phases, ctx))

    async def send_instruction(self, session: Session, work: Work) -> None:
        """Send ``work`` with the time left in the round."""
        rs = self.round
        assert rs is not None
        await self.send(session, p.Instruction(**{**work.wire.__dict__,
                                                  "deadline_s": max(0.0, rs.deadline - time.monotonic())}))

    def resend(self, session: Session) -> list[Work]:
        """The work a device that came back this round still owes (after a reconnect)."""
        rs = self.round
        if rs is None:
            return []
        return [w for w in self.work.get(session.device_id, {}).values() if rs.expects(session.device_id, w.wire.phase)]

    # -- reports --------------------------------------------------------------------------------
    async def take_report(self, session: Session, msg: p.Report, tensors: dict) -> None:
        """Check a report against the instruction it answers, hand it to the strategy, ack, dispatch follow-ups."""
        rs, ctx = self.round, self.ctx
        work = self.work.get(session.device_id, {}).get(msg.phase)
        if rs is None or ctx is None or msg.round != rs.round or work is None \
                or not rs.expects(session.device_id, msg.phase):
            await self.send(session, p.Ack(msg.round, False, "late: the round is closed", msg.phase))
            self.emit("late", {"device": session.device_id, "round": msg.round, "phase": msg.phase})
            return
        self.reports.check(msg, work, tensors, self.global_state)  # raises: journaled by journal_refusal
        report, follow, accepted, reason, bounded = self._fold(session, msg, work, tensors, ctx)
        rs.on_report(session.device_id, msg.phase, accepted)
        for ins in follow:  # entered before any await: the round is not settled while they are prepared
            rs.issue(ins.device_id, ins.phase)
        self.store.record_update(rs.round, session.device_id, {**report_info(report), "accepted": accepted,
                                                               "reason": reason, **bounded}, phase=msg.phase)
        await self.send(session, p.Ack(rs.round, accepted, reason, msg.phase))
        self.emit("update", {"device": session.device_id, "round": rs.round, "role": session.plan.role,
                             "phase": msg.phase, "accepted": accepted, "reason": reason,
                             "reported": rs.num_reported(), "selected": rs.num_selected})
        await self.dispatch(follow, issued=True)
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
        self.store.record_update(rs.round, device_id, info, phase=msg.phase)
        self.emit("rejected", {"device": device_id, "round": rs.round, "refusal": exc.code, "reason": exc.message})
        self.changed.set()

    def _fold(self, session: Session, msg: p.Report, work: Work, tensors: dict,
              ctx: RoundContext) -> tuple[DeviceReport, Sequence[Instruction], bool, str, dict]:
        """Bound a checked report and hand it to the strategy: (report, follow-ups, accepted, reason,
        what the bounds changed, for the journal: ``{"bounded": {...}}`` or nothing)."""
        # Bounded influence: the weight is at most the sample count registered for the device.
        samples = min(msg.num_samples, self.reports.registered_samples(session))
        bound = self.norms.bound(session.device_id, work.selection.split, tensors)
        changed: dict[str, object] = {}
        if bound.clipped:
            changed["clipped"] = bound.clipped
        if samples < msg.num_samples:
            changed["samples"] = {"claimed": msg.num_samples, "weighed": samples}
        report = DeviceReport(
            device_id=session.device_id, round=ctx.round, phase=msg.phase, role=session.plan.role,
            num_samples=samples, trained=tuple(msg.trained), metrics=MappingProxyType(dict(msg.metrics)),
            tensors=MappingProxyType(bound.tensors), selection=work.selection,
        )
        try:
            if bound.refusal is not None:
                raise Refused(bound.refusal)
            return report, self.strategy.on_report(report, ctx), True, "", {"bounded": changed} if changed else {}
        except Refused as exc:
            self.norms.discard(session.device_id)
            log.info("refused %s's %s report of round %d: %s", session.device_id, msg.phase, ctx.round, exc.reason)
            return report, (), False, exc.reason, {}

    # -- departures -----------------------------------------------------------------------------
    async def on_disconnect(self, device_id: str) -> None:
        """A device's connection ended: its open instructions are missing, unless an upload it was
        sending was cut (then it is awaited for ``upload_resume_s`` to come back and resume)."""
        rs = self.round
        if rs is None or not rs.expects(device_id):
            return
        if device_id in self.reports.partial:
            asyncio.get_running_loop().call_later(self.config.upload_resume_s, self._give_up_upload, device_id,
                                                  rs.round)
            return
        await self.gone(device_id)

    async def gone(self, device_id: str) -> None:
        rs, ctx = self.round, self.ctx
        if rs is None or ctx is None:
            return
        phases = rs.on_gone(device_id)
        if phases:
            await self.dispatch(self.strategy.on_missing(device_id, phases, ctx))

    def _give_up_upload(self, device_id: str, round: int) -> None:
        """The device whose upload was cut has not come back in time: stop waiting for it."""
        rs = self.round
        if rs is not None and rs.round == round and device_id not in self.sessions:
            self.reports.partial.pop(device_id, None)
            asyncio.ensure_future(self.gone(device_id))
            self.changed.set()
