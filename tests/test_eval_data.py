"""The server scores the model on the user's own held-out file (``--eval-data``), refuses at start a
model that cannot take its evaluation data, and refuses at hello a device whose declared data the model
cannot take, before any byte of the model is sent."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest

from edge_sdk import protocol as p
from edge_sdk.client import DeviceClient, DeviceSettings, DeviceRefused
from edge_sdk.data import load_dataset, partition
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from orchestrator.server.evaluate import Evaluator, evaluation_arrays

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples.own_model.model:make_model"
HOLDOUT = 150  # samples in the user's file: no built-in split has this many


def holdout() -> tuple[np.ndarray, np.ndarray]:
    """A ``package.module:function`` evaluation set: the first samples of digits' test split."""
    test = load_dataset("digits", split="test")
    return test.x[:HOLDOUT], test.y[:HOLDOUT]


def _csv(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    header = ",".join([f"p{i}" for i in range(x.shape[1])] + ["label"])
    path.write_text(header + "\n" + "\n".join(",".join(f"{v:.6g}" for v in (*xi, yi)) for xi, yi in zip(x, y)) + "\n")
    return path


def _edgetrain(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgetrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=180, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_a_model_outside_the_zoo_is_scored_on_the_users_file(tmp_path: Path) -> None:
    """Two torch devices train the example's own model on digits for two rounds; the server scores
    each round on a CSV file of the user's (150 samples), not on a built-in split."""
    csv = _csv(tmp_path / "holdout.csv", *holdout())
    config = ServerConfig(model=EXAMPLE, eval_source=str(csv), rounds=2, min_devices=2, local_steps=10, lr=0.1,
                          store_dir=tmp_path / "store", deadline_s=120)
    digits = load_dataset("digits")
    shards = [(digits.x[i], digits.y[i]) for i in partition(digits.y, 2, "iid", seed=0)]

    async def run() -> list[dict]:
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        devices = [DeviceClient(DeviceSettings(f"ws://127.0.0.1:{orch.port}", f"d{i}", 1 << 30, backend="torch"), x, y)
                   for i, (x, y) in enumerate(shards)]
        await asyncio.gather(*(d.run() for d in devices))
        return await asyncio.wait_for(server, timeout=120)

    history = asyncio.run(run())
    assert [h["round"] for h in history] == [1, 2]
    assert all(h["test_samples"] == HOLDOUT for h in history), history
    assert history[-1]["accuracy"] > 0.5, history


def test_eval_data_takes_a_function_a_table_or_none(tmp_path: Path) -> None:
    x, y = holdout()
    np.savez(tmp_path / "holdout.npz", x=x, y=y)
    for given in ("tests.test_eval_data:holdout", str(tmp_path / "holdout.npz")):
        ex, ey = evaluation_arrays(ServerConfig(eval_source=given))
        np.testing.assert_array_equal(ex, x)
        np.testing.assert_array_equal(ey, y)
    evaluator = Evaluator(ServerConfig(eval_source="none"))
    assert not evaluator.enabled and evaluator.evaluate(None) == {}  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--eval-data .*nosuch.csv"):
        evaluation_arrays(ServerConfig(eval_source=str(tmp_path / "nosuch.csv")))


def test_a_fleet_file_names_its_evaluation_set(tmp_path: Path) -> None:
    from emulator.fleet import load_fleet

    fleet = tmp_path / "own.toml"
    fleet.write_text('[fleet]\nmodel = "digits_mlp"\n[training]\nrounds = 1\neval_source = "tests.test_eval_data:holdout"\n'
                     '[[groups]]\nclass = "pi-4-2gb"\ncount = 1\n')
    assert load_fleet(fleet).training.eval_source == "tests.test_eval_data:holdout"


def test_a_fleet_files_relative_evaluation_file_is_read_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fleet runs the same from any working directory: its held-out file is found next to it."""
    from emulator.fleet import load_fleet

    x, y = holdout()
    folder = tmp_path / "fleets"
    folder.mkdir()
    np.savez(folder / "holdout.npz", x=x, y=y)
    fleet = folder / "own.toml"
    fleet.write_text('[fleet]\nmodel = "digits_mlp"\n[training]\nrounds = 1\neval_source = "holdout.npz"\n'
                     '[[groups]]\nclass = "pi-4-2gb"\ncount = 1\n')
    monkeypatch.chdir(tmp_path)
    training = load_fleet(fleet).training
    assert Path(training.eval_source) == folder / "holdout.npz"
    got_x, got_y = evaluation_arrays(training)
    np.testing.assert_array_equal(got_y, y)


@pytest.mark.slow
@pytest.mark.parametrize(("args", "shapes"), [
    (["--model", EXAMPLE, "--eval-data", "WIDE"], ("(64,)", "(32,)")),
    (["--model", "resnet20"], ("(3, 32, 32)", "(64,)")),  # the default evaluation set: digits
    (["--model", EXAMPLE, "--eval-data", "MANY"], ("10 classes", "labels 0..19")),
])
def test_serve_refuses_a_model_its_evaluation_data_does_not_fit(args: list[str], shapes: tuple[str, str],
                                                                 tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "wide.npz", x=rng.random((20, 32), dtype=np.float32), y=np.arange(20) % 10)
    np.savez(tmp_path / "many.npz", x=rng.random((20, 64), dtype=np.float32), y=np.arange(20))
    args = [{"WIDE": str(tmp_path / "wide.npz"), "MANY": str(tmp_path / "many.npz")}.get(a, a) for a in args]
    out = _edgetrain("serve", *args, "--store", str(tmp_path / "s"), "--rounds", "1", cwd=ROOT)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert all(s in out.stderr for s in shapes) and "--eval-data" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2, out.stderr


def test_a_device_whose_data_does_not_fit_is_refused_at_hello(tmp_path: Path) -> None:
    """The device's samples have 32 features where the model takes 64: refused at its hello, with
    both shapes named, before the welcome (nothing of the model is sent); a fitting device trains."""
    config = ServerConfig(model="digits_mlp", rounds=1, min_devices=1, local_steps=2, store_dir=tmp_path / "store",
                          eval_every=0, deadline_s=60)
    digits = load_dataset("digits", limit=200)
    events: list[tuple[str, dict]] = []

    async def run() -> tuple[BaseException | list, list[dict]]:
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        wrong = DeviceClient(DeviceSettings(url, "narrow", 1 << 30, backend="torch", reconnect=False),
                             digits.x[:, :32].copy(), digits.y, on_event=lambda k, d: events.append((k, d)))
        refused = (await asyncio.gather(wrong.run(), return_exceptions=True))[0]
        right = DeviceClient(DeviceSettings(url, "fits", 1 << 30, backend="torch"), digits.x, digits.y)
        await right.run()
        return refused, await asyncio.wait_for(server, timeout=60)

    refused, history = asyncio.run(run())
    assert isinstance(refused, DeviceRefused), refused
    assert "(64,)" in str(refused) and "(32,)" in str(refused), refused
    assert not [k for k, _ in events if k == "welcome"]
    assert history[-1]["reported"] == 1


def test_the_declared_data_is_optional_on_the_wire() -> None:
    """A device that predates the fields (the JavaScript device) sends a hello without them; a Python
    device leaves them out when it declares nothing."""
    hello = p.Hello(device_id="js", token="", budget_bytes=1 << 20, cores=1, runtimes=["onnxruntime"], num_samples=5)
    body = msgpack.unpackb(p.encode(hello))
    assert "input_shape" not in body and "num_classes" not in body
    assert p.decode(p.encode(hello)) == hello
    declared = p.Hello(device_id="py", token="", budget_bytes=1 << 20, cores=1, runtimes=["torch"], num_samples=5,
                       input_shape=(1, 28, 28), num_classes=10)
    assert p.decode(p.encode(declared)) == declared
    with pytest.raises(p.ProtocolError, match="input_shape"):
        p.encode(p.Hello(device_id="bad", token="", budget_bytes=1, cores=1, runtimes=[], num_samples=1,
                         input_shape=[0]))
