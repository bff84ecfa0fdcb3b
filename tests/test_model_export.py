"""The trained model out of a run (``edgetrain export``) and a server a person can read (``edgetrain serve``).

One real run serves the slow tests: ``edgetrain serve`` in a subprocess, as a person starts it (no
``--json-events``), with a log file, and two device processes on 127.0.0.1, one training with torch
and one on ONNX Runtime's training graphs (so the server exports chunks and a training graph).
``edgetrain export`` of that run writes an ONNX model that ONNX Runtime loads and that scores, on the
server's evaluation data, what the server's evaluation scored for that round; and the server's
terminal shows a line per round and none of the exporter libraries' chatter.
"""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from rich.console import Console

from edge_sdk.models import build_model
from emulator.launch import DeviceLaunch, device_argv
from emulator.localfleet import device_env, role_budgets
from exporters.model_export import export_model, read_metadata
from orchestrator.config import ServerConfig
from orchestrator.server.evaluate import Evaluator
from orchestrator.store import Store
from orchestrator.views.terminal import ServeOutput, ServeView, round_line

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 2
#: What the exporter libraries print when nothing quiets them (exporters/__init__.py).
THIRD_PARTY = ("torchvision is not installed", "onnxscript", "onnx_ir", "Skipping constant folding", "unused nodes")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _edgetrain(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgetrain", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=device_env())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A finished two-round run: its store, the server's stdout, stderr and log file."""
    tmp = tmp_path_factory.mktemp("served")
    port, store, log = _free_port(), tmp / "store", tmp / "serve.jsonl"
    server = subprocess.Popen(
        [sys.executable, "-m", "edgetrain", "serve", "--model", "digits_mlp", "--rounds", str(ROUNDS),
         "--min-devices", "2", "--local-steps", "3", "--port", str(port), "--store", str(store), "--log-file", str(log),
         "--straggler-policy", "deadline"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=device_env())
    url = f"ws://127.0.0.1:{port}"
    launches = [DeviceLaunch("strong-0", role_budgets("digits_mlp")["strong"], client=0, num_clients=2, backend="torch"),
                DeviceLaunch("weak-1", role_budgets("digits_mlp", backend="onnxruntime")["weak"], client=1,
                             num_clients=2, backend="onnxruntime")]
    devices = [subprocess.Popen(device_argv(d, url), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=device_env()) for d in launches]
    try:
        out, err = server.communicate(timeout=420)
        for d in devices:
            d.wait(timeout=60)
    finally:
        for proc in [server, *devices]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert server.returncode == 0, err[-3000:]
    with Store.open_readonly(store) as s:
        rounds = {r["round"]: r["metrics"] for r in s.rounds.all() if r["complete"]}
        plans = {d["device_id"]: d["plan"] for d in s.devices.all()}
    assert sorted(rounds) == [1, 2] and plans["weak-1"]["backend"] == "onnxruntime", plans  # it trains from a training graph
    return {"store": store, "out": out, "err": err, "log": log, "rounds": rounds}


def _scores(session: ort.InferenceSession, evaluator: Evaluator, model_name: str) -> dict[str, float]:
    """The server's scoring (orchestrator.server.evaluate.Evaluator.evaluate), on ONNX Runtime's outputs."""
    loss_fn = build_model(model_name, seed=None).loss
    loss_sum, correct = 0.0, 0
    for i in range(0, len(evaluator.x), 256):
        xb, yb = evaluator.x[i:i + 256], torch.from_numpy(np.ascontiguousarray(evaluator.y[i:i + 256]))
        out = torch.from_numpy(session.run(None, {"input": np.ascontiguousarray(xb, dtype=np.float32)})[0])
        loss_sum += float(loss_fn(out, yb)) * len(xb)
        correct += int((out.argmax(dim=1) == yb).sum())
    return {"accuracy": correct / len(evaluator.x), "test_loss": loss_sum / len(evaluator.x)}


@pytest.mark.slow
@pytest.mark.parametrize("round_", [ROUNDS, 1])
def test_the_exported_model_scores_what_the_server_scored(served: dict, round_: int, tmp_path: Path) -> None:
    args = ["export", "--store", str(served["store"]), "--out", str(tmp_path)]
    out = _edgetrain(*args, *(["--round", str(round_)] if round_ != ROUNDS else []))
    assert out.returncode == 0, out.stderr
    assert f"digits_mlp after round {round_} of {ROUNDS}" in out.stdout
    metrics = served["rounds"][round_]
    session = ort.InferenceSession((tmp_path / "model.onnx").read_bytes())  # self-contained bytes
    meta = read_metadata(session.get_modelmeta().custom_metadata_map)
    assert meta == json.loads((tmp_path / "model.json").read_text())
    assert meta["round"] == round_ and meta["model"] == "digits_mlp" and meta["rounds_completed"] == ROUNDS
    assert meta["evaluation"] == {"accuracy": metrics["accuracy"], "test_loss": metrics["test_loss"],
                                  "test_samples": metrics["test_samples"], "data": "digits"}
    settings = meta["settings"]
    assert meta["settings_source"] == "journal" and settings["strategy"] == "embracingfl"
    assert (settings["rounds"], settings["lr"], settings["local_steps"], settings["strategy_options"]) == (2, 0.05, 3, {})
    assert meta["privacy"] is None and meta["fleet"] is None  # no privacy ledger in this run
    assert session.get_inputs()[0].shape[0] == session.get_outputs()[0].shape[0] == "batch"  # any batch

    # The server's evaluation data, as the server chose it from the recorded settings.
    evaluator = Evaluator(ServerConfig(eval_data=settings["eval_data"], eval_limit=settings["eval_limit"],
                                       seed=settings["seed"], store_dir=tmp_path))
    assert len(evaluator.x) == metrics["test_samples"]
    scored = _scores(session, evaluator, "digits_mlp")
    assert scored["accuracy"] == metrics["accuracy"]
    assert scored["test_loss"] == pytest.approx(metrics["test_loss"], rel=1e-6, abs=1e-7)  # float32 rounding

    # The torch state dict is that model too.
    model = build_model("digits_mlp", seed=None)
    model.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))
    again = Evaluator.evaluate(evaluator, model)
    assert again["accuracy"] == metrics["accuracy"]
    # The loss is a sum of float32 batch means whose reduction order follows the evaluating thread's
    # torch thread count: the server scores in a worker thread, this test in its main thread.
    assert again["test_loss"] == pytest.approx(metrics["test_loss"], rel=1e-6)


@pytest.mark.slow
def test_the_docs_app_snippet_runs_on_an_exported_model(served: dict, tmp_path: Path) -> None:
    page = (ROOT / "docs" / "web.md").read_text()
    section = page[page.index("## After the run: the trained model in an app"):]
    snippet = re.search(r"^```python\n(.*?)^```", section, flags=re.S | re.M).group(1)
    assert _edgetrain("export", "--store", str(served["store"]), "--out", str(tmp_path)).returncode == 0
    out = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith(f"digits_mlp after round {ROUNDS} scored {{'accuracy': ") and "class " in out.stdout


@pytest.mark.slow
def test_serve_shows_rounds_and_no_third_party_lines(served: dict) -> None:
    out, err = served["out"], served["err"]
    for text in (out, err):
        assert not any(noise in text for noise in THIRD_PARTY), text[-3000:]
    for r, metrics in served["rounds"].items():
        line = f"round {r}/{ROUNDS}, 2 of 2 reported, accuracy {metrics['accuracy']:.4f}, loss {metrics['test_loss']:.4f}"
        assert line in out, out
    assert "listening on ws://127.0.0.1:" in out and f"edgetrain export --store {served['store']}" in out
    assert not any(line.startswith("{") for line in out.splitlines())  # the JSON events went to the log file
    events = [json.loads(line) for line in served["log"].read_text().splitlines()]
    ends = {e["round"]: e for e in events if e.get("event") == "round_end"}
    assert {r: e["accuracy"] for r, e in ends.items()} == {r: m["accuracy"] for r, m in served["rounds"].items()}
    assert {"listening", "registered", "round_start", "update"} <= {e.get("event") for e in events}


QUIET_THEN_LOUD = """
import logging, sys
from pathlib import Path
from edgetrain.cli import console
from orchestrator.config import ServerConfig
from orchestrator.views.terminal import ServeOutput
ServeOutput(ServerConfig(store_dir=Path(sys.argv[1])), console(), json_events=True, log_file=None)  # serve's logging
import exporters
from edge_sdk.models import build_model
from exporters.onnx_export import export_chunk
from exporters.train_export import export_train_graph
model = build_model("digits_mlp", seed=0)
export_chunk(model, 0, 2)  # with the server's export settings
export_train_graph(model, 2)
print("--- loud", file=sys.stderr, flush=True)
for name in exporters.PASS_LOGGERS:  # what the server printed before the exporters quieted their libraries
    logging.getLogger(name).setLevel(logging.NOTSET)
logging.getLogger(exporters.REGISTRY_LOGGER).filters.clear()
export_train_graph(model, 2)
"""


@pytest.mark.slow
def test_exporting_a_chunk_and_a_training_graph_prints_no_third_party_lines(tmp_path: Path) -> None:
    """The path a server takes for an ONNX Runtime device (a chunk, a training graph through the dynamo exporter),
    under serve's most talkative logging (--json-events: every INFO line on standard error), is quiet;
    the same exports with the libraries' loggers as they come print those lines."""
    out = subprocess.run([sys.executable, "-c", QUIET_THEN_LOUD, str(tmp_path)], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    quiet, loud = out.stderr.split("--- loud\n")
    assert not any(noise in quiet for noise in THIRD_PARTY), quiet
    assert "torchvision is not installed" in loud and "onnxscript" in loud and "onnx_ir" in loud, loud


def _config(tmp_path: Path) -> ServerConfig:
    return ServerConfig(model="digits_mlp", rounds=3, min_devices=2, store_dir=tmp_path)


def test_the_view_prints_a_line_per_round_and_per_refusal(tmp_path: Path) -> None:
    text = io.StringIO()
    view = ServeView(Console(file=text, width=200), _config(tmp_path))
    for kind, data in [
        ("listening", {"host": "127.0.0.1", "port": 8765, "tls": False}),
        ("registered", {"device": "a", "role": "strong", "split": 0}),
        ("registered", {"device": "b", "role": "weak", "split": 3}),
        ("registered", {"device": "c", "role": "weak", "split": 3}),
        ("closed", {"device": "d", "code": "refused", "message": "digits_mlp does not fit a budget of 1 MiB"}),
        ("round_start", {"round": 1, "selected": 3}),
        ("update", {"device": "b", "round": 1, "role": "weak", "phase": "train", "accepted": False,
                    "reason": "loss not within epsilon", "reported": 1, "selected": 3}),
        ("round_failed", {"round": 1, "attempt": 1, "reason": "validation loss rose", "devices": ["a", "b"]}),
        ("round_end", {"round": 1, "selected": 3, "reported": 3, "accuracy": 0.5, "test_loss": 1.25,
                       "round_wall_s": 2.04, "stragglers": []}),
        ("round_end", {"round": 2, "selected": 3, "reported": 2, "loss_after": 0.75, "round_wall_s": 1.0,
                       "stragglers": ["c"], "failed": "non-finite values in fc.weight"}),
    ]:
        view.on_event(kind, data)
    lines = text.getvalue().splitlines()
    assert lines[0].startswith("listening on ws://127.0.0.1:8765; store ") and "waiting for 2 devices" in lines[0]
    assert lines[1] == "closed: d: digits_mlp does not fit a budget of 1 MiB"
    assert lines[2] == "refused: b's train report of round 1: loss not within epsilon"
    assert lines[3] == "round failed: - (round 1): validation loss rose"  # shown, not a device's refusal
    assert lines[4] == "round 1/3, 3 of 3 reported, accuracy 0.5000, loss 1.2500, 2.0 s, 2 refused"
    assert lines[5] == ("round 2/3, 2 of 3 reported, devices' loss 0.7500, 1.0 s, stragglers c, "
                        "not committed: non-finite values in fc.weight")
    assert view.progress.tasks[view.conn_task].total == 3  # more devices than --min-devices joined


def test_json_events_are_the_lines_tools_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = ServeOutput(_config(tmp_path), Console(file=io.StringIO()), json_events=True, log_file=tmp_path / "l")
    with output:
        output.on_event("round_end", {"round": 1, "accuracy": 0.5})
    out = capsys.readouterr().out
    assert [json.loads(line) for line in out.splitlines()] == [{"event": "round_end", "round": 1, "accuracy": 0.5}]
    logged = json.loads((tmp_path / "l").read_text())
    assert (logged["event"], logged["round"], logged["accuracy"]) == ("round_end", 1, 0.5)


def test_export_model_carries_its_metadata_and_matches_torch() -> None:
    model = build_model("digits_mlp", seed=3).eval()
    exported = export_model(model, {"round": 7, "evaluation": {"accuracy": 0.25}, "privacy": None}, version=7)
    session = ort.InferenceSession(exported.onnx)
    assert read_metadata(session.get_modelmeta().custom_metadata_map) == {
        "round": 7, "evaluation": {"accuracy": 0.25}, "privacy": None}
    assert session.get_modelmeta().version == 7 and exported.max_abs_diff < 1e-5
    x = np.random.default_rng(0).random((5, 64), dtype=np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(session.run(None, {"input": x})[0], expected, atol=1e-5)


def test_round_line_leaves_out_what_a_round_lacks() -> None:
    assert round_line({"round": 4, "selected": 1, "reported": 1, "round_wall_s": 0.25}, 9) == \
        "round 4/9, 1 of 1 reported, 0.2 s"


def _stored_run(tmp_path: Path, extra: dict) -> tuple[Path, dict]:
    """An emulated run's folder as `edgetrain emulate` leaves it: store/ (two completed rounds of the
    tiny model) beside metrics.json (its settings and fleet)."""
    store_dir = tmp_path / "run" / "store"
    model = build_model("tiny", seed=1)
    states = {r: {k: v.numpy() * r for k, v in model.state_dict().items()} for r in (1, 2)}
    with Store(store_dir, keep=1) as store:
        for key, value in (("model", "tiny"), ("strategy", "fedavg"), ("seed", "1")):
            store.meta.record(key, value)
        for r, state in states.items():
            store.rounds.begin(r, ["a", "b"])
            store.rounds.complete(r, state, {"round": r, "accuracy": 0.25 * r, "test_loss": 1.0 / r,
                                            "test_samples": 40.0, **extra})
    config = ServerConfig(model="tiny", strategy="fedavg", rounds=2, lr=0.125, eval_data="synthetic", seed=1,
                          token="secret", store_dir=store_dir)
    (tmp_path / "run" / "metrics.json").write_text(json.dumps(
        {"fleet": "tiny-lab", "fleet_file": "fleets/tiny-lab.toml", "config": config.to_dict()}))
    return tmp_path / "run", states[2]


def test_an_emulated_run_exports_with_its_fleet_settings_and_privacy(tmp_path: Path) -> None:
    from edgetrain.cli import main

    privacy = {"epsilon": 3.5, "delta": 1e-5, "blocks": {"fc1": 2.0}, "rounds": 2}
    run, state = _stored_run(tmp_path, {"privacy": privacy})
    main(["export", "--store", str(run)])  # the run's folder, as emulate prints it
    folder = run / "store" / "exports" / "round-000002"
    meta = json.loads((folder / "model.json").read_text())
    assert meta["settings_source"] == "metrics.json" and meta["fleet"] == {"name": "tiny-lab",
                                                                            "file": "fleets/tiny-lab.toml"}
    assert (meta["settings"]["lr"], meta["settings"]["rounds"], meta["settings"]["strategy"]) == (0.125, 2, "fedavg")
    assert not {"token", "host", "port", "store_dir"} & meta["settings"].keys()  # what it was trained under only
    assert meta["privacy"] == privacy and meta["evaluation"]["data"] == "synthetic"
    assert meta["input"] == {"name": "input", "shape": ["batch", 4], "dtype": "float32"}
    assert meta["output"]["shape"] == ["batch", 2] and meta["output"]["classes"] == 2
    weights = torch.load(folder / "model.pt", weights_only=True)
    assert {k: v.numpy().tolist() for k, v in weights.items()} == {k: v.tolist() for k, v in state.items()}


def test_a_round_without_its_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    run, _ = _stored_run(tmp_path, {})
    with Store.open_readonly(run / "store") as store:
        with pytest.raises(LookupError, match="checkpoint of round 1 is no longer in .*rounds with one: 2"):
            store.checkpoints.read(1)  # pruned: the store kept one
        with pytest.raises(LookupError, match="round 3 is not a completed round .*last completed round is 2"):
            store.checkpoints.read(3)
    out = _edgetrain("export", "--store", str(run), "--round", "1")
    assert out.returncode == 1 and out.stderr.startswith("edgetrain export: the checkpoint of round 1"), out.stderr
