"""Report intake assembled from parts, and what lives outside the package plugging into it.

- Every list of names is its registry: the settings' choices of codecs, accountants, samplings and
  privacy mechanisms are the registries' names, and each registered part loads as what its table says.
- Capabilities are declared by the strategy (``Strategy.combines``): a strategy written outside the
  package (``tests/weighted_mean_strategy.py``) that declares a weighted mean runs a secure round, a
  distributed-DP round and a central-DP round through the real server; one that declares a rule of its
  own is refused in one line before the first round.
- A privacy mechanism is one module: one written outside the package (``tests/dp_mechanisms.py``),
  registered by decorator or named by reference, runs a real server round, and the run's one ledger
  owner records and journals its event.
- The secure round's stage moves on by its own methods only.
"""

from __future__ import annotations

import asyncio
import math
import typing
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.cli import load_shard
from edge_sdk.client import DeviceClient
from edge_sdk.settings import DeviceSettings
from edge_sdk.codecs import CODECS
from edge_sdk.models import build_model
from edge_sdk.values import SettingError
from emulator.localfleet import role_budgets, start_orchestrator
from orchestrator.aggregation import assembly
from orchestrator.aggregation.privacy import ACCOUNTANTS, MECHANISMS, SAMPLINGS
from orchestrator.aggregation.privacy.accountant import BlockRelease, PrivacyLedger, RoundEvent
from orchestrator.aggregation.privacy.calibrate import PrivacyPlanError
from orchestrator.aggregation.privacy.mechanism import PrivacyMechanism, mechanism_class
from orchestrator.aggregation.secure.round import SecureStage
from orchestrator.config import ServerConfig, setting_hints
from orchestrator.server import Orchestrator
from orchestrator.store import Store
from orchestrator.strategies import STRATEGY_NAMES, Combines, make_strategy
from tests.dp_mechanisms import ExactRelease
from tests.factories import server_config
from tests.inprocess import serve
from tests.test_dp_central import _serve
from tests.test_secagg_round import Fleet
from tests.weighted_mean_strategy import MeanOfMine

OURS = "tests.weighted_mean_strategy:MeanOfMine"
#: Two blocks of 784-64 and 64-10 (as tests/test_dp_central.py): a clipped mean per block is easy to tell.
MODEL = {"model": "mnist_2nn", "eval_source": "none", "max_loss_rise": 0, "deadline_s": 60, "wait_devices_s": 60}


# -- the registries ---------------------------------------------------------------------------------
def _choices(field: str) -> tuple[str, ...]:
    hint = setting_hints()[field]
    return tuple(typing.get_args(typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint))


def test_the_settings_choices_are_the_registries() -> None:
    assert _choices("update_codec") == ("auto", *CODECS)  # auto: the measured default (bench/validated.toml)
    assert _choices("chunk_codec") == _choices("graph_codec") == tuple(n for n, c in CODECS.items() if c.lossless)
    assert set(_choices("tail_codec")) == {n for n, c in CODECS.items() if c.lossless or not c.unbiased}
    assert _choices("dp_accountant") == ACCOUNTANTS and _choices("dp_sampling") == SAMPLINGS
    with pytest.raises(SettingError, match="unknown mechanism 'laplace'"):
        ServerConfig(dp_mechanism="laplace")


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_every_registered_mechanism_loads_as_one(name: str) -> None:
    cls = mechanism_class(name)
    assert issubclass(cls, PrivacyMechanism) and cls.formats <= set(assembly.UPLOAD_FORMATS)


@pytest.mark.parametrize("table", [assembly.UPLOAD_FORMATS, assembly.COMBINERS, assembly.BOUNDS])
def test_every_part_of_the_tables_loads(table: dict[str, str]) -> None:
    from edge_sdk.references import load_reference

    for name, reference in table.items():
        cls = load_reference(reference, "part")
        assert isinstance(cls, type) and getattr(cls, "name", name) in (name, "plain", "masked"), (name, cls)


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_every_registered_strategy_declares_how_it_combines(name: str) -> None:
    combines = make_strategy(name).combines
    assert isinstance(combines, Combines) and combines.rule in ("weighted_mean", "robust", "own")
    assert combines.describe() and (combines.is_sum or combines.detail)  # a rule other than the mean says what it is


def test_fedavg_and_embracingfl_declare_their_mean_and_a_robust_statistic_is_not_one() -> None:
    """FedAvg's rule (McMahan et al., 2017) and EmbracingFL's per block (Lee et al., Section 3.1) are the
    weighted mean of whole blocks, with the weighting they are set to; a robust aggregation is not."""
    assert make_strategy("fedavg").combines == Combines.weighted_mean("samples")
    assert make_strategy("embracingfl", weighting="uniform").combines == Combines.weighted_mean("uniform")
    assert make_strategy("embracingfl", aggregation="median").combines == Combines.robust("median")
    assert not make_strategy("width").combines.is_sum  # a mean per channel slice, not of whole blocks


# -- a strategy of your own -------------------------------------------------------------------------
def test_a_strategy_that_declares_a_rule_of_its_own_is_refused_secure_and_private(tmp_path: Path) -> None:
    secure = server_config(tmp_path / "a", strategy="tests.weighted_mean_strategy:RuleOfMine", secure_aggregation=True)
    with pytest.raises(SettingError, match="rule_of_mine combines by a rule of its own"):
        Orchestrator(secure)
    private = server_config(tmp_path / "b", **{**MODEL, "strategy": "tests.weighted_mean_strategy:RuleOfMine",
                                               "dp": True, "dp_noise_multiplier": 1.0, "dp_min_cohort": 1})
    with pytest.raises(PrivacyPlanError, match="not for strategy 'rule_of_mine'"):
        Orchestrator(private)


def test_a_strategy_of_your_own_that_declares_a_weighted_mean_runs_central_dp(tmp_path: Path) -> None:
    config = server_config(tmp_path / "s", **{**MODEL, "strategy": OURS, "min_devices": 3, "dp": True,
                                              "dp_noise_multiplier": 1.0, "dp_delta": 1e-5, "dp_min_cohort": 1})
    orch, history = asyncio.run(_serve(config, ["a", "b", "c"]))
    assert isinstance(orch.strategy, MeanOfMine) and sorted(orch.strategy.folded) == ["a", "b", "c"]
    privacy = history[0]["privacy"]
    assert privacy["mode"] == "central" and privacy["epsilon"] > 0 and privacy["cohorts"] == {"fc1": 3, "head": 3}
    with Store(config.store_dir) as store:
        assert store.privacy.last()["mode"] == "central"  # type: ignore[index]


def _enrolled(store_dir: Path, devices: list[str]) -> dict[str, str]:
    with Store(store_dir) as store:
        return {d: store.credentials.enroll(d) for d in devices}


@pytest.mark.parametrize("dp", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["secure", "secure-dp"])
def test_a_strategy_of_your_own_that_declares_a_weighted_mean_runs_a_secure_round(tmp_path: Path, dp: bool) -> None:
    """Three production devices over real websockets, masked uploads summed per block and unmasked; with
    ``dp`` the devices add discrete Gaussian shares and the ledger accounts the survivors'."""
    devices = ["a", "b", "c"]
    secrets = _enrolled(tmp_path / "store", devices)
    config = ServerConfig(model="digits_mlp", strategy=OURS, rounds=1, min_devices=3, local_steps=2, lr=0.1,
                          store_dir=tmp_path / "store", deadline_s=300, require_credentials=True,
                          secure_aggregation=True, eval_every=1, max_loss_rise=0.0,
                          **({"dp": True, "dp_noise_multiplier": 1.0, "dp_min_cohort": 1} if dp else {}))
    budget = role_budgets("digits_mlp", secure=True)["strong"]

    async def main() -> tuple[Orchestrator, dict[str, np.ndarray], list[dict]]:
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        before = {k: v.copy() for k, v in orch.global_state.items()}
        clients = []
        for i, d in enumerate(devices):
            x, y = load_shard("digits", client=i, num_clients=len(devices))
            cfg = DeviceSettings(server=f"ws://127.0.0.1:{orch.port}", device_id=d, budget_bytes=budget,
                               backend="torch", secret=secrets[d], reconnect_retries=3)
            clients.append(DeviceClient(cfg, x, y))
        return orch, before, await serve(server, clients, timeout=300)

    orch, before, history = asyncio.run(main())
    secure = history[0]["secure"]
    assert secure["masked"] == 3 and all(b["revealed"] and b["cohort"] == 3 for b in secure["blocks"].values()), secure
    assert all(not np.array_equal(before[k], v) for k, v in orch.global_state.items() if v.dtype.kind == "f")
    assert orch.strategy.folded == []  # the server never held one update: the strategy's rule ran on sums
    if dp:
        privacy = history[0]["privacy"]
        z_b = 1.0 * math.sqrt(len(orch.model.block_names))
        assert privacy["mode"] == "distributed" and privacy["epsilon"] > 0
        assert privacy["multipliers"] == pytest.approx(dict.fromkeys(secure["blocks"], z_b))  # 3 of 3 survived


# -- a privacy mechanism of your own ------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", ["exact_for_tests", "tests.dp_mechanisms:ExactRelease"])
def test_a_mechanism_from_outside_the_package_releases_a_real_round(tmp_path: Path, mechanism: str) -> None:
    """Three devices send 0.5 everywhere, over the clip: each block's release is the clipped mean,
    C_b / sqrt(d_b) on every value (d_b: the block's values), as the mechanism computes it without noise;
    the ledger records the event it declared, journaled under its name."""
    z, clip = 1.0, 2.0
    config = server_config(tmp_path / "s", **{**MODEL, "min_devices": 3, "dp": True, "dp_mechanism": mechanism,
                                              "dp_noise_multiplier": z, "dp_clip": clip, "dp_delta": 1e-5,
                                              "dp_min_cohort": 1})
    before = {k: v.detach().numpy() for k, v in build_model(config.model, seed=config.seed).state_dict().items()}
    orch, history = asyncio.run(_serve(config, ["a", "b", "c"]))
    assert isinstance(orch.intake.release.mechanism, ExactRelease)  # type: ignore[attr-defined]
    blocks = orch.model.block_names
    c_b = clip / math.sqrt(len(blocks))
    for b in range(len(blocks)):
        names = [n for n in before if orch.model.block_of(n) == b]
        d_b = sum(before[n].size for n in names)
        for n in names:
            np.testing.assert_allclose(orch.global_state[n], before[n] + c_b / math.sqrt(d_b), rtol=0, atol=1e-6)
    privacy = history[0]["privacy"]
    assert privacy["exact"] is True and privacy["mode"] == "exact_for_tests" and privacy["cohorts"] == {
        b: 3 for b in blocks}
    ledger = PrivacyLedger(blocks, 1e-5, accountant=config.dp_accountant, sampling=config.dp_sampling)
    ledger.record(RoundEvent.fixed(3, 3, {b: BlockRelease(z * math.sqrt(len(blocks))) for b in blocks}))
    assert privacy["epsilon"] == pytest.approx(ledger.spent().epsilon, rel=1e-12)
    with Store(config.store_dir) as store:
        assert store.privacy.last()["mode"] == "exact_for_tests"  # type: ignore[index]


def test_a_mechanism_is_refused_for_uploads_it_cannot_release_from(tmp_path: Path) -> None:
    config = server_config(tmp_path / "s", secure_aggregation=True, dp=True, dp_mechanism="exact_for_tests",
                           dp_noise_multiplier=1.0, dp_min_cohort=1, strategy="embracingfl")
    with pytest.raises(SettingError, match="exact_for_tests releases from plain uploads, not masked ones"):
        Orchestrator(config)


# -- the secure round's stage ---------------------------------------------------------------------------
def test_the_secure_round_moves_its_own_stage_in_order() -> None:
    """KEYS, SHARES, MASKED, UNMASK, DONE, each by the round's own close; nobody else can set it."""
    fleet = Fleet({"a": 0, "b": 0, "c": 0})  # t = 3: every block has three trainers
    server = fleet.server
    seen = [server.stage]
    peers = fleet.keys()
    seen.append(server.stage)
    with pytest.raises(AttributeError):
        server.stage = SecureStage.DONE  # type: ignore[misc]
    fleet.mask(fleet.shares(peers))
    seen.append(server.stage)
    outcomes = fleet.unmask()
    assert server.stage is SecureStage.DONE and all(o.values is not None for o in outcomes)
    assert seen + [SecureStage.UNMASK, server.stage] == list(SecureStage)
