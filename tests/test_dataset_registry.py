"""The dataset table (edge_sdk.data.registry): every dataset a zoo model names is registered and loads
into that model; the data root is a setting whose absence is one line naming it; a new dataset is one
entry plus its loader; fleets validate against the table; and the zoo's Tiny Shakespeare and
Fed-TCGA-BRCA models run as fleets through ``edgetrain emulate`` on the real data."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_sdk.data import DATA_ENV, DATASETS, Dataset, DatasetUnavailable, load_dataset, partition, register_dataset
from edge_sdk.data.shakespeare import SEQ_LEN, STRIDE, load_roles, role_split, windows
from edge_sdk.data.tcga_brca import REGIONS
from edge_sdk.models.zoo import MODEL_NAMES, build_model, model_spec
from emulator.fleet import FleetError, load_fleet, parse_fleet
from emulator.localfleet import device_env
from orchestrator.server.evaluate import data_mismatch
from orchestrator.store import Store
from tests.shared_data import REPO, need

ZOO_DATASETS = sorted({model_spec(m).dataset for m in MODEL_NAMES} - {""})


def test_every_dataset_a_zoo_model_names_is_registered() -> None:
    assert {"tinyshakespeare", "fed_tcga_brca", "digits", "cifar10", "femnist"} <= set(ZOO_DATASETS)
    missing = [d for d in ZOO_DATASETS if d not in DATASETS]
    assert not missing, f"zoo models name datasets the table lacks: {missing}"


# FEMNIST's JSON and CIFAR-10's JPEGs take seconds to read: those cases run with the slow tests.
SLOW_DATASETS = ("femnist", "cifar10")


@pytest.mark.parametrize("model", [pytest.param(m, marks=[pytest.mark.slow] * (model_spec(m).dataset in SLOW_DATASETS))
                                   for m in MODEL_NAMES if model_spec(m).dataset])
def test_each_zoo_model_takes_its_dataset(model: str, tmp_path: Path) -> None:
    """The dataset loads (test split) and the model trains on its samples: shapes, labels, a finite loss;
    a dataset with natural clients has them."""
    spec = DATASETS[model_spec(model).dataset]
    root = need(spec.path) if spec.path else None
    data = load_dataset(spec.name, root=root, split="test", limit=1_000, cache_dir=tmp_path)
    net = build_model(model)
    assert data_mismatch(net, data.x.shape[1:], data.num_classes or None, spec.name) is None
    assert (data.groups is not None) == bool(spec.groups)
    out = net(torch.from_numpy(np.ascontiguousarray(data.x[:16])).to(net.input_dtype))
    assert math.isfinite(net.loss(out, torch.from_numpy(np.ascontiguousarray(data.y[:16]))).item())


def test_an_absent_data_root_is_one_line_naming_the_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(DATA_ENV, raising=False)
    assert len(load_dataset("digits")) == 1438 and len(load_dataset("synthetic")) == 400  # need no root
    with pytest.raises(DatasetUnavailable) as unset:
        load_dataset("tinyshakespeare")
    with pytest.raises(DatasetUnavailable) as given:
        load_dataset("fed_tcga_brca", root=tmp_path)
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    with pytest.raises(DatasetUnavailable) as from_env:
        load_dataset("mnist", split="test", mmap=True, cache_dir=tmp_path)
    for e, words in ((unset, ["'tinyshakespeare'", "no data root is set"]),
                     (given, ["'fed_tcga_brca'", str(tmp_path / "fed_tcga_brca")]),
                     (from_env, ["'mnist'", str(tmp_path / "mnist"), f"from ${DATA_ENV}"])):
        message = str(e.value)
        assert "\n" not in message and "--data-root" in message and f"${DATA_ENV}" in message, message
        assert all(w in message for w in words), message


def test_a_new_dataset_is_one_entry_plus_its_loader(tmp_path: Path) -> None:
    folder = tmp_path / "sensors"
    folder.mkdir()
    rows = np.arange(60, dtype=np.float32).reshape(20, 3)
    np.savetxt(folder / "readings.csv", rows, delimiter=",")

    @register_dataset("sensor_readings", path="sensors", groups="sensor", description="a test's own dataset")
    def _load(where: Path, split: str) -> Dataset:
        table = np.loadtxt(where / "readings.csv", delimiter=",", dtype=np.float32)
        table = table[:15] if split == "train" else table[15:]
        return Dataset(table[:, :2], (table[:, 2] % 2).astype(np.int64), 2, "sensor_readings",
                       groups=(np.arange(len(table)) >= 12).astype(np.int64))  # two sensors

    try:
        with pytest.raises(ValueError, match="registered twice"):
            register_dataset("sensor_readings", description="again")(_load)
        train = load_dataset("sensor_readings", root=tmp_path)
        mapped = load_dataset("sensor_readings", root=tmp_path, mmap=True, cache_dir=tmp_path / "cache")
        assert len(train) == 15 and len(load_dataset("sensor_readings", root=tmp_path, split="test")) == 5
        np.testing.assert_array_equal(mapped.x, train.x)
        parts = partition(mapped.groups, 2, "natural")
        assert sorted(len(p) for p in parts) == [3, 12]  # whole sensors: readings 0-11 and 12-14
    finally:
        DATASETS.pop("sensor_readings", None)


def test_tinyshakespeare_is_each_roles_text_in_windows() -> None:
    root = need("tinyshakespeare")
    train, test = load_dataset("tinyshakespeare", root=root), load_dataset("tinyshakespeare", root=root, split="test")
    roles, vocab = load_roles(root)
    assert train.num_classes == len(vocab) == 65 and train.info["roles"] == tuple(r.device_id for r in roles)
    assert train.x.shape[1] == SEQ_LEN == build_model("char_lstm").input_shape[0]
    assert train.x.dtype == np.int64 and 0 <= train.y.min() and train.y.max() < 65
    # One role's samples are the windows of its text's first 80%; its test samples come from the rest.
    g = int(np.bincount(train.groups).argmax())
    head, _, tail = role_split(roles[g].text, test=0.2)
    x, y = windows(vocab.encode(head), SEQ_LEN, STRIDE)
    np.testing.assert_array_equal(train.x[train.groups == g], x)
    np.testing.assert_array_equal(train.y[train.groups == g], y)
    assert np.array_equal(test.x[test.groups == g], windows(vocab.encode(tail), SEQ_LEN, STRIDE)[0])
    assert len(np.unique(train.groups)) > 300 and set(np.unique(test.groups)) <= set(np.unique(train.groups))


def test_fed_tcga_brca_groups_are_flambys_regions() -> None:
    root = need("fed_tcga_brca")
    train, test = load_dataset("fed_tcga_brca", root=root), load_dataset("fed_tcga_brca", root=root, split="test")
    assert train.info["regions"] == REGIONS and train.num_classes == 0 and train.y.shape == (866, 2)
    # the datasets README: train/test 248/63, 156/40, 164/42, 129/33, 129/33, 40/11
    assert np.bincount(train.groups).tolist() == [248, 156, 164, 129, 129, 40]
    assert np.bincount(test.groups).tolist() == [63, 40, 42, 33, 33, 11]


# -- fleets ----------------------------------------------------------------------------------------
FLEET = {"fleet": {"model": "tiny"}, "groups": [{"class": "mid-phone", "count": 2}]}


@pytest.mark.parametrize(("fleet", "key", "message"), [
    ({"model": "char_lstm", "dataset": "imdb"}, "fleet.dataset", "trains on 'tinyshakespeare'"),
    ({"model": "bilstm"}, "fleet.dataset", "names no dataset"),
    ({"model": "bilstm", "dataset": "imdb"}, "fleet.dataset", "unknown dataset 'imdb'; known: "),
])
def test_a_fleet_names_a_registered_dataset(fleet: dict, key: str, message: str) -> None:
    with pytest.raises(FleetError, match=message) as e:
        parse_fleet({**FLEET, "fleet": fleet})
    assert e.value.key == key


def test_natural_partitions_follow_the_table_and_the_data_root_sits_beside_the_file(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="dataset 'mnist' has no natural clients; natural works with .*tinyshakespeare"):
        parse_fleet({**FLEET, "fleet": {"model": "mnist_2nn"}, "partition": {"scheme": "natural"}})
    path = tmp_path / "mine.toml"
    path.write_text('[fleet]\nmodel = "cox_linear"\ndata_root = "data"\n[partition]\nscheme = "natural"\n'
                    '[[groups]]\nclass = "mid-phone"\ncount = 6\n')
    fleet = load_fleet(path)
    assert (fleet.dataset, fleet.data_root) == ("fed_tcga_brca", str(tmp_path / "data"))
    assert load_fleet("tcga-brca-cox").data_root is None


def _edgetrain(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgetrain", *args], capture_output=True, text=True,
                          env=env, timeout=300, cwd=REPO)


@pytest.mark.slow  # a whole-command run; the quick tier keeps a sibling
def test_emulate_refuses_absent_data_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in device_env().items() if k != DATA_ENV}
    unset = _edgetrain("emulate", "--fleet", "tinyshakespeare-char-lstm", "--out", str(tmp_path), env=env)
    given = _edgetrain("emulate", "--fleet", "tcga-brca-cox", "--data-root", str(tmp_path), "--out", str(tmp_path),
                       env=env)
    for out, words in ((unset, ["'tinyshakespeare'", "no data root is set"]),
                       (given, ["'fed_tcga_brca'", str(tmp_path / "fed_tcga_brca")])):
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) <= 2 and all(w in out.stderr for w in words), out.stderr
    assert not list(tmp_path.iterdir())  # refused before a run folder was made


@pytest.mark.slow
@pytest.mark.parametrize(("fleet", "folder", "devices", "samples", "root_from"), [
    ("tinyshakespeare-char-lstm", "tinyshakespeare", 8, None, "--data-root"),
    ("tcga-brca-cox", "fed_tcga_brca", 6, [40, 129, 129, 156, 164, 248], "fleet"),  # one region each
])
def test_the_fleet_runs_two_rounds_through_edgetrain_emulate(fleet: str, folder: str, devices: int,
                                                             samples: list[int] | None, root_from: str,
                                                             tmp_path: Path) -> None:
    """The shipped fleet, its data root given by ``--data-root``, or by its own ``[fleet] data_root``
    with no $EDGETRAIN_DATA: the server and every device find the data through the setting."""
    root = need(folder)
    args, env = ["--data-root", str(root)], device_env()
    if root_from == "fleet":
        text = load_fleet(fleet).path.read_text().replace("\nseed = 0\n", f'\nseed = 0\ndata_root = "{root}"\n', 1)
        assert "data_root" in text
        (tmp_path / f"{fleet}.toml").write_text(text)
        fleet, args, env = str(tmp_path / f"{fleet}.toml"), [], {k: v for k, v in env.items() if k != DATA_ENV}
    out = _edgetrain("emulate", "--fleet", fleet, "--rounds", "2", *args, "--out", str(tmp_path / "runs"), env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    rounds = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    assert [(r["round"], r["reported"]) for r in rounds] == [(1, devices), (2, devices)]
    assert all(math.isfinite(r["test_loss"]) for r in rounds)
    with Store.open_readonly(run_dir / "store") as store:
        assert store.rounds.completed() == 2
        held = sorted(u["num_samples"] for u in store.reports.all(1))
    dataset = load_dataset(load_fleet(fleet).dataset, root=root)
    assert sum(held) == len(dataset)  # every training sample is on exactly one device
    if samples is not None:
        assert held == samples


# -- the docs --------------------------------------------------------------------------------------
GUIDE = REPO / "docs" / "device-guide.md"
START, END = "<!-- dataset table:", "<!-- end of dataset table -->"


def dataset_table() -> str:
    rows = ["| name | natural clients | under the data root | needs | what |", "|---|---|---|---|---|"]
    for s in DATASETS.values():
        where = (f"`{s.path}/`" if s.path else f"(inside {s.package_file.split('/')[0]})" if s.package_file
                 else "(made on the spot)")
        rows.append(f"| `{s.name}` | {s.groups or '-'} | {where} | {s.needs or '-'} | {s.description} |")
    return "\n".join(rows)


def test_the_device_guide_lists_every_dataset_as_registered() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index(START)
    body = text[text.index("\n", start) + 1: text.index(END)].strip()
    assert body == dataset_table(), f"docs/device-guide.md's dataset table should read:\n{dataset_table()}"
