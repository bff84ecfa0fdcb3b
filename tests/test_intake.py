"""Report intake is one part behind one interface: the server chooses it in one place, the round loop
meets it only through ``ReportIntake``, and it is called in the order the interface documents.

What a replacement (secure aggregation's masked sums, say) relies on: nothing of a report reaches
the strategy except through ``fold``, the round's result comes from ``aggregate``, and the server's
other parts never reach past the interface into the plain intake's checks or bounds.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import numpy as np

from orchestrator.aggregation.combine import StrategyFold
from orchestrator.aggregation.formats import PlainUpload
from orchestrator.aggregation.intake import Intake, ReportIntake
from orchestrator.server import Orchestrator
from tests.factories import server_config
from tests.scripted import scripted_device

ROOT = Path(__file__).resolve().parents[1]


def _intake_uses(tree: ast.AST) -> set[str]:
    """The attributes read of ``<anything>.intake`` in a module."""
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute) and node.value.attr == "intake"}


def test_the_server_meets_report_intake_only_through_its_interface() -> None:
    interface = {name for name in vars(ReportIntake) if not name.startswith("_")}
    used = {}
    for path in sorted(p for package in ("orchestrator", "emulator", "edgetrain")
                       for p in (ROOT / package).rglob("*.py")):
        if path.name != "intake.py":
            for name in _intake_uses(ast.parse(path.read_text(encoding="utf-8"))):
                used.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert {"receive", "fold", "aggregate", "begin_round", "commit"} <= set(used)  # the loop's calls are seen
    beyond = {name: paths for name, paths in used.items() if name not in interface}
    assert not beyond, f"reached past ReportIntake: {beyond}"


class _Recording(ReportIntake):
    """A report intake of its own: every call written down, then handed to the plain intake."""

    def __init__(self, inner: ReportIntake) -> None:
        self.inner = inner
        self.calls: list[tuple[str, object]] = []

    def begin_round(self, state, round):
        self.calls.append(("begin_round", round))
        self.inner.begin_round(state, round)

    def prepare(self, state, round):
        self.calls.append(("prepare", round))
        self.inner.prepare(state, round)

    async def receive(self, session, msg, work, rs):
        self.calls.append(("receive", session.device_id))
        return await self.inner.receive(session, msg, work, rs)

    async def resume(self, session, rs):
        self.calls.append(("resume", session.device_id))
        return await self.inner.resume(session, rs)

    def holds_upload(self, device_id):
        return self.inner.holds_upload(device_id)

    def drop_upload(self, device_id):
        self.inner.drop_upload(device_id)

    def fold(self, session, msg, work, tensors, ctx):
        self.calls.append(("fold", session.device_id))
        return self.inner.fold(session, msg, work, tensors, ctx)

    def aggregate(self, ctx):
        self.calls.append(("aggregate", ctx.round))
        return self.inner.aggregate(ctx)

    def end_round(self):
        self.calls.append(("end_round", None))
        self.inner.end_round()

    def commit(self, round):
        self.calls.append(("commit", round))
        self.inner.commit(round)


class _Server(Orchestrator):
    def report_intake(self, evaluator, heap):
        return _Recording(super().report_intake(evaluator, heap))


def test_a_round_takes_each_report_in_then_aggregates_through_report_intake(tmp_path: Path) -> None:
    """Per round: begin_round, prepare (while the devices train) before any fold, each report received
    then folded, aggregate, end_round, commit; the plain intake behind a wrapper of the interface runs
    the round as it does alone."""
    config = server_config(tmp_path / "s", rounds=2, min_devices=2, deadline_s=30)

    async def main():
        orch = _Server(config)
        ready = asyncio.Event()
        server = asyncio.create_task(orch.run(ready=ready))
        await ready.wait()
        url = f"ws://127.0.0.1:{orch.port}"
        devices = [scripted_device(url, orch, d, {}, lambda n, shape: np.full(shape, 0.01, np.float32))
                   for d in ("a", "b")]
        *acks, history = await asyncio.gather(*devices, server)
        return orch, acks, history

    orch, acks, history = asyncio.run(main())
    assert [h["reported"] for h in history] == [2, 2] and all(a.accepted for device in acks for a in device)
    inner = orch.intake.inner
    assert isinstance(inner, Intake) and isinstance(inner.format, PlainUpload) and isinstance(inner.combiner, StrategyFold)
    calls = orch.intake.calls
    for r in (1, 2):
        start, end = calls.index(("begin_round", r)), calls.index(("commit", r))
        within = calls[start:end + 1]
        assert within[-3:] == [("aggregate", r), ("end_round", None), ("commit", r)]
        for device in ("a", "b"):
            assert within.index(("receive", device)) < within.index(("fold", device))
            assert within.index(("prepare", r)) < within.index(("fold", device))  # the reference exists first
        assert sorted(kind for kind, _ in within[1:-3]) == ["fold", "fold", "prepare", "receive", "receive"]
