"""A new algorithm with a device-side step and a hello field, defined in this file only: a strategy
whose rounds open with a phase no device knows by default (``label_census``), the device's handler
for it, registered into a device registry (edge_sdk.phases), and a per-device value the strategy
declares it needs from the hello (``census.classes``, carried in ``Hello.ext`` and parsed by the
strategy's own parser). It runs through a real orchestrator and real devices over websockets on
127.0.0.1 for two rounds, with no change to protocol, client or server.
The registry's own rules are checked too: immutable, no silent replacement, unknown names refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

from edge_sdk import protocol as p
from edge_sdk.algorithms import DEFAULT_REGISTRY
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.data import load_dataset
from edge_sdk.phases import BUILTIN_REGISTRY, PhaseContext, PhaseResult, SelectionKind
from orchestrator.server import Orchestrator
from orchestrator.strategies import (
    DeviceReport,
    Instruction,
    Refused,
    RoundContext,
    RoundResult,
    Strategy,
    WeightedSums,
)
from orchestrator.strategies.base import HelloContext, HelloField
from orchestrator.strategies.selection import Selection
from tests.factories import server_config

CENSUS = "label_census"
CLASSES = "census.classes"  # the hello field: how many classes the device's census counts


def parse_classes(value: object, context: HelloContext) -> int:
    """The declared class count: a whole number from 1 to 1,000."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
        raise ValueError(f"must be a whole number from 1 to 1000, not {value!r}")
    return value


# -- the algorithm's device side ------------------------------------------------------------------
async def label_census(ctx: PhaseContext) -> PhaseResult:
    """Count the local labels per class (as many classes as the instruction's ``classes``), and score
    the received model on the local data: the census goes to the server, the data does not."""
    classes = int(ctx.instruction.config["classes"])
    counts = np.bincount(ctx.y.astype(np.int64), minlength=classes)
    ctx.notes["census_done"] = 1
    return PhaseResult({**{f"count_{c}": int(n) for c, n in enumerate(counts)}, **await ctx.evaluate()})


def census_note(ctx: PhaseContext, metrics: dict[str, p.Scalar]) -> None:
    """After train: say whether this round's census ran on this device first (a round note)."""
    metrics["after_census"] = int(ctx.notes.get("census_done", 0))


REGISTRY = DEFAULT_REGISTRY.extended(phases={CENSUS: label_census}, after={"train": census_note})


# -- the algorithm's server side ------------------------------------------------------------------
class CensusThenTrain(Strategy):
    """Each round: a label census on every device, then a train follow-up for the devices whose data
    holds more than one class; their updates are averaged by sample count."""

    name = "census-then-train"
    hello_fields = MappingProxyType({CLASSES: HelloField(parse_classes, description="classes to count")})

    def __init__(self) -> None:
        self.declared: dict[str, object] = {}
        self.census: dict[int, dict[str, dict[str, float]]] = {}
        self.trained_after_census: dict[int, dict[str, int]] = {}
        self._sums: WeightedSums | None = None
        self._trainers: list[str] = []

    def configure(self, ctx: RoundContext) -> Sequence[Instruction]:
        self._sums, self._trainers = WeightedSums(ctx.global_state), []
        self.census[ctx.round], self.trained_after_census[ctx.round] = {}, {}
        self.declared.update({d: info.ext.get(CLASSES) for d, info in ctx.devices.items()})
        return [Instruction(d, CENSUS, Selection.tail(0), config={"classes": ctx.devices[d].ext.get(CLASSES, 2)})
                for d in ctx.sample()]

    def on_report(self, report: DeviceReport, ctx: RoundContext) -> Sequence[Instruction]:
        assert self._sums is not None
        if report.phase == CENSUS:
            counts = {k: report.metric(k) for k in report.metrics if k.startswith("count_")}
            self.census[ctx.round][report.device_id] = {**counts, "loss": report.metric("loss")}
            if sum(n > 0 for n in counts.values()) < 2:
                return ()
            self._trainers.append(report.device_id)
            return [Instruction(report.device_id, "train", report.selection)]
        if report.phase == "train":
            self.trained_after_census[ctx.round][report.device_id] = int(report.metric("after_census"))
            self._sums.add_report(report, float(report.num_samples))
            return ()
        raise Refused(f"unexpected phase {report.phase!r}")

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        assert self._sums is not None
        return self._sums.result(ctx.round, 0, extra={"trainers": sorted(self._trainers)})


async def _run(tmp_path: Path) -> tuple[CensusThenTrain, list[dict], list[DeviceClient], dict, dict]:
    config = server_config(tmp_path / "store", rounds=2, min_devices=3, local_steps=3, batch_size=8, lr=0.1,
                           deadline_s=60)
    strategy = CensusThenTrain()
    orch = Orchestrator(config, strategy=strategy)
    initial = {k: v.copy() for k, v in orch.global_state.items()}
    ready = asyncio.Event()
    server = asyncio.create_task(orch.run(ready=ready))
    await ready.wait()
    data = load_dataset("synthetic", split="train")
    ones = np.flatnonzero(data.y == 1)[:30]  # a device holding one class only: no train follow-up
    shards = {"mixed-0": np.arange(0, 40), "mixed-1": np.arange(40, 80), "ones-2": ones}
    clients = [DeviceClient(DeviceSettings(server=f"ws://127.0.0.1:{orch.port}", device_id=d, budget_bytes=1 << 30,
                                         backend="torch", registry=REGISTRY, hello_ext={CLASSES: 2}),
                               data.x[idx], data.y[idx])
               for d, idx in shards.items()]
    await asyncio.wait_for(asyncio.gather(*(c.run() for c in clients)), 120)
    history = await asyncio.wait_for(server, 60)
    final = {k: v.copy() for k, v in orch.global_state.items()}
    labels = {d: data.y[idx] for d, idx in shards.items()}
    return strategy, history, clients, labels, {"initial": initial, "final": final}


def test_a_strategy_and_device_step_defined_in_a_test_run_two_rounds(tmp_path: Path) -> None:
    strategy, history, clients, labels, states = asyncio.run(_run(tmp_path))
    assert [h["round"] for h in history] == [1, 2]
    assert strategy.declared == {d: 2 for d in labels}  # the hello field, parsed by the strategy's parser
    for r in (1, 2):
        # The device step ran on every device, and its metrics reached the strategy: the census is
        # the test's own count of each device's labels.
        census = strategy.census[r]
        assert set(census) == set(labels)
        for device, y in labels.items():
            assert census[device]["count_0"] == float(np.sum(y == 0))
            assert census[device]["count_1"] == float(np.sum(y == 1))
            assert np.isfinite(census[device]["loss"])  # the handler used the device's own evaluation
        # Its reports decided who trained; the train reports carry the hook's note of the round.
        assert history[r - 1]["trainers"] == ["mixed-0", "mixed-1"]
        assert strategy.trained_after_census[r] == {"mixed-0": 1, "mixed-1": 1}
    phases = {c.config.device_id: [(r.round, r.phase) for r in c.reports] for c in clients}
    assert phases["ones-2"] == [(1, CENSUS), (2, CENSUS)]
    assert phases["mixed-0"] == [(1, CENSUS), (1, "train"), (2, CENSUS), (2, "train")]
    assert any(not np.array_equal(states["initial"][k], states["final"][k]) for k in states["initial"])


def test_a_device_without_the_step_refuses_the_phase_by_name(tmp_path: Path) -> None:
    """A device on the default registry does not know the test's phase: it stops with an error naming
    the phase (sent to the server as an ``Error`` message too); the device that knows it finishes the round."""

    async def run() -> tuple[list[dict], BaseException | None, CensusThenTrain]:
        config = server_config(tmp_path / "store", min_devices=2, local_steps=2, batch_size=8, lr=0.1, deadline_s=60)
        strategy = CensusThenTrain()
        orch = Orchestrator(config, strategy=strategy)
        ready = asyncio.Event()
        server = asyncio.create_task(orch.run(ready=ready))
        await ready.wait()
        data = load_dataset("synthetic", split="train")
        url = f"ws://127.0.0.1:{orch.port}"
        knows = DeviceClient(DeviceSettings(server=url, device_id="knows-0", budget_bytes=1 << 30, backend="torch",
                                          registry=REGISTRY), data.x[:40], data.y[:40])
        plain = DeviceClient(DeviceSettings(server=url, device_id="plain-1", budget_bytes=1 << 30, backend="torch"),
                             data.x[40:80], data.y[40:80])
        outcomes = await asyncio.wait_for(asyncio.gather(knows.run(), plain.run(), return_exceptions=True), 120)
        return await asyncio.wait_for(server, 60), outcomes[1], strategy

    history, plain_outcome, strategy = asyncio.run(run())
    assert isinstance(plain_outcome, p.ProtocolError) and "does not know the phase 'label_census'" in str(plain_outcome)
    assert [h["round"] for h in history] == [1] and history[0]["trainers"] == ["knows-0"]
    assert set(strategy.census[1]) == {"knows-0"}


# -- the registry's rules ---------------------------------------------------------------------------
def test_extending_a_registry_leaves_the_original_as_it_was() -> None:
    extended = BUILTIN_REGISTRY.extended(phases={CENSUS: label_census}, selections={"odd": SelectionKind()})
    assert CENSUS in extended.phases and CENSUS not in BUILTIN_REGISTRY.phases
    assert "odd" in extended.selections and "odd" not in BUILTIN_REGISTRY.selections
    assert set(BUILTIN_REGISTRY.phases) == {"train", "evaluate", "compare"}
    with pytest.raises(TypeError):
        BUILTIN_REGISTRY.phases["x"] = label_census  # type: ignore[index]


def test_a_registered_name_is_not_replaced_silently() -> None:
    with pytest.raises(ValueError, match="phase 'train' is already registered"):
        DEFAULT_REGISTRY.extended(phases={"train": label_census})
    with pytest.raises(ValueError, match="selection 'channels' is already registered"):
        DEFAULT_REGISTRY.extended(selections={"channels": SelectionKind()})
    with pytest.raises(ValueError, match="non-empty string"):
        DEFAULT_REGISTRY.extended(phases={"": label_census})


def test_hooks_run_in_the_order_they_were_added() -> None:
    first = DEFAULT_REGISTRY.hooks["train"]
    extended = DEFAULT_REGISTRY.extended(after={"train": census_note})
    assert extended.hooks["train"] == (*first, census_note)
    assert DEFAULT_REGISTRY.hooks["train"] == first


def test_the_default_registry_holds_the_algorithms_device_steps() -> None:
    """FedALIGN's check and width reduction's channels are entries, not code in the client."""
    from edge_sdk.algorithms import fedalign, width

    assert fedalign.check_after_evaluate in DEFAULT_REGISTRY.hooks["evaluate"]
    assert DEFAULT_REGISTRY.selection("channels") is width.CHANNELS
    assert not width.CHANNELS.trains_graph
    with pytest.raises(p.ProtocolError, match="does not know the selection 'diagonal'"):
        DEFAULT_REGISTRY.selection("diagonal")
    client_source = (Path(__file__).resolve().parents[1] / "edge_sdk" / "client.py").read_text()
    for algorithm_code in ("within_epsilon", "incentive", "WIDTH_KEY", "width=", '"channels"', "phase ==",
                           '"evaluate"', '"compare"'):
        assert algorithm_code not in client_source, algorithm_code


def test_a_device_process_takes_its_registry_by_reference() -> None:
    """``python -m edge_sdk --registry package.module:NAME``: a device process runs an algorithm's steps."""
    from edge_sdk.cli import UsageProblem, device_config
    from edge_sdk.settings import load_settings

    def config(**given: object):
        return device_config(load_settings({"device_id": "d", "budget": "1GiB", **given}))

    registry = config(registry="tests.test_device_phase_registry:REGISTRY").registry  # loaded by name
    assert set(registry.phases) == set(REGISTRY.phases) and CENSUS in registry.phases
    assert config().registry is DEFAULT_REGISTRY
    with pytest.raises(UsageProblem, match="not an edge_sdk.phases.DeviceRegistry"):
        config(registry="tests.test_device_phase_registry:CENSUS")
