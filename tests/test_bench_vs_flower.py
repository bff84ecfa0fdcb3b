"""The side-by-side benchmark's workload and bookkeeping (seconds; the benchmark itself is not run here)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import fl_common as fc  # noqa: E402
import vs_flower  # noqa: E402
from edge_sdk.models import build_model  # noqa: E402
from orchestrator.rounds import sample_devices  # noqa: E402


def test_mnist_cnn_is_the_issue_workload_and_splits_at_every_block():
    model = build_model("mnist_cnn", seed=0)
    assert sum(p.numel() for p in model.parameters()) == 409_034
    assert model.block_names == ["conv1", "conv2", "dense1", "head"]
    x = torch.rand(3, 784)
    whole = model(x)
    assert whole.shape == (3, 10)
    for k in range(1, len(model)):
        assert torch.allclose(model(model(x, stop=k), start=k), whole, atol=1e-6)
    assert model(x, stop=2).shape == (3, 32 * 7 * 7)


def test_plain_lanes_sample_as_the_orchestrator_does():
    ids = [f"dev-{i:02d}" for i in range(20)]
    for rnd in range(1, 6):
        expected = [int(d[4:]) for d in sample_devices(ids, 0.5, rnd, 0)]
        assert fc.sample_round(20, 10, rnd, 0) == expected


def test_train_local_learns_on_a_separable_toy_set():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 256)
    x = (rng.random((256, 784)) * 0.1 + y[:, None] * 0.5).astype(np.float32)
    model = build_model("mnist_cnn", seed=0)
    before = fc.evaluate(model, x, y)["test_loss"]
    fc.train_local(model, x, y, steps=20, batch=32, lr=0.05, momentum=0.9, seed=1)
    assert fc.evaluate(model, x, y)["test_loss"] < before


def test_flower_constraints_replace_the_project_pins_they_name(tmp_path):
    path = vs_flower.flwr_constraints(tmp_path)
    pins = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    names = [ln.split("==")[0].lower() for ln in pins]
    assert len(names) == len(set(names))
    assert "torch==2.13.0" in pins and "typer==0.20.1" in pins and "typer==0.29.2" not in pins


def test_summary_counts_warm_rounds_from_the_previous_end():
    rounds = [{"round": r, "t_start": 10.0 * r, "t_end": 10.0 * r + r, "lo_start": 0, "lo_end": 100 * r}
              for r in range(1, 4)]
    res = {"rounds": rounds, "cpu_series": [(0.0, 0.0), (100.0, 50.0)]}
    sm = vs_flower.summarise(res)
    assert sm["round_s"] == [1.0, 22.0 - 11.0, 33.0 - 22.0]  # round 1 from its start, later ones from the last end
    assert sm["warm_round_s"] == 11.0
    assert sm["lo_bytes_per_round"] == [100, 100, 100]
    assert abs(sm["round_cpu_s"][1] - 5.5) < 1e-9


def _run(wall: float, cpu: float, total: float = 10.0) -> dict:
    return {"summary": {"warm_round_s": wall, "warm_round_cpu_s": cpu, "round_s": [wall], "round_cpu_s": [cpu]},
            "total_wall_s": total, "memory_peak_bytes": {"all_pss": int(total) << 20}}


def test_repeats_pair_each_lane_with_the_plain_loop_of_its_own_repeat():
    # The machine slowed by a third in the second repeat: both lanes' ratios stay 1.5 and 2.
    runs = {"plain": [_run(0.4, 0.4), _run(0.6, 0.6), _run(0.4, 0.4)],
            "ours": [_run(0.6, 0.8), _run(0.9, 1.2), {"lane": "ours", "error": "exited with 1"}]}
    paired = vs_flower.paired_ratios(runs)
    assert paired["ours"]["wall_over_plain"] == pytest.approx(1.5)
    assert paired["ours"]["cpu_over_plain"] == pytest.approx(2.0)
    assert paired["ours"]["cpu_over_plain_each"] == pytest.approx([2.0, 2.0])  # the failed run counts for nothing
    combined = vs_flower.combine_runs(runs["ours"])
    assert combined["summary"]["warm_round_cpu_s"] == pytest.approx(1.0)  # the median of the runs that finished
    assert combined["total_wall_s"] == 10.0 and len(combined["runs"]) == 3 and "error" in combined["runs"][2]
    assert vs_flower.combine_runs(runs["plain"][:1]) == runs["plain"][0]  # one run is its own result


def test_bytes_per_device_come_from_the_workers_resident_sets():
    workers = [{"devices": 10, "rss_ready_bytes": 100 << 20, "rss_after_connect_bytes": 102 << 20,
                "peak_rss_bytes": 142 << 20},
               {"devices": 10, "rss_ready_bytes": 100 << 20, "rss_after_connect_bytes": 104 << 20,
                "peak_rss_bytes": 124 << 20}]
    mem = vs_flower.device_memory(workers, threads=2)
    assert mem["bytes_per_idle_device"] == (0.2 * 2**20 + 0.4 * 2**20) / 2  # what connecting added, per device
    assert mem["bytes_per_training_device"] == (20 * 2**20 + 10 * 2**20) / 2  # over connected, per thread


def test_the_lightweight_lane_is_a_valid_fleet_of_strong_devices():
    fleet = vs_flower.light_fleet({"seed": 0, "clients": 20})
    assert fleet.model == fc.MODEL
    devices = fleet.devices()
    assert [d.id for d in devices] == [f"dev-{i:03d}" for i in range(20)]  # as the process lane names them
    assert {d.budget_bytes for d in devices} == {4 << 30} and fleet.emulation.mode == "lightweight"
    assert fleet.partition.seed == 0 and fleet.partition.scheme == "iid"
