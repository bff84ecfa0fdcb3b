"""Buffered asynchronous rounds (FedBuff; docs/buffered.md): the staleness weight, what is refused at
startup and why, and a fleet of real device processes trained through ``edgetrain serve`` in buffered
mode, a slow device's updates folded with their staleness instead of being cut."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from emulator.faults import Faults
from emulator.launch import DeviceLaunch, device_argv
from emulator.localfleet import device_env, role_budgets
from orchestrator.aggregation.assembly import check_capabilities
from orchestrator.aggregation.buffered import staleness_weight
from orchestrator.config import SettingError
from orchestrator.store import Store
from orchestrator.strategies import make_strategy
from tests.factories import server_config


def test_staleness_weight_is_fedbuffs_inverse_square_root_by_default() -> None:
    assert staleness_weight(0, 0.5) == 1.0
    assert staleness_weight(3, 0.5) == pytest.approx(0.5)  # 1/sqrt(1 + 3)
    assert staleness_weight(8, 0.5) == pytest.approx(1 / 3)
    assert staleness_weight(5, 0.0) == 1.0  # constant weighting
    with pytest.raises(ValueError):
        staleness_weight(-1, 0.5)


@pytest.mark.parametrize(("strategy", "options", "settings", "says"), [
    ("fedsubavg", {}, {}, "combines by a rule of its own"),
    ("fedavg", {"aggregation": "median"}, {}, "robust statistic median"),
    ("fedalign", {}, {}, "combines by a rule of its own"),
    ("fedavg", {}, {"secure_aggregation": True}, "secure aggregation"),
    ("fedavg", {}, {"dp": True, "dp_noise_multiplier": 1.0}, "privacy ledger"),
])
def test_what_cannot_run_buffered_is_refused_in_one_line(tmp_path: Path, strategy: str, options: dict,
                                                         settings: dict, says: str) -> None:
    config = server_config(tmp_path, round_mode="buffered", strategy=strategy, **settings)
    with pytest.raises(SettingError) as refused:
        check_capabilities(config, make_strategy(strategy, **options))
    assert refused.value.name == "round_mode" and says in str(refused.value) and "\n" not in str(refused.value)


def test_weighted_means_run_buffered(tmp_path: Path) -> None:
    for name in ("fedavg", "embracingfl"):
        check_capabilities(server_config(tmp_path, round_mode="buffered", strategy=name), make_strategy(name))


def _serve(port: int, store: Path, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "edgetrain", "serve", "--model", "digits_mlp", "--port", str(port),
            "--store", str(store), "--json-events", "--local-steps", "5", *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=device_env(), text=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(900)  # eight versions of three device processes on a loaded 2-core machine
def test_buffered_rounds_train_real_devices_and_fold_a_slow_devices_stale_updates(tmp_path: Path) -> None:
    """Three device processes, one 4 s slower per report: with a buffer of 2 the fast ones step the
    model while the slow one trains, and its updates arrive stale, folded with (1 + s)^-1/2."""
    port, store_dir = _free_port(), tmp_path / "store"
    strong = role_budgets("digits_mlp")["strong"]
    server = _serve(port, store_dir, "--strategy", "embracingfl", "--round-mode", "buffered", "--concurrency", "3",
                    "--buffer-size", "2", "--rounds", "8", "--min-devices", "3", "--eval-every", "4")
    launches = [DeviceLaunch(f"d{i}", strong, client=i, num_clients=3,
                             faults=Faults(delay_s=4.0) if i == 2 else Faults()) for i in range(3)]
    devices = [subprocess.Popen(device_argv(l, f"ws://127.0.0.1:{port}"), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=device_env()) for l in launches]
    try:
        out, err = server.communicate(timeout=840)
        assert server.returncode == 0, err[-2000:]
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        ends = [e for e in events if e.get("event") == "round_end"]
        assert [e["round"] for e in ends] == list(range(1, 9))
        assert all(e["buffered"] == 2 and e["model_version"] == e["round"] for e in ends)
        store = Store.open_readonly(store_dir)
        reports = [r for r in store.reports.all() if r["accepted"]]
        rounds = store.rounds.all()
        store.close()
        slow = [r for r in reports if r["device_id"] == "d2"]
        stale = [r for r in slow if r["staleness"] > 0]
        assert stale, f"the slow device's updates were all fresh: {[r['staleness'] for r in slow]}"
        for r in reports:  # each folded with its staleness weight, computed on the version it was sent
            assert r["staleness"] == r["round"] - 1 - r["model_version"] >= 0
            assert r["staleness_weight"] == pytest.approx(1 / math.sqrt(1 + r["staleness"]))
        # nobody was cut: a report is late only once the run is over (answered, not left waiting)
        assert not any(e.get("event") == "late" and not e.get("over") for e in events)
        accuracy = [r["metrics"]["accuracy"] for r in rounds if r["metrics"] and "accuracy" in r["metrics"]]
        assert accuracy[-1] > 0.5, accuracy  # digits: 10 classes, chance is 0.1
    finally:
        for proc in [server, *devices]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.slow
def test_a_server_killed_mid_buffer_resumes_it_losing_no_folded_update_and_folding_none_twice(tmp_path: Path) -> None:
    """SIGKILL once two of buffer 2's three updates are folded (and acked): the journal holds them,
    and ``--resume`` reopens buffer 2 with exactly those two, which the third update completes."""
    port, store_dir = _free_port(), tmp_path / "store"
    strong = role_budgets("digits_mlp")["strong"]
    args = ("--round-mode", "buffered", "--concurrency", "3", "--buffer-size", "3", "--rounds", "3",
            "--min-devices", "3", "--eval-every", "0")
    server = _serve(port, store_dir, *args)
    launches = [DeviceLaunch(f"d{i}", strong, client=i, num_clients=3,
                             faults=Faults(delay_s=6.0) if i == 2 else Faults()) for i in range(3)]
    devices = [subprocess.Popen(device_argv(l, f"ws://127.0.0.1:{port}"), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=device_env()) for l in launches]
    restarted = None
    try:
        folded, deadline = [], time.monotonic() + 180
        for line in server.stdout:
            event = json.loads(line) if line.startswith("{") else {}
            if event.get("event") == "update" and event["round"] == 2 and event["accepted"]:
                folded.append(event["device"])
                if len(folded) == 2:
                    break
            assert time.monotonic() < deadline
        server.kill()  # SIGKILL: no clean shutdown, mid-buffer
        server.wait()
        store = Store.open_readonly(store_dir)
        held = store.buffer.held(2)
        assert store.rounds.completed() == 1
        store.close()
        assert sorted(r["device_id"] for r in held) == sorted(folded)  # every acked update is in the journal

        restarted = _serve(port, store_dir, *args, "--resume")
        out, err = restarted.communicate(timeout=240)
        assert restarted.returncode == 0, err[-2000:]
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        start = next(e for e in events if e.get("event") == "round_start")
        assert (start["round"], start["restored"]) == (2, 2)
        new = [e["device"] for e in events if e.get("event") == "update" and e["round"] == 2 and e["accepted"]]
        assert len(new) == 1 and new[0] not in folded  # the restored devices give buffer 2 nothing more
        end = next(e for e in events if e.get("event") == "round_end" and e["round"] == 2)
        assert end["buffered"] == 3
        store = Store.open_readonly(store_dir)
        accepted = [r["device_id"] for r in store.reports.all(2) if r["accepted"]]
        assert sorted(accepted) == sorted([*folded, *new])  # three distinct updates: none folded twice
        assert store.buffer.held(2) == [] and store.rounds.completed() == 3
        store.close()
    finally:
        for proc in [server, restarted, *devices]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_speed_factors_are_heavy_tailed_reproducible_and_from_traces(tmp_path: Path) -> None:
    from emulator.speeds import load_speed_trace, report_delays, speed_factors

    ids = [f"d{i:04d}" for i in range(2000)]
    factors = speed_factors(ids, distribution="pareto", shape=1.5, seed=3, cap=1000.0)
    assert factors == speed_factors(ids, distribution="pareto", shape=1.5, seed=3, cap=1000.0)
    values = np.array(sorted(factors.values()))
    assert values.min() >= 1.0
    # Pareto(1.5) from 1: median 2^(2/3) = 1.59, 90th percentile 10^(2/3) = 4.64 (sampling error allowed).
    assert np.median(values) == pytest.approx(1.59, rel=0.08)
    assert np.quantile(values, 0.9) == pytest.approx(4.64, rel=0.15)
    assert set(speed_factors(ids[:5], distribution="uniform").values()) == {1.0}
    assert max(speed_factors(ids, shape=0.5, cap=20.0).values()) == 20.0
    (tmp_path / "speeds.csv").write_text("# device,factor\na,3\nb,1.5\n")
    assert load_speed_trace(tmp_path / "speeds.csv", ["a", "c"]) == {"a": 3.0, "b": 1.5, "c": 1.0}
    assert report_delays({"a": 3.0, "c": 1.0}, 2.0) == {"a": 4.0, "c": 0.0}
    (tmp_path / "bad.json").write_text('{"a": 0.5}')
    with pytest.raises(ValueError, match="at least 1"):
        load_speed_trace(tmp_path / "bad.json")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_blocks_buffer_counts_only_the_updates_that_trained_it(tmp_path: Path) -> None:
    """EmbracingFL buffered: one strong device (slowed) and two weak ones. A buffer of weak updates
    only leaves the input-side blocks bit for bit; one with the strong update moves them too."""
    import asyncio

    from emulator.localfleet import run_local_fleet

    budgets = role_budgets("digits_mlp")
    launches = [DeviceLaunch("strong", budgets["strong"], client=0, num_clients=3, faults=Faults(delay_s=3.0)),
                *(DeviceLaunch(f"weak{i}", budgets["weak"], client=i, num_clients=3) for i in (1, 2))]
    config = server_config(tmp_path / "store", model="digits_mlp", strategy="embracingfl", round_mode="buffered",
                           concurrency=3, buffer_size=2, rounds=6, min_devices=3, local_steps=5, eval_every=0,
                           max_staleness=100, keep_checkpoints=10)
    asyncio.run(run_local_fleet(config, launches))
    store = Store.open_readonly(config.store_dir)
    try:
        weak_split = min(r["trained"][0] for r in store.reports.all() if r["role"] == "weak")
        assert weak_split > 0
        input_side = _input_side_names(config.model, weak_split)
        assert input_side
        moved, kept = 0, 0
        for r in range(2, 7):
            roles = {x["role"] for x in store.reports.all(r) if x["accepted"]}
            before, after = store.checkpoints.read(r - 1), store.checkpoints.read(r)
            same = all(np.array_equal(before[n], after[n]) for n in input_side)
            if roles == {"weak"}:
                assert same, f"buffer {r} of weak updates only moved an input-side block"
                kept += 1
            elif "strong" in roles:
                assert not same
                moved += 1
        assert kept and moved, (kept, moved)
    finally:
        store.close()


def _input_side_names(model: str, split: int) -> list[str]:
    from edge_sdk.models import build_model

    m = build_model(model)
    return [n for n in m.state_dict() if n not in set(m.state_names(split))]
