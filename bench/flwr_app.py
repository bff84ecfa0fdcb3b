"""The Flower side of ``bench/vs_flower.py``: the workload as a Flower ServerApp and ClientApp.

Runs in Flower's own virtual environment (``bench/.venv-flwr``, made by ``vs_flower.py``) and imports
only flwr, torch, numpy and the workload code (``bench/fl_common.py``, the zoo's ``mnist_cnn``) from
the repository named by ``VS_FLOWER_REPO``; the settings come as JSON in ``VS_FLOWER_SETTINGS``.

- ``python bench/flwr_app.py simulate``: Flower's simulation engine (``flwr.simulation.run_simulation``,
  Ray), one virtual SuperNode per device, one CPU per ClientApp.
- ``python bench/flwr_app.py deploy``: Flower's deployment mode on 127.0.0.1: ``flower-superlink
  --insecure``, one ``flower-supernode --insecure`` process per device (``partition-id`` in its node
  config), the app submitted with ``flwr run`` (a Flower App directory written to a temporary folder).

The ServerApp runs Flower's message-based ``FedAvg`` (``flwr.serverapp.strategy``) with
``fraction_train`` = per_round / clients, no federated evaluation, and records when each round's
training messages leave and when their replies are aggregated, with the loopback bytes at both
instants; after the last round it scores the model on the MNIST test split and writes everything
to the ``out`` file of the settings.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_REPO = Path(os.environ.get("VS_FLOWER_REPO") or Path(__file__).resolve().parents[1])
for _p in (_REPO, _REPO / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402


class _Lazy:
    """``fl_common`` (and so torch) imported on first use, not when Flower loads this module: a
    deployment ClientApp process must reach its SuperNode within 30 s of being started
    (HEARTBEAT_DEFAULT_INTERVAL), which importing torch first can miss on a loaded machine."""

    def __getattr__(self, name: str):
        import fl_common

        return getattr(fl_common, name)


fc = _Lazy()

# -- ClientApp ---------------------------------------------------------------------------------
app = ClientApp()
_shards: dict[int, tuple] = {}


@app.train()
def train(msg: Message, context: Context) -> Message:
    s = fc.settings()
    cid = int(context.node_config["partition-id"])
    if cid not in _shards:  # a simulation actor keeps its shard; a deployment ClientApp process is new
        _shards[cid] = fc.load_shard(s["shard_dir"], cid)
    x, y = _shards[cid]
    model = fc.build(s["seed"])
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    rnd = int(msg.content["config"]["server-round"])
    loss = fc.train_local(model, x, y, steps=s["steps"], batch=s["batch"], lr=s["lr"], momentum=s["momentum"],
                          seed=fc.local_seed(s["seed"], rnd, cid))
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"num-examples": len(x), "train_loss": loss})})
    return Message(content=content, reply_to=msg)


# -- ServerApp ---------------------------------------------------------------------------------
class TimedFedAvg(FedAvg):
    """Flower's FedAvg, recording each round's start (messages built, nodes sampled) and end
    (replies aggregated), and the loopback bytes of this namespace at both."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.rounds: list[dict] = []

    def configure_train(self, server_round, arrays, config, grid):
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.rounds.append({"round": server_round, "t_start": time.time(), "lo_start": fc.lo_bytes(),
                            "selected": len(messages)})
        return messages

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        out = super().aggregate_train(server_round, replies)
        self.rounds[-1].update({"t_end": time.time(), "lo_end": fc.lo_bytes(), "reported": len(replies),
                                "errors": sum(1 for m in replies if m.has_error())})
        return out


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    s = fc.settings()
    random.seed(s["seed"])  # Flower's FedAvg samples nodes with random.sample
    model = fc.build(s["seed"])
    strategy = TimedFedAvg(fraction_train=s["per_round"] / s["clients"], fraction_evaluate=0.0,
                           min_train_nodes=s["per_round"], min_available_nodes=s["clients"])
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=s["rounds"],
                            train_config=ConfigRecord({"lr": s["lr"]}))
    t = time.time()
    model.load_state_dict(result.arrays.to_torch_state_dict())
    scores = fc.evaluate(model, *fc.load_test(s["shard_dir"]))
    out = {"rounds": strategy.rounds, **scores, "eval_s": time.time() - t, "serverapp_pid": os.getpid()}
    tmp = Path(s["out"] + ".tmp")
    tmp.write_text(json.dumps(out, indent=1))
    tmp.replace(s["out"])


# -- entry points ------------------------------------------------------------------------------
def simulate() -> None:
    from flwr.simulation import run_simulation

    s = fc.settings()
    run_simulation(server_app=server, client_app=app, num_supernodes=s["clients"],
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})


_PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "vsflower"
version = "1.0.0"
description = "edgetrain's side-by-side benchmark workload"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "edgetrain"

[tool.flwr.app.components]
serverapp = "flwr_app:server"
clientapp = "flwr_app:app"

[tool.flwr.app.config]
"""


def deploy() -> None:
    """SuperLink + one SuperNode per device as processes on 127.0.0.1, the app submitted with ``flwr run``."""
    s = fc.settings()
    bindir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    work = Path(tempfile.mkdtemp(prefix="vs-flower-deploy-"))
    home, appdir, logs = work / "flwr-home", work / "app", Path(s.get("log_dir") or work / "logs")
    for d in (home, appdir, logs):
        d.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__), appdir / "flwr_app.py")
    (appdir / "pyproject.toml").write_text(_PYPROJECT)
    port = int(s.get("flwr_port", 19100))
    env["FLWR_HOME"] = str(home)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "bench"\n\n[superlink.bench]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
    procs: list[subprocess.Popen] = []

    def start(name: str, argv: list[str]) -> subprocess.Popen:
        log = open(logs / f"{name}.log", "wb")
        p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
        procs.append(p)
        return p

    try:
        start("superlink", [str(bindir / "flower-superlink"), "--insecure", "--disable-runtime-dependency-installation",
                            "--port", str(port)])
        _wait_port(port, 120)
        for i in range(s["clients"]):
            start(f"supernode-{i:02d}", [
                str(bindir / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}",
                "--port", str(port + 1 + i), "--node-config", f"partition-id={i} num-partitions={s['clients']}"])
        run = subprocess.run([str(bindir / "flwr"), "run", str(appdir), "bench", "--format", "json"], env=env,
                             cwd=work, capture_output=True, text=True, timeout=300)
        (logs / "flwr-run.log").write_text(run.stdout + run.stderr)
        if run.returncode != 0:
            raise SystemExit(f"flwr run failed ({run.returncode}): {run.stdout[-2000:]} {run.stderr[-2000:]}")
        deadline = time.time() + float(s.get("timeout", 1800))
        while not Path(s["out"]).exists():
            if time.time() > deadline:
                raise SystemExit("the ServerApp did not finish in time; logs in " + str(logs))
            if procs[0].poll() is not None:
                raise SystemExit(f"flower-superlink exited ({procs[0].returncode}); logs in {logs}")
            time.sleep(0.5)
    finally:
        _stop(procs)
        shutil.rmtree(work, ignore_errors=True)


def _wait_port(port: int, timeout: float) -> None:
    import socket

    end = time.time() + timeout
    while time.time() < end:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stop the processes this script started, and what they started (SuperExec, ClientApp, ServerApp)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    family = []
    for p in procs:
        if psutil is not None:
            try:
                family += psutil.Process(p.pid).children(recursive=True)
            except psutil.Error:
                pass
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.time() + 15
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for c in family:
        try:
            if c.is_running():
                c.kill()
        except Exception:  # noqa: BLE001
            pass


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("simulate", "deploy"):
        raise SystemExit("usage: flwr_app.py simulate|deploy   (settings in $VS_FLOWER_SETTINGS)")
    simulate() if sys.argv[1] == "simulate" else deploy()
