"""Drive a multi-phase strategy offline, as the server does: instructions out, one report per
instruction back (made by a function of the test's), follow-ups issued, then aggregate."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

import numpy as np

from orchestrator.rounds import RoundState
from orchestrator.strategies import (
    DeviceInfo,
    DeviceReport,
    Instruction,
    Refused,
    RoundContext,
    RoundResult,
    Strategy,
)

Respond = Callable[[Instruction], DeviceReport]


def context(state: Mapping[str, np.ndarray], devices: Mapping[str, DeviceInfo], blocks: tuple[str, ...],
            round: int = 1, seed: int = 0) -> RoundContext:
    return RoundContext(round=round, global_state=state, devices=dict(devices),
                        state=RoundState(round, deadline=1e18), blocks=blocks, seed=seed)


def drive(strategy: Strategy, ctx: RoundContext, respond: Respond) -> tuple[RoundResult, list[Instruction], list[str]]:
    """One round; returns the result, every instruction issued (in order) and the refusal reasons."""
    queue: deque[Instruction] = deque()
    issued: list[Instruction] = []
    refusals: list[str] = []

    def issue(instructions) -> None:
        for ins in instructions:
            ctx.state.issue(ins.device_id, ins.phase)
            issued.append(ins)
            queue.append(ins)

    issue(strategy.configure(ctx))
    while queue:
        ins = queue.popleft()
        report = respond(ins)
        try:
            follow = strategy.on_report(report, ctx)
        except Refused as e:
            ctx.state.on_report(ins.device_id, ins.phase, False)
            refusals.append(e.reason)
            continue
        ctx.state.on_report(ins.device_id, ins.phase, True)
        issue(follow)
    return strategy.aggregate(ctx), issued, refusals
