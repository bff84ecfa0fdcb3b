"""FedALIGN and VaRSeL drive real rounds: real device processes (``python -m edge_sdk --label ...``)
over websockets on 127.0.0.1, the strategies chosen by name with options as the server's
configuration gives them.

FedALIGN with epsilon 0 and one warm-up round must give, bit for bit, the model FedAvg trains on the
priority devices alone; VaRSeL must run its three phases (internal train, external compare, sampled
external train) and journal the weights it gave, and leave out an external whose update is zero.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator.server import Orchestrator
from orchestrator.store import Store
from tests.factories import server_config

#: Each module fixture runs a whole served run of device processes (two algorithms); on a loaded 2-core
#: machine that is past the suite's 300 s default, which would fail it for time, not for a wrong number.
pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 2
NUM_CLIENTS = 5


async def _run(tmp: Path, strategy: str, options: dict, devices: dict[int, list[str]]):
    config = server_config(tmp / "store", strategy=strategy, strategy_options=options, rounds=ROUNDS,
                           min_devices=len(devices), local_steps=5, batch_size=16, lr=0.1, deadline_s=120)
    events: list[tuple[str, dict]] = []
    orch = Orchestrator(config, on_event=lambda kind, data: events.append((kind, data)))
    ready = asyncio.Event()
    server = asyncio.create_task(orch.run(ready=ready))
    await ready.wait()
    procs = []
    for i, labels in devices.items():
        extra = [a for label in labels for a in ("--label", label)]
        procs.append(await asyncio.create_subprocess_exec(
            sys.executable, "-m", "edge_sdk", "--server", f"ws://127.0.0.1:{orch.port}", "--id", f"dev-{i}",
            "--budget", "4GiB", "--data", "synthetic", "--client", str(i), "--num-clients", str(NUM_CLIENTS),
            "--partition", "dirichlet:0.3", "--once", *extra, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        ))
    history = await asyncio.wait_for(server, timeout=240)
    outs = await asyncio.gather(*(p.communicate() for p in procs))
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err.decode()[-2000:]
    return orch, history, events


def _phases(events, r):
    return [(d["device"], d["phase"]) for k, d in events if k == "update" and d["round"] == r]


@pytest.fixture(scope="module")
def fedalign_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fedalign")
    prio = ["priority=1"]
    fedalign = asyncio.run(_run(tmp / "a", "fedalign", {"epsilon": "0", "warmup": "1"},
                                {0: prio, 1: prio, 2: [], 3: []}))
    # The papers' FedAvg, sample-weighted: the weight cap off (its default would weigh the two equally).
    fedavg = asyncio.run(_run(tmp / "b", "fedavg", {"max_weight_share": "1"}, {0: [], 1: []}))
    return fedalign, fedavg


def test_fedalign_epsilon_zero_trains_exactly_fedavg_on_the_priority_devices(fedalign_runs):
    (orch, history, events), (ref, _, _) = fedalign_runs
    assert set(orch.global_state) == set(ref.global_state)
    for name, value in ref.global_state.items():
        assert orch.global_state[name].tobytes() == value.tobytes(), name
    # Something was trained: the model moved.
    assert any(np.any(v != 0) for v in orch.global_state.values())


def test_fedalign_phases_warmup_and_what_the_round_reports(fedalign_runs):
    (orch, history, events), _ = fedalign_runs
    r1, r2 = set(_phases(events, 1)), set(_phases(events, 2))
    assert r1 == {("dev-0", "evaluate"), ("dev-0", "train"), ("dev-1", "evaluate"), ("dev-1", "train")}  # warm-up
    assert r2 == r1 | {("dev-2", "evaluate"), ("dev-3", "evaluate")}  # asked, not within epsilon 0
    h1, h2 = history
    assert h1["warmup"] is True and h2["warmup"] is False
    assert h2["included"] == {} and h2["excluded"] == ["dev-2", "dev-3"]
    # The devices made their own check (edge_sdk.algorithms.fedalign.incentive_check) and declined: epsilon 0.
    assert h1["declined"] == [] and h2["declined"] == ["dev-2", "dev-3"]
    assert 0 < h2["priority_loss"] and 0 <= h2["priority_accuracy"] <= 1 and 0 <= h2["nonpriority_accuracy"] <= 1
    # The round's extra lands in the journal too.
    with Store(orch.config.store_dir) as store:
        journaled = store.rounds.all()[1]["metrics"]
    assert journaled["excluded"] == ["dev-2", "dev-3"] and journaled["priority_loss"] == h2["priority_loss"]


@pytest.fixture(scope="module")
def varsel_run(tmp_path_factory):
    internal = ["internal=1"]
    return asyncio.run(_run(tmp_path_factory.mktemp("varsel"), "varsel", {"budget": "2", "seed": "1"},
                            {0: internal, 1: internal, 2: [], 3: [], 4: []}))


def test_varsel_runs_its_phases_and_journals_the_external_weights(varsel_run):
    orch, history, events = varsel_run
    assert [h["round"] for h in history] == [1, 2]
    for r, h in enumerate(history, start=1):
        phases = _phases(events, r)
        for d in ("dev-0", "dev-1"):
            assert (d, "train") in phases and (d, "compare") not in phases
        externals = {"dev-2", "dev-3", "dev-4"}
        assert {d for d, ph in phases if ph == "compare"} == externals
        sampled = {d for d, ph in phases if ph == "train"} - {"dev-0", "dev-1"}
        assert sampled == set(h["sampled"])
        # A sampled external answered train after compare, with the update it had trained.
        for d in sampled:
            assert phases.index((d, "compare")) < phases.index((d, "train"))
        assert set(h["included"]) <= sampled
        assert all(0 < w <= 1 for w in h["included"].values())
        assert h["external_weight_sum"] == pytest.approx(sum(h["included"].values()))
        assert h["external_weight_sum"] <= 2 + 1e-9 and h["w_tilde_sum"] <= 2 + 1e-9
        assert h["internal_devices"] == 2 and h["external_devices"] == 3
        assert 0 <= h["internal_accuracy"] <= 1 and 0 <= h["external_accuracy"] <= 1


def test_varsel_leaves_out_a_real_device_whose_cox_update_is_zero(tmp_path):
    """Real in-process devices training the Cox model (the benchmarks' runner): the external whose
    patients hold no death has a constant partial likelihood, reports an update of norm exactly 0
    with its distance, and gets no weight (eq. 8 alone gave it 1.0, all of the round's)."""
    from bench.prioritized_runner import Device, Training, run_algorithm

    rng = np.random.default_rng(0)
    beta = rng.normal(size=39)

    def patients(n: int, deaths: bool) -> tuple[np.ndarray, np.ndarray]:
        x = rng.normal(size=(n, 39)).astype(np.float32)
        time = rng.exponential(np.exp(-0.3 * x @ beta)).astype(np.float32)
        event = (rng.random(n) < 0.6) if deaths else np.zeros(n, bool)
        return x, np.stack([event.astype(np.float32), time], axis=1)

    fleet = [Device(f"int-{i}", "internal", *patients(40, True), priority=True) for i in range(3)]
    fleet += [Device("ext-deaths", "external", *patients(40, True)),
              Device("ext-none", "external", *patients(40, False))]
    training = Training(model="cox_linear", rounds=2, local_steps=3, batch_size=64, lr=0.05)
    run = asyncio.run(run_algorithm("varsel", fleet, training, {"budget": 2, "seed": 0, "evaluate": False}, 0,
                                    tmp_path, lambda state: 0.0))
    assert [r["round"] for r in run["rounds"]] == [1, 2]
    for r in run["rounds"]:
        assert r["zero_updates"] == ["ext-none"]
        assert "ext-none" not in r["included"] and "ext-none" not in r["sampled"]
