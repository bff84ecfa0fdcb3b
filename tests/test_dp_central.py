"""Central differential privacy in a running server: real server, real websocket devices.

Each update is clipped per block, each block's sum noised with z C (C_b = C / sqrt(L), z_b = z sqrt(L)),
the mean taken over the block's cohort, and the ledger's (epsilon, delta) after every round is in
the round's metrics, the journal, the status data, the round's line and the exported model's
metadata; a resumed run continues the ledger; a round
over dp_target_epsilon is never run; settings that cannot work are refused before anything listens.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.data import load_dataset, partition
from edge_sdk.models import build_model
from edgetrain.cli.export import model_metadata
from emulator.localfleet import start_orchestrator
from orchestrator.aggregation.privacy.accountant import BlockRelease, PrivacyLedger, RoundEvent, epsilon_for
from orchestrator.aggregation.privacy.calibrate import PrivacyPlanError
from orchestrator.aggregation.privacy.gaussian import CentralGaussian
from orchestrator.aggregation.privacy.release import PrivateRelease
from orchestrator.server import Orchestrator
from orchestrator.store import Store
from orchestrator.views.terminal import privacy_words, round_line
from orchestrator.views.web.status import StatusFeed, snapshot
from tests.factories import server_config
from tests.scripted import scripted_device

#: A model with blocks large enough for a standard deviation per block: 784-64 (50,240 values), 64-10 (650).
MODEL = {"model": "mnist_2nn", "eval_source": "none", "max_loss_rise": 0, "deadline_s": 60, "wait_devices_s": 60}


def dp_config(store: Path, **overrides: object):
    return server_config(store, **{**MODEL, "dp": True, "dp_delta": 1e-5, "dp_min_cohort": 1, **overrides})


async def _serve(config, devices: list[str], delta: float = 0.5, *, events: list | None = None,
                 labels: dict[str, dict[str, str]] | None = None, setup=None):
    """Run a server with scripted devices answering every instruction with deltas of ``delta``
    (``labels``: a device's hello labels; ``setup``: called with the server before it listens); the
    first round starts once every device is connected."""
    orch = Orchestrator(config, on_event=lambda kind, data: events.append((kind, data)) if events is not None else None)
    if setup is not None:
        setup(orch)
    ready, start = asyncio.Event(), asyncio.Event()
    server = asyncio.create_task(orch.run(ready=ready, start=start))
    await ready.wait()
    url = f"ws://127.0.0.1:{orch.port}"
    tasks = [asyncio.create_task(scripted_device(url, orch, d, (labels or {}).get(d, {}),
                                                 lambda n, shape: np.full(shape, delta, np.float32)))
             for d in devices]
    while len(orch.sessions) < len(devices):
        await asyncio.sleep(0.05)
    start.set()
    history = await server
    await asyncio.gather(*tasks)
    return orch, history


def test_each_blocks_noise_through_the_intake_is_z_c_over_its_cohort(tmp_path: Path) -> None:
    """Three devices send a constant update far over the clip: each block's new value is the clipped
    mean (C_b / sqrt(d_b) per value) plus noise whose empirical std is z C / m over its values (m:
    the block's expected cohort, here the three devices, all able to train every block)."""
    z, clip, n = 1.5, 2.0, 3
    config = dp_config(tmp_path / "s", min_devices=n, dp_noise_multiplier=z, dp_clip=clip)
    initial = {k: v.detach().numpy().copy() for k, v in build_model(config.model, seed=config.seed).state_dict().items()}
    orch, history = asyncio.run(_serve(config, [f"d{i}" for i in range(n)]))
    assert isinstance(orch.intake.release, PrivateRelease) and isinstance(orch.intake.release.mechanism, CentralGaussian)
    state, blocks = orch.global_state, orch.model.block_names
    block_clip = clip / math.sqrt(len(blocks))
    for b, block in enumerate(blocks):
        names = [k for k in state if orch.model.block_of(k) == b]
        size = sum(state[k].size for k in names)
        moved = np.concatenate([(state[k].astype(np.float64) - initial[k]).ravel() for k in names])
        noise = moved - block_clip / math.sqrt(size)  # the clipped mean of three equal updates
        expected = z * clip / n
        assert abs(noise.mean()) < 5 * expected / math.sqrt(size)
        assert noise.std() == pytest.approx(expected, rel=0.1 if size > 1000 else 0.2), block
    privacy = history[0]["privacy"]
    assert privacy["cohorts"] == dict.fromkeys(blocks, n) and privacy["expected_cohorts"] == dict.fromkeys(blocks, n)
    assert privacy["noise_stddev"] == pytest.approx(dict.fromkeys(blocks, z * clip / n))


def test_real_devices_train_a_dp_run_that_reports_epsilon_every_round(tmp_path: Path) -> None:
    """The device SDK's own client (DeviceClient) trains the tiny model on synthetic data under --dp:
    every round's metrics and journal entry say the epsilon spent so far, rising, and the model
    still learns (the server's accuracy after the last round beats chance)."""
    config = server_config(tmp_path / "s", rounds=3, min_devices=4, local_steps=5, lr=0.1, deadline_s=60,
                           max_loss_rise=0, dp=True, dp_noise_multiplier=0.3, dp_clip=1.0, dp_min_cohort=1)

    async def main() -> list[dict]:
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        data = load_dataset("synthetic", split="train")
        clients = [DeviceClient(DeviceSettings(server=f"ws://127.0.0.1:{orch.port}", device_id=f"dev-{i}",
                                             budget_bytes=2 << 30), data.x[idx], data.y[idx])
                   for i, idx in enumerate(partition(data.y, 4, "iid", seed=0))]
        history, *_ = await asyncio.wait_for(asyncio.gather(server, *(c.run() for c in clients)), timeout=240)
        return history

    history = asyncio.run(main())
    epsilons = [h["privacy"]["epsilon"] for h in history]
    assert history[-1]["privacy"]["mode"] == "central"
    assert privacy_words(history[-1]["privacy"]).endswith("central noise)")
    assert len(epsilons) == 3 and 0 < epsilons[0] < epsilons[1] < epsilons[2]
    assert all(h["reported"] == 4 and h["privacy"]["cohort"] == 4 for h in history)
    assert history[-1]["accuracy"] > 0.6
    store = Store(tmp_path / "s")
    try:
        assert [r["metrics"]["privacy"]["epsilon"] for r in store.rounds.all()] == epsilons
    finally:
        store.close()


def test_under_partial_training_each_block_is_noised_over_its_own_cohort(tmp_path: Path) -> None:
    """Two strong devices train both blocks, two weak ones the head only (EmbracingFL): the input-side
    block's mean is over 2 devices, the head's over 4, so its noise per value is twice the head's;
    each block alone spends less than the model, whose strong devices train both."""
    z, clip = 1.0, 1.0
    labels = {"w0": {"force_split": "1"}, "w1": {"force_split": "1"}}
    config = dp_config(tmp_path / "s", min_devices=4, dp_noise_multiplier=z, dp_clip=clip, allow_forced_split=True)
    orch, history = asyncio.run(_serve(config, ["s0", "s1", "w0", "w1"], labels=labels))
    first, head = orch.model.block_names
    privacy = history[0]["privacy"]
    assert privacy["cohorts"] == {first: 2, head: 4} and privacy["expected_cohorts"] == {first: 2, head: 4}
    assert privacy["noise_stddev"] == pytest.approx({first: z * clip / 2, head: z * clip / 4})
    assert privacy["blocks"][first] == pytest.approx(privacy["blocks"][head])
    assert privacy["blocks"][head] < privacy["epsilon"]


def test_adaptive_clips_grow_towards_updates_over_them_and_a_resumed_run_continues_them(tmp_path: Path) -> None:
    """Every update is far over its clip: the noised count of unclipped updates is about 0, under
    the target quantile 0.5, so each block's clip grows every round (Andrew et al., 2021); the
    round's sum carries the noise the count leaves it, and --resume starts from the journaled clips."""
    z, devices = 1.0, [f"d{i}" for i in range(12)]
    settings = {"min_devices": 12, "dp_noise_multiplier": z, "dp_adaptive_clip": True, "dp_count_stddev": 1.0}
    asyncio.run(_serve(dp_config(tmp_path / "s", rounds=2, **settings), devices))
    store = Store(tmp_path / "s")
    saved = store.privacy.last()["clips"]
    store.close()
    orch, history = asyncio.run(_serve(dp_config(tmp_path / "s", rounds=3, resume=True, **settings), devices))
    store = Store(tmp_path / "s")
    clips = [r["metrics"]["privacy"]["clips"] for r in store.rounds.all()]
    store.close()
    blocks = orch.model.block_names
    start = 1.0 / math.sqrt(len(blocks))
    for b, block in enumerate(blocks):
        seen = [c[block] for c in clips]  # the clip each round used
        assert seen[0] == start and all(later > earlier for earlier, later in zip(seen, seen[1:])), seen
        assert clips[2][block] == saved[str(b)]["clip"]  # the resumed round clipped with the journal's clip
    z_sum = ((z * math.sqrt(2)) ** -2 - 2.0**-2) ** -0.5  # z_b = z sqrt(2); the count's multiplier 2 sigma_c = 2
    assert history[-1]["privacy"]["noise_stddev"][blocks[1]] == pytest.approx(z_sum * clips[2][blocks[1]] / 12)


def _ledger_of(n_rounds: int, z: float, blocks: list[str], fleet: int, cohort: int) -> PrivacyLedger:
    ledger = PrivacyLedger(blocks, 1e-5, sampling="fixed")
    zb = z * math.sqrt(len(blocks))
    for _ in range(n_rounds):
        ledger.record(RoundEvent.fixed(fleet, cohort, dict.fromkeys(blocks, BlockRelease(zb))))
    return ledger


@pytest.mark.slow
def test_a_dp_run_reports_epsilon_every_round_and_a_resumed_run_continues_the_ledger(tmp_path: Path) -> None:
    """Three rounds straight, and two then one more with --resume: the same epsilons, per block and
    for the model, each the ledger's for K of N devices a round; journal and status data agree."""
    z, devices = 1.2, [f"d{i}" for i in range(4)]
    settings = {"min_devices": 4, "fraction": 0.5, "dp_noise_multiplier": z}
    _, straight = asyncio.run(_serve(dp_config(tmp_path / "a", rounds=3, **settings), devices))
    asyncio.run(_serve(dp_config(tmp_path / "b", rounds=2, **settings), devices))
    orch, resumed = asyncio.run(_serve(dp_config(tmp_path / "b", rounds=3, resume=True, **settings), devices))
    blocks = orch.model.block_names
    for r in range(3):
        expected = _ledger_of(r + 1, z, blocks, 4, 2).spent()
        got = straight[r]["privacy"]
        assert got["epsilon"] == pytest.approx(expected.epsilon, rel=1e-9)
        assert got["blocks"] == pytest.approx(expected.blocks, rel=1e-9) and got["rounds"] == r + 1
        assert (got["fleet"], got["cohort"]) == (4, 2)
    assert [h["privacy"]["epsilon"] for h in resumed] == [h["privacy"]["epsilon"] for h in straight]
    assert resumed[-1]["privacy"]["blocks"] == straight[-1]["privacy"]["blocks"]
    assert straight[0]["privacy"]["epsilon"] < straight[1]["privacy"]["epsilon"] < straight[2]["privacy"]["epsilon"]
    for store_dir in (tmp_path / "a", tmp_path / "b"):
        store = Store(store_dir)
        try:
            journaled = [r["metrics"]["privacy"]["epsilon"] for r in store.rounds.all()]
            saved = PrivacyLedger.from_json(store.privacy.last()["ledger"])
            status = snapshot(SimpleNamespace(config=orch.config, round=lambda: None, store=store,
                                              sessions={}), StatusFeed())
            exported = model_metadata(store, store_dir, 3)["privacy"]
        finally:
            store.close()
        assert journaled == [h["privacy"]["epsilon"] for h in straight]
        assert saved.spent().epsilon == pytest.approx(straight[-1]["privacy"]["epsilon"], rel=1e-12)
        assert status["privacy"]["epsilon"] == exported["epsilon"] == straight[-1]["privacy"]["epsilon"]
        assert status["privacy"]["blocks"] == exported["blocks"] and exported["delta"] == 1e-5
        assert status["privacy"]["mode"] == exported["mode"] == "central"
    assert f"epsilon {straight[-1]['privacy']['epsilon']:.4g} (delta 1e-05, central noise)" in round_line(straight[-1], 3)


def test_each_release_is_journaled_before_its_noise_is_drawn(tmp_path: Path) -> None:
    """Journal first: when the mechanism is asked to noise round r, the store already accounts r
    releases (synced, so a crash from then on leaves the release accounted)."""
    config = dp_config(tmp_path / "s", rounds=3, min_devices=2, dp_noise_multiplier=1.0)
    seen: list[tuple[int, int]] = []

    def setup(orch: Orchestrator) -> None:
        release = orch.intake.release
        noise = release.mechanism.release

        def noised(ctx, *args):
            seen.append((ctx.round, len(release.store.privacy.accounted()["ledger"]["rounds"])))
            return noise(ctx, *args)

        release.mechanism.release = noised

    asyncio.run(_serve(config, ["d0", "d1"], setup=setup))
    assert seen == [(1, 1), (2, 2), (3, 3)]


def test_with_poisson_sampling_each_device_is_in_a_round_by_its_own_coin_and_accounted_so(tmp_path: Path) -> None:
    """dp_sampling=poisson: each round's cohort is each idle device's own secret coin at rate q (its
    size varies, empty rounds included), and the ledger accounts Poisson-sampled rounds at q."""
    z, q, rounds, devices = 1.5, 0.2, 4, [f"d{i}" for i in range(6)]
    config = dp_config(tmp_path / "s", rounds=rounds, min_devices=6, fraction=q, dp_noise_multiplier=z,
                       dp_sampling="poisson")
    orch, history = asyncio.run(_serve(config, devices))
    store = Store(config.store_dir)
    try:
        drawn = [r["selected"] for r in store.rounds.all()]
    finally:
        store.close()
    assert [h["selected"] for h in history] == [len(d) for d in drawn] and len(drawn) == rounds
    blocks = orch.model.block_names
    ledger = PrivacyLedger(blocks, 1e-5, sampling="poisson")
    for r, h in enumerate(history):
        ledger.record(RoundEvent(q, dict.fromkeys(blocks, BlockRelease(z * math.sqrt(len(blocks))))))
        assert h["privacy"]["sampling"] == "poisson" and h["privacy"]["rounds"] == r + 1
        assert h["privacy"]["epsilon"] == pytest.approx(ledger.spent().epsilon, rel=1e-9)
        assert h["privacy"]["expected_cohorts"] == pytest.approx(dict.fromkeys(blocks, q * 6))
    assert history[2]["privacy"]["noise_stddev"] == pytest.approx(dict.fromkeys(blocks, z * config.dp_clip / (q * 6)))


@pytest.mark.slow
def test_the_run_ends_before_the_round_that_would_pass_the_target_epsilon(tmp_path: Path) -> None:
    """Planned for 1 of 3 devices a round, the run meets 2 of 4 (a larger share): it stops, with one
    line saying so, before the round whose epsilon would pass the target, never after; its last
    round is evaluated as the final model, though not due by ``eval_every``."""
    z, rounds = 2.0, 6
    target = epsilon_for(z, 1 / 3, rounds, 1e-5, fleet=3) * 1.001  # the plan (K=1 of N=3) fits
    events: list = []
    held_out = tmp_path / "held-out.npz"  # any 784-feature samples: the test asks whether it was scored
    rng = np.random.default_rng(0)
    np.savez(held_out, x=rng.normal(size=(50, 784)).astype(np.float32), y=rng.integers(0, 10, 50))
    config = dp_config(tmp_path / "s", rounds=rounds, min_devices=3, fraction=0.3, dp_noise_multiplier=z,
                       dp_target_epsilon=target, eval_every=rounds, eval_source=str(held_out))
    orch, history = asyncio.run(_serve(config, [f"d{i}" for i in range(4)], events=events))
    blocks = orch.model.block_names
    assert 1 <= len(history) < rounds
    assert "accuracy" in history[-1] and all("accuracy" not in h for h in history[:-1])
    assert history[-1]["privacy"]["epsilon"] <= target
    assert _ledger_of(len(history) + 1, z, blocks, 4, 2).spent().epsilon > target
    spent = [data["message"] for kind, data in events if kind == "privacy_budget_spent"]
    assert len(spent) == 1 and "\n" not in spent[0]
    assert f"round {len(history) + 1} would take epsilon" in spent[0] and "over the target" in spent[0]


def test_resuming_with_dp_a_run_without_it_or_at_other_settings_is_refused(tmp_path: Path) -> None:
    """Rounds that ran without dp have no epsilon: --resume with dp refuses their run; a ledger kept at
    another delta is not continued at this one."""
    devices = [f"d{i}" for i in range(2)]
    asyncio.run(_serve(server_config(tmp_path / "plain", **MODEL, min_devices=2), devices))
    with pytest.raises(PrivacyPlanError, match="kept no privacy ledger"):
        Orchestrator(dp_config(tmp_path / "plain", rounds=2, resume=True, min_devices=2, dp_noise_multiplier=1.0))
    asyncio.run(_serve(dp_config(tmp_path / "dp", min_devices=2, dp_noise_multiplier=1.0), devices))
    with pytest.raises(PrivacyPlanError, match="kept at delta 1e-05"):
        Orchestrator(dp_config(tmp_path / "dp", rounds=2, resume=True, min_devices=2, dp_noise_multiplier=1.0,
                               dp_delta=1e-6))


@pytest.mark.parametrize(("overrides", "says"), [
    ({"strategy": "fedavg", "strategy_options": {"aggregation": "median"}}, "aggregation=median"),
    ({"strategy": "fedsubavg"}, "not for strategy 'fedsubavg'"),
    ({"dp_min_cohort": 10}, "under the 10 a noised mean needs"),
    ({"dp_noise_multiplier": 0.5, "dp_target_epsilon": 1.0, "rounds": 50}, "over the target 1: use at least"),
    ({"dp_noise_multiplier": None}, "dp needs dp_noise_multiplier or dp_target_epsilon"),
    ({"dp_delta": 0.3}, "not below 1/N"),
    ({"dp_adaptive_clip": True, "dp_count_stddev": 0.1}, "adaptive clipping: the count's noise"),
    ({"dp_adaptive_clip": True, "dp_count_stddev": 0.0}, "an un-noised count is not private"),
])
def test_settings_that_cannot_work_are_refused_in_one_line_before_the_run(tmp_path: Path, overrides, says) -> None:
    config = dp_config(tmp_path / "s", **{"min_devices": 4, "dp_noise_multiplier": 1.0, **overrides})
    with pytest.raises(PrivacyPlanError) as refused:
        Orchestrator(config)
    assert says in str(refused.value) and "\n" not in str(refused.value)
