"""The natural-group benchmarks' parts: Tiny Shakespeare's roles by play, Fed-TCGA-BRCA's regions,
the Cox loss and C-index, the two models in the zoo, and FedALIGN's epsilon grid command run end to
end (real orchestrator and devices) on TCGA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_sdk.models import build_model
from edge_sdk.models.survival import cox_loss
from tests.shared_data import REPO, SHARED, need



# -- Tiny Shakespeare ----------------------------------------------------------------------------
def test_roles_are_grouped_by_play_and_windows_predict_the_next_character():
    from edge_sdk.data.shakespeare import PLAYS, load_roles, role_split, windows

    roles, vocab = load_roles(need("tinyshakespeare"))
    assert len(vocab) == 65
    plays = {r.play for r in roles}
    assert plays == {p for p, _ in PLAYS}
    by = {(r.play, r.name): r for r in roles}
    assert ("Coriolanus", "MENENIUS") in by and ("Romeo and Juliet", "JULIET") in by
    assert ("Coriolanus", "JULIET") not in by  # a role belongs to its play only
    # A role's speeches, not its speaker lines: MENENIUS's text starts with his first speech.
    assert not any(line.endswith(":") and line.isupper() for line in by[("Coriolanus", "MENENIUS")].text.split("\n"))
    ids = vocab.encode("To be, or not")
    x, y = windows(ids, 4, stride=2)
    assert x.shape == (5, 4) and x[1].tolist() == ids[2:6].tolist() and y[1] == ids[6]
    train, val, test = role_split("abcdefghij", test=0.2, validation=0.1)
    assert (train, val, test) == ("abcdefg", "h", "ij")


# -- Fed-TCGA-BRCA -------------------------------------------------------------------------------
def test_tcga_regions_have_flambys_train_and_test_sizes():
    from edge_sdk.data.tcga_brca import REGIONS, load_tcga_brca

    root = need("fed_tcga_brca")
    train, test = load_tcga_brca("train", root), load_tcga_brca("test", root)
    sizes = {r: (len(train.of(r).x), len(test.of(r).x)) for r in REGIONS}
    assert sorted(sizes.values()) == sorted([(248, 63), (156, 40), (164, 42), (129, 33), (129, 33), (40, 11)])
    assert train.x.shape[1] == 39 and train.y.shape[1] == 2
    assert set(np.unique(train.y[:, 0])) == {0.0, 1.0} and float(train.x.max()) <= 1.0


def test_concordance_index_by_hand():
    from edge_sdk.data.tcga_brca import concordance_index

    y = np.array([[1, 1.0], [1, 2.0], [0, 3.0], [1, 4.0]], np.float32)
    # Comparable pairs (i died first): (0,1) (0,2) (0,3) (1,2) (1,3): 5.
    assert concordance_index(np.array([4.0, 3.0, 2.0, 1.0]), y) == 1.0
    assert concordance_index(np.array([1.0, 2.0, 3.0, 4.0]), y) == 0.0
    assert concordance_index(np.array([4.0, 1.0, 2.0, 1.0]), y) == pytest.approx(3.5 / 5)


def test_cox_loss_is_zero_for_a_constant_risk_and_has_coxs_gradient():
    y = torch.tensor([[1, 5.0], [0, 3.0], [1, 2.0], [0, 9.0], [1, 7.0], [1, 1.0]])
    assert float(cox_loss(torch.zeros(6), y)) == pytest.approx(0.0, abs=1e-7)
    assert float(cox_loss(torch.randn(3), torch.tensor([[0, 1.0], [0, 2.0], [0, 3.0]]))) == 0.0  # no event
    r = torch.randn(6, requires_grad=True)
    cox_loss(r, y).backward()
    # Cox's own partial likelihood (the risk set's sum, not its mean): the same gradient.
    r2 = r.detach().clone().requires_grad_(True)
    at_risk = y[:, 1][None, :] >= y[:, 1][:, None]
    lse = torch.stack([torch.logsumexp(r2[at_risk[i]], 0) for i in range(6)])
    (((lse - r2) * y[:, 0]).sum() / y[:, 0].sum()).backward()
    np.testing.assert_allclose(r.grad.numpy(), r2.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_the_zoo_builds_the_natural_group_models():
    lstm = build_model("char_lstm")
    out = lstm(lstm.sample_input(4))
    assert out.shape == (4, 65) and lstm.task == "classification"
    cox = build_model("cox_linear")
    assert cox(cox.sample_input(3)).shape == (3, 1) and cox.task == "survival"
    loss = cox.loss(cox(torch.rand(4, 39)), torch.tensor([[1, 1.0], [0, 2.0], [1, 3.0], [0, 4.0]]))
    assert loss.requires_grad


# -- the grid command ----------------------------------------------------------------------------
@pytest.mark.slow
def test_the_epsilon_grid_command_reports_the_chosen_value(tmp_path: Path):
    need("fed_tcga_brca")
    out = tmp_path / "grid.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "EDGETRAIN_DATA": str(SHARED)}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "fedalign_epsilon.py"), "--task", "tcga",
                           "--choices", "Europe", "--rounds", "4", "--grid", "rel:0.1,abs:0,abs:inf",
                           "--seeds", "0", "--out", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())["report"]  # the case's table in the benchmarks' one results schema
    assert result["grid"] == ["rel:0.1", "abs:0", "abs:inf"]
    assert all(len(result["scores"][k]) == 1 and 0.0 <= result["scores"][k][0] <= 1.0 for k in result["grid"])
    assert result["chosen"] in result["grid"] and result["mean"][result["chosen"]] == max(result["mean"].values())
    assert f"chosen: {result['chosen']}" in proc.stdout


def test_the_benchmark_table_calls_a_win_only_where_the_interval_excludes_zero():
    sys.path.insert(0, str(REPO))
    from bench.prioritized_report import markdown, summarise

    rng = np.random.default_rng(0)
    base = rng.random((2, 400)) < 0.5  # two seeds' correctness of FedAvg on the priority devices

    def detail(correct):
        return {"correct": "".join("1" if c else "0" for c in correct), "test_set": "t"}

    def flip(correct, share):  # the same answers, with `share` of the wrong ones made right
        out = correct.copy()
        wrong = np.flatnonzero(~out)
        out[wrong[: int(share * len(wrong))]] = True
        return out

    per_seed = {"fedavg-priority": base, "fedavg-all": np.array([flip(c, 0.02) for c in base]),
                "fedalign": np.array([flip(c, 0.5) for c in base]), "varsel": np.array([flip(c, 0.01) for c in base])}
    runs = [{"choice": "A", "algorithm": a, "seed": s, "final": float(c[s].mean()), "final_detail": detail(c[s])}
            for a, c in per_seed.items() for s in range(2)]
    row = summarise(runs)["A"]
    assert row["fedalign"]["vs_fedavg-priority"]["verdict"] == "wins" and row["fedalign"]["wins_both"]
    # VaRSeL is ahead by 1% of the wrong answers: a lead, but not one these examples can tell.
    assert row["varsel"]["vs_fedavg-priority"]["verdict"] == "within noise" and not row["varsel"]["wins_both"]
    assert row["varsel"]["mean"] > row["fedavg-priority"]["mean"]
    iv = row["fedalign"]["interval"]
    assert iv["low"] < row["fedalign"]["mean"] < iv["high"]
    table = markdown(summarise(runs), "accuracy")
    assert "**win**" in table and "within noise" in table
