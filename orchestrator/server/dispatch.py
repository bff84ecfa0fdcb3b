"""The round's instructions out: each one's payloads prepared and sent, what is out to each device,
and a device gone meanwhile told to the strategy as missing (docs/architecture.md, "One round", step 5).

:class:`Dispatch` is the round loop's (:mod:`orchestrator.server.roundloop`): the loop opens and closes
rounds, this sends what the strategy asks for within one, and report intake reads what was sent
(``Work``) to bound and check each report against it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

from websockets.exceptions import ConnectionClosed

from edge_sdk import protocol as p
from orchestrator.aggregation.intake import ReportIntake
from orchestrator.parts import Send, Session, Work
from orchestrator.rounds import RoundState
from orchestrator.server.payloads import Payloads
from orchestrator.strategies import Instruction, RoundContext, Strategy

__all__ = ["Dispatch"]


class Dispatch:
    """The instructions out this round (``work``: device -> phase -> :class:`Work`) and their sending.

    ``current``: the open round and its context; ``prepared``: waits for the round's report intake
    preparation; ``changed``: wakes the round loop (something it waits on may have changed); ``sent``:
    told of each instruction as it goes out (the round loop measures devices' speed from it)."""

    def __init__(self, strategy: Strategy, sessions: Mapping[str, Session], payloads: Payloads, intake: ReportIntake,
                 *, send: Send, current: Callable[[], tuple[RoundState | None, RoundContext | None]],
                 prepared: Callable[[], Awaitable[float]], changed: Callable[[], None],
                 sent: Callable[[str, p.Instruction, float], None] | None = None) -> None:
        self.strategy, self.sessions, self.payloads, self.intake = strategy, sessions, payloads, intake
        self.send, self.current, self.prepared, self.changed = send, current, prepared, changed
        self.sent = sent or (lambda device_id, wire, now: None)
        self.work: dict[str, dict[str, Work]] = {}

    def clear(self) -> None:
        """A round opens or ends: nothing is out."""
        self.work = {}

    async def dispatch(self, instructions: Iterable[Instruction], *, issued: bool = False) -> None:
        """Send the strategy's instructions (payloads prepared first); a device gone meanwhile is missing.

        Every instruction is entered in the round's bookkeeping before the first ``await``, so the
        round cannot be seen as settled while its follow-ups are being prepared.
        """
        batch = list(instructions)
        rs, ctx = self.current()
        if not batch or rs is None or ctx is None:
            return
        if not issued:
            for ins in batch:
                rs.issue(ins.device_id, ins.phase)
        await self.prepared()
        if self.current()[0] is not rs:
            return
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
        self.changed()
        for device_id, phases in missing.items():
            await self.dispatch(self.strategy.on_missing(device_id, phases, ctx))

    async def send_instruction(self, session: Session, work: Work) -> None:
        """Send ``work`` with the time left in the round and what report intake adds (a secure round's scope)."""
        rs = self.current()[0]
        assert rs is not None
        extra = self.intake.instruction_config(work)
        now = time.monotonic()
        self.sent(session.device_id, work.wire, now)  # the device's pace is measured from here
        await self.send(session, p.Instruction(**{**work.wire.__dict__,
                                                  "deadline_s": max(0.0, rs.deadline - now),
                                                  **({"config": {**work.wire.config, **extra}} if extra else {})}))

    def of(self, device_id: str, phase: str) -> Work | None:
        """The instruction of ``phase`` out to ``device_id`` this round, if any."""
        return self.work.get(device_id, {}).get(phase)

    def work_of(self, device_id: str) -> list[Work]:
        """The instructions out to ``device_id`` this round."""
        return list(self.work.get(device_id, {}).values())

    def resend(self, session: Session) -> list[Work]:
        """The work a device that came back this round still owes (after a reconnect)."""
        rs = self.current()[0]
        if rs is None:
            return []
        return [w for w in self.work.get(session.device_id, {}).values() if rs.expects(session.device_id, w.wire.phase)]
