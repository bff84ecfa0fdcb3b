"""Side by side with Flower: one federated workload run several ways in one run, on 127.0.0.1.

Lanes (``--lanes``, all by default, in this order):

- ``plain``: no framework: one process trains the sampled devices one after another and averages
  (FedAvg), torch one thread.
- ``ours-light``: this project's orchestrator (in the lane's process) and the emulator's lightweight
  mode (``emulator.lightweight.run_lightweight``, what ``edgetrain emulate`` runs for a
  fleet with ``mode = "lightweight"``): the devices are asyncio tasks of the real client, each over its
  own websocket, in ``--workers`` worker processes (2, as Flower's simulation runs 2 ClientApps at once
  on 2 cores) with ``--threads`` training threads each; the worker's CPU per round and the bytes per
  idle and per training device (from the workers' resident sets) are reported.
- ``ours``: this project's orchestrator (in the lane's process) with one real device process per
  device (``emulator.localfleet.run_local_fleet``, what ``edgetrain emulate`` runs), strategy
  ``fedavg``, every device strong (the whole model trained).
- ``ours-lean``: the same, with a FedAvg whose instructions ask devices to report their loss before
  and after training on one batch (``eval_samples``) instead of the SDK's default 512 samples.
- ``ours-lean-warm``: ``ours-lean`` with device processes that load torch and take one training step
  before they connect (a ``sitecustomize`` on their PYTHONPATH), as long-running devices have: by
  default a device does that in the first round it is sampled for, and with 10 of 20 devices sampled
  per round about half of round 2's devices (and some of rounds 3-5's) train for the first time.
- ``ours-light-defaults``, ``ours-defaults``: ``ours-light`` and ``ours`` with the orchestrator's defaults.
  Every other edgetrain lane runs its server with ``norm_bound = 0`` and ``direction_trust = false`` (no
  reference update trained on the server's data each round), ``max_loss_rise = 0`` (no validation before commit) and ``loss_after =
  false`` (devices report the loss before training and the mean of their steps' losses, with no forward
  pass after training) and float32 transfers (no payload, delta or update codec: ``orchestrator.config.EXACT_TRANSFERS``),
  the settings a fleet's ``[training]`` may give, because Flower's strategies and the plain loop do none
  of that (Flower's client reports the mean loss of its steps and sends float32 arrays); these two lanes
  price the defaults.
- ``flwr-sim``: Flower's simulation engine (``flwr.simulation.run_simulation``, Ray), one CPU per
  ClientApp (``bench/flwr_app.py simulate``).
- ``flwr-deploy``: Flower's deployment mode: ``flower-superlink --insecure`` and one
  ``flower-supernode --insecure`` process per device, the app submitted with ``flwr run``
  (``bench/flwr_app.py deploy``).

Workload (the issue's): ``mnist_cnn`` (conv 1->16 3x3, conv 16->32 3x3, dense 1568->256, dense
256->10, max-pool after each conv; 409,034 parameters), 20 devices with IID shards of MNIST's training
split (3,000 images each, cut by the devices' own partition code), 10 sampled per round, 5 local
batches of 32, SGD with momentum 0.9 and no weight decay, lr 0.1, 5 rounds, the same initial weights
everywhere (zoo seed), the orchestrator's device sample per round in ``plain`` and ``ours`` (Flower
samples with its own ``random.sample``, seeded).

Per lane: the wall time of every round (round 1 from sending to aggregation, round r > 1 from the
end of round r-1 to the end of round r, so whatever a framework does between rounds counts; the
final test evaluation is left out), the mean over the warm rounds 2..R, the lane's total wall time
(process start to exit: imports, start-up, connections, the rounds, the evaluation, shutdown), the
overhead ratio warm round / plain loop's warm round, peak memory (psutil samples of the lane's
process tree: the server's RSS and the sum over all processes of RSS and of PSS, which counts shared
pages once), loopback bytes per round and the final test accuracy.

Bytes: each lane runs in its own network namespace (``unshare --net``, root only; else the host's
loopback, which other programs share: the JSON says which), so the loopback counters of that
namespace (``/proc/self/net/dev``, read by the lane's server at every round's start and end) count
only the lane's traffic, headers included. The orchestrator's own payload counts (model out,
updates in) are reported beside them. Flower's simulation moves arrays through Ray's shared-memory
object store, which no counter of bytes on a wire sees.

Flower runs in its own virtual environment, ``bench/.venv-flwr`` (``--flwr-venv``), created on first
use with ``flwr[simulation]`` installed under this project's ``constraints.txt`` (torch stays the
2.13.0 CPU build) combined with ``bench/flwr-constraints.txt`` (which replaces the project's typer and
rich pins there: see that file); ``FLWR_TELEMETRY_ENABLED=0``. Where it cannot be made, the Flower
lanes are skipped with the reason.

The plain lane also reruns its rounds with four other local batch draws (untimed) and reports their
accuracies: the spread that chance alone gives, against which the lanes' accuracies are compared.

Usage: ``.venv/bin/python bench/vs_flower.py [--lanes plain,ours-light,ours-light-defaults,ours,ours-defaults,ours-lean,ours-lean-warm,flwr-sim,flwr-deploy]
[--rounds 5] [--clients 20] [--per-round 10] [--workers 2] [--threads 2] [--steps 5] [--batch 32] [--lr 0.1] [--seed 0] [--data-root DIR]
[--flwr-venv bench/.venv-flwr] [--no-netns] [--keep-logs DIR] [--repeats 1] [--out bench/results/vs_flower.json]``.

``--repeats N`` runs the lanes N times, interleaved (every lane once a repeat, the first one rotating), and reports each
figure's median; a lane's ratio to the plain loop is the median of the ratios each repeat measured
against its own plain run, minutes apart on the same machine. On a shared machine one run of a lane
can take a quarter more CPU than the next: one repeat's ratios are a sample, not a result.
Needs MNIST under ``$EDGETRAIN_DATA`` (or ``--data-root``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
for _p in (ROOT, BENCH):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from bench.harness import Case, Context, interleave, parse_list, ratio_summary  # noqa: E402
from bench.harness.fleets import build_fleet, group  # noqa: E402

LANES = ("plain", "ours-light", "ours-light-defaults", "ours", "ours-defaults", "ours-lean", "ours-lean-warm",
         "flwr-sim", "flwr-deploy")
#: Lanes whose orchestrator keeps the server's default checks (a reference update per round for the norm
#: bound, validation before commit); every other edgetrain lane runs with both off, as Flower and the plain
#: loop do neither.
DEFAULTS_LANES = ("ours-light-defaults", "ours-defaults")
LABELS = {"plain": "plain loop (no framework)", "ours-light": "edgetrain lightweight emulation (devices as tasks)",
          "ours-light-defaults": "edgetrain lightweight, server's default checks on",
          "ours": "edgetrain orchestrator + device processes",
          "ours-defaults": "edgetrain device processes, server's default checks on",
          "ours-lean": "edgetrain, loss reported on one batch",
          "ours-lean-warm": "edgetrain, one-batch loss, devices warmed up",
          "flwr-sim": "Flower simulation (Ray)", "flwr-deploy": "Flower deployment (SuperLink + SuperNodes)"}
FLWR_REQUIREMENTS = ["flwr[simulation]", "torch", "numpy", "psutil"]


# -- lanes that run in this project's environment ----------------------------------------------------
def lane_plain(s: dict) -> dict:
    import fl_common as fc

    shards = [fc.load_shard(s["shard_dir"], c) for c in range(s["clients"])]
    res = plain_fedavg(s, shards, s["seed"])
    # The same rounds with other local batch draws (untimed): how far accuracy moves by chance alone.
    res["accuracy_other_batch_draws"] = [plain_fedavg(s, shards, s["seed"] + 1000 * k)["accuracy"]
                                         for k in range(1, s.get("noise_runs", 4) + 1)]
    return res


def plain_fedavg(s: dict, shards: list, batch_seed: int) -> dict:
    import torch

    import fl_common as fc

    torch.set_num_threads(1)
    model = fc.build(s["seed"])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rounds = []
    for r in range(1, s["rounds"] + 1):
        row = {"round": r, "t_start": time.time(), "lo_start": fc.lo_bytes()}
        picked = fc.sample_round(s["clients"], s["per_round"], r, s["seed"])
        total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in state.items()}
        weight = 0
        for c in picked:
            x, y = shards[c]
            model.load_state_dict(state)
            fc.train_local(model, x, y, steps=s["steps"], batch=s["batch"], lr=s["lr"], momentum=s["momentum"],
                           seed=fc.local_seed(batch_seed, r, c))
            for k, v in model.state_dict().items():
                total[k] += v.double() * len(x)
            weight += len(x)
        state = {k: (v / weight).float() for k, v in total.items()}
        row.update({"t_end": time.time(), "lo_end": fc.lo_bytes(), "selected": len(picked), "reported": len(picked),
                    "devices": picked})
        rounds.append(row)
    t = time.time()
    model.load_state_dict(state)
    scores = fc.evaluate(model, *fc.load_test(s["shard_dir"]))
    return {"rounds": rounds, **scores, "eval_s": time.time() - t}


def lean_fedavg():
    """FedAvg whose devices report their loss before and after training on ``eval_samples`` samples
    (one batch) instead of the SDK's default 512 (two extra forward passes over 512 samples a round)."""
    import dataclasses

    from orchestrator.strategies.fedavg import FedAvg

    class LeanFedAvg(FedAvg):
        name = "fedavg"

        def __init__(self, eval_samples: int = 32, **options) -> None:
            super().__init__(**options)
            self.eval_samples = int(eval_samples)

        def configure(self, ctx):
            return [dataclasses.replace(i, config={**dict(i.config), "eval_samples": self.eval_samples})
                    for i in super().configure(ctx)]

    return LeanFedAvg


def __getattr__(name: str):  # ``vs_flower:LeanFedAvg`` for the orchestrator's strategy loader
    if name == "LeanFedAvg":
        return lean_fedavg()
    raise AttributeError(name)


_WARM_SITECUSTOMIZE = """# Written by bench/vs_flower.py: every Python process started with this folder on PYTHONPATH (the
# lane's device processes) loads torch and takes one training step before it connects, as a device
# that has been running for a while has; the orchestrator's devices otherwise do it in the first
# round they are sampled for.
import os, sys
if os.environ.get("VS_FLOWER_WARM_DEVICES") == "1":
    sys.path.insert(0, os.environ["VS_FLOWER_REPO"])
    from edge_sdk.trainer import warm_up
    warm_up()
"""


def _round_recorder(rounds: dict[int, dict], marks: dict[str, float] | None = None):
    """An orchestrator event callback that fills ``rounds`` with each round's times, bytes and metrics,
    and ``marks`` with when the server listened, the first and the last device registered."""
    import fl_common as fc

    def on_event(kind: str, data: dict) -> None:
        if marks is not None and kind in ("listening", "registered"):
            marks.setdefault(f"t_first_{kind}", time.time())
            marks[f"t_last_{kind}"] = time.time()
        if kind == "round_start":
            rounds[data["round"]] = {"round": data["round"], "t_start": time.time(), "lo_start": fc.lo_bytes(),
                                     "selected": data.get("selected")}
        elif kind == "round_end":
            row = rounds[data["round"]]
            row.update({"t_end": time.time() - float(data.get("eval_s", 0.0)), "lo_end": fc.lo_bytes(),
                        "reported": data.get("reported"), "bytes_sent": data.get("bytes_sent"),
                        "bytes_received": data.get("bytes_received"), "server_cpu_s": data.get("server_cpu_s"),
                        "round_wall_s": data.get("round_wall_s"), "eval_s": data.get("eval_s", 0.0),
                        "roles": data.get("roles"), "workers_cpu_s": data.get("workers_cpu_s")})
            if "accuracy" in data:
                row.update({"accuracy": data["accuracy"], "test_loss": data.get("test_loss")})

    return on_event


def _server_config(s: dict, store: Path, lean: bool = False):
    """The orchestrator's settings for the workload (FedAvg, every device waited for).

    Like Flower and the plain loop, the server neither trains a reference update per round (the norm
    bound and direction trust, which both read it) nor validates a round before committing it, and its devices do not score their loss after
    training (they report the loss before it and the mean of their steps' losses; Flower's client
    reports the latter), unless ``s["server_defaults"]`` (the ``*-defaults`` lanes, which price those)."""
    import fl_common as fc
    from orchestrator.config import EXACT_TRANSFERS, ServerConfig

    # Transfers as Flower and the plain loop make them, float32 and whole (on loopback compression is
    # only CPU; the ``*-defaults`` lanes price the server's lossy transfer defaults with the rest).
    checks = {} if s.get("server_defaults") else {"norm_bound": 0.0, "direction_trust": False, "max_loss_rise": 0.0,
                                                  "loss_after": False, **EXACT_TRANSFERS}
    return ServerConfig(**checks,
        model=fc.MODEL, strategy="vs_flower:LeanFedAvg" if lean else "fedavg",
        strategy_options={"eval_samples": s["batch"]} if lean else {}, rounds=s["rounds"],
        fraction=s["per_round"] / s["clients"], min_devices=s["clients"], local_steps=s["steps"],
        batch_size=s["batch"], lr=s["lr"], momentum=s["momentum"], weight_decay=0.0, seed=s["seed"],
        eval_every=s["rounds"], eval_data="mnist", data_root=s.get("data_root"), store_dir=store, deadline_s=600,
        wait_devices_s=600)


def _rows(s: dict, rounds: dict[int, dict], compute: dict[int, float]) -> list[dict]:
    import fl_common as fc

    rows = [rounds[r] for r in sorted(rounds)]
    seen: set[int] = set()
    for row in rows:
        row["device_compute_s"] = compute.get(row["round"])
        picked = fc.sample_round(s["clients"], s["per_round"], row["round"], s["seed"])  # the server's sample
        row["devices"], row["first_training_in_process"] = picked, len(set(picked) - seen)
        seen |= set(picked)
    return rows


def _compute(events: list[dict], compute: dict[int, float]) -> None:
    for e in events:
        if e.get("event") == "round_done" and e.get("phase") == "train":
            r = int(e["round"])
            compute[r] = compute.get(r, 0.0) + float(e.get("forward_s", 0)) + float(e.get("train_s", 0))


def lane_ours(s: dict, lean: bool = False, warm: bool = False) -> dict:
    import asyncio

    from emulator.localfleet import DeviceLaunch, run_local_fleet

    # Named as the lightweight lane's fleet names them (the device id seeds its batches): the same draws.
    launches = [DeviceLaunch(f"dev-{i:03d}", budget_bytes=4 << 30, client=i, num_clients=s["clients"], data="mnist",
                             partition="iid", seed=s["seed"], threads=1) for i in range(s["clients"])]
    rounds: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="vs-flower-ours-") as tmp:
        if warm:  # device processes inherit this environment (emulator.localfleet.device_env)
            site = Path(tmp) / "warm"
            site.mkdir()
            (site / "sitecustomize.py").write_text(_WARM_SITECUSTOMIZE)
            os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (str(site), os.environ.get("PYTHONPATH")) if x)
            os.environ["VS_FLOWER_WARM_DEVICES"] = "1"
        config = _server_config(s, Path(tmp) / "store", lean)
        run = asyncio.run(run_local_fleet(config, launches, on_event=_round_recorder(rounds),
                                          data_root=s.get("data_root"),
                                          stderr_dir=Path(s["log_dir"]) / "devices" if s.get("log_dir") else None))
    compute: dict[int, float] = {}
    for events in run.device_events.values():
        _compute(events, compute)
    rows = _rows(s, rounds, compute)
    last = rows[-1] if rows else {}
    return {"rounds": rows, "accuracy": last.get("accuracy"), "test_loss": last.get("test_loss"),
            "eval_s": last.get("eval_s"), "returncodes": run.returncodes}


def light_fleet(s: dict):
    """The workload's devices in the lightweight mode (the orchestrator's settings are ``_server_config``'s)."""
    import fl_common as fc

    return build_fleet("vs-flower", model=fc.MODEL, dataset="mnist", seed=s["seed"],
                       description="bench/vs_flower.py: the workload's devices in the lightweight mode",
                       partition={"scheme": "iid", "seed": s["seed"]},
                       emulation={"mode": "lightweight", "memory_cap": "none", "throttle_cpu": False},
                       groups=[group("mid-phone", s["clients"], "dev", budget="4GiB")])


def lane_light(s: dict) -> dict:
    """The emulator's lightweight mode: the devices as asyncio tasks of the real client in
    ``s["workers"]`` worker processes, each over its own websocket to the orchestrator in this process."""
    import asyncio

    from emulator.lightweight import run_lightweight

    rounds: dict[int, dict] = {}
    marks = {"t_lane_start": time.time()}
    with tempfile.TemporaryDirectory(prefix="vs-flower-light-") as tmp:
        fleet = light_fleet(s)
        config = _server_config(s, Path(tmp) / "store")
        run = asyncio.run(run_lightweight(fleet, config, on_event=_round_recorder(rounds, marks), data_root=s.get("data_root"),
                                          workers=s.get("workers"), threads=s.get("threads") or 2,
                                          stderr_dir=Path(s["log_dir"]) / "workers" if s.get("log_dir") else None))
    compute: dict[int, float] = {}
    for d in run.devices:
        _compute(d.events, compute)
    rows = _rows(s, rounds, compute)
    for row, metrics in zip(rows, run.history):  # the workers' CPU per round, measured by the emulator
        row["workers_cpu_s"] = metrics.get("workers_cpu_s")
    last = rows[-1] if rows else {}
    return {"rounds": rows, "accuracy": last.get("accuracy"), "test_loss": last.get("test_loss"),
            "eval_s": last.get("eval_s"), "workers": run.workers, "marks": {**marks, "t_lane_end": time.time()},
            "device_memory": device_memory(run.workers, s.get("threads") or 2),
            "device_status": {d.device: d.status for d in run.devices}}


def device_memory(workers: list[dict], threads: int) -> dict:
    """Bytes per emulated device, from the workers' resident sets: idle = (RSS once every device
    holds its connection, plan, shard and state - RSS with the runtimes loaded, before any device
    connected) / devices; training = (peak RSS - that connected RSS) / the tails a worker trains at
    once (its threads): what a device adds while it trains."""
    idle, training = [], []
    for w in workers:
        ready, connected, peak = w.get("rss_ready_bytes"), w.get("rss_after_connect_bytes"), w.get("peak_rss_bytes")
        if ready and connected and w.get("devices"):
            idle.append((connected - ready) / w["devices"])
        if connected and peak:
            training.append(max(0, peak - connected) / min(threads, w.get("devices") or 1))
    return {"bytes_per_idle_device": statistics.mean(idle) if idle else None,
            "bytes_per_training_device": statistics.mean(training) if training else None,
            "workers": [{k: w.get(k) for k in ("devices", "rss_ready_bytes", "rss_after_connect_bytes",
                                               "peak_rss_bytes")} for w in workers]}


# -- running a lane as a process tree and watching it ------------------------------------------------
class TreeWatch(threading.Thread):
    """Samples a process tree's memory every ``interval`` s: peaks of the server's RSS and of the
    sums of RSS and PSS over all its processes."""

    def __init__(self, pid: int, server_match: str | None, cgroup: Path | None = None, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.server_match, self.cgroup, self.interval = pid, server_match, cgroup, interval
        self.stop = threading.Event()
        self.peak = {"server_rss": 0, "all_rss": 0, "all_pss": 0, "processes": 0}
        self.samples = 0
        self.cpu: list[tuple[float, float]] = []  # (time, CPU seconds of the lane's cgroup)

    def sample_cpu(self) -> None:
        if self.cgroup is not None:
            try:
                self.cpu.append((time.time(), int((self.cgroup / "cpuacct.usage").read_text()) / 1e9))
            except (OSError, ValueError):
                pass

    def _server(self, root, procs):
        import psutil

        if self.server_match is None:
            return [root]
        for p in procs:
            try:
                if any(self.server_match in part for part in p.cmdline()):
                    return [p, *p.children(recursive=True)]
            except psutil.Error:
                continue
        return []

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self.stop.is_set():
            self.sample_cpu()
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            rss = pss = 0
            mem = {}
            for p in procs:
                try:
                    info = p.memory_full_info()
                    mem[p.pid] = info.rss
                    rss += info.rss
                    pss += getattr(info, "pss", info.rss)
                except psutil.Error:
                    continue
            server = sum(mem.get(p.pid, 0) for p in self._server(root, procs))
            self.peak["server_rss"] = max(self.peak["server_rss"], server)
            self.peak["all_rss"] = max(self.peak["all_rss"], rss)
            self.peak["all_pss"] = max(self.peak["all_pss"], pss)
            self.peak["processes"] = max(self.peak["processes"], len(mem))
            self.samples += 1
            self.stop.wait(self.interval)
        self.sample_cpu()


def cpu_cgroup(name: str) -> Path | None:
    """A cgroup v1 cpuacct group of its own for a lane (root only): its ``cpuacct.usage`` counts the CPU
    time of every process of the lane, those that exited included. None where it cannot be made."""
    base = Path("/sys/fs/cgroup/cpuacct")
    if not (base / "cpuacct.usage").exists():
        return None
    group = base / f"edgetrain-vs-flower-{os.getpid()}-{name}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").read_text()
        return group
    except OSError:
        return None


def cpu_at(series: list[tuple[float, float]], t: float) -> float | None:
    """The CPU seconds of a sampled series at time ``t``, interpolated."""
    if not series or t < series[0][0] or t > series[-1][0]:
        return None
    for (t0, c0), (t1, c1) in zip(series, series[1:]):
        if t0 <= t <= t1:
            return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)
    return series[-1][1]


def netns_works() -> bool:
    if not shutil.which("unshare") or not shutil.which("ip"):
        return False
    probe = subprocess.run(["unshare", "--net", "sh", "-c", "ip link set lo up && cat /proc/net/dev"],
                           capture_output=True, text=True)
    return probe.returncode == 0 and "lo:" in probe.stdout


def load_avg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def run_lane(lane: str, s: dict, argv: list[str], env: dict, log_path: Path, server_match: str | None,
             netns: bool, timeout: float) -> dict:
    if netns:
        argv = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]
    out = Path(s["out"])
    out.unlink(missing_ok=True)
    load_before = load_avg()
    group = cpu_cgroup(lane)

    def enter_group() -> None:
        if group is not None:
            with open(group / "cgroup.procs", "w") as f:
                f.write("0")

    t0 = time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, preexec_fn=enter_group)
        watch = TreeWatch(proc.pid, server_match, group)
        watch.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            rc = None
        watch.stop.set()
        watch.join(timeout=5)
    wall = time.time() - t0
    if group is not None:
        try:
            group.rmdir()
        except OSError:
            pass
    result = {"lane": lane, "label": LABELS[lane], "returncode": rc, "total_wall_s": wall, "t_launch": t0,
              "load_avg_before": load_before, "load_avg_after": load_avg(), "memory_peak_bytes": watch.peak,
              "memory_samples": watch.samples, "log": str(log_path), "cpu_series": watch.cpu,
              "total_cpu_s": watch.cpu[-1][1] if watch.cpu else None}
    if rc != 0 or not out.exists():
        tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
        result["error"] = f"lane exited with {rc}" + ("" if out.exists() else ", no results") + f"; log tail:\n{tail}"
        return result
    result.update(json.loads(out.read_text()))
    return result


def _kill_tree(pid: int) -> None:
    import psutil

    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for p in family:
        try:
            p.kill()
        except psutil.Error:
            pass


# -- Flower's environment ----------------------------------------------------------------------------
def flwr_constraints(venv: Path) -> Path:
    """The project's constraints, less the packages bench/flwr-constraints.txt pins, plus that file."""
    ours = (BENCH / "flwr-constraints.txt").read_text().splitlines()

    def name(line: str) -> str | None:
        line = line.split("#", 1)[0].strip()
        if not line:
            return None
        for sep in ("==", ">=", "<=", "~=", "!=", "<", ">", "["):
            line = line.split(sep, 1)[0]
        return line.strip().lower().replace("_", "-")

    override = {n for n in map(name, ours) if n}
    kept = [ln for ln in (ROOT / "constraints.txt").read_text().splitlines() if name(ln) not in override]
    path = venv / "edgetrain-constraints.txt"
    path.write_text("# made by bench/vs_flower.py: constraints.txt with bench/flwr-constraints.txt's pins\n"
                    + "\n".join(kept + [ln for ln in ours if name(ln)]) + "\n")
    return path


def ensure_flwr_venv(venv: Path, log: Path) -> tuple[Path | None, str]:
    """Flower's virtual environment (made once); its python, or None and why not."""
    py = venv / "bin" / "python"
    want = hashlib.sha256(((ROOT / "constraints.txt").read_text() + (BENCH / "flwr-constraints.txt").read_text()
                           + " ".join(FLWR_REQUIREMENTS)).encode()).hexdigest()
    stamp = venv / ".edgetrain-stamp"
    if py.exists() and stamp.exists() and stamp.read_text().strip() == want:
        return py, "existing"
    print(f"making Flower's environment in {venv} (once; pip log: {log}) ...", flush=True)
    with open(log, "w") as f:
        if not py.exists():
            made = subprocess.run([sys.executable, "-m", "venv", str(venv)], stdout=f, stderr=subprocess.STDOUT)
            if made.returncode != 0:
                return None, f"python -m venv failed ({made.returncode}); see {log}"
        cons = flwr_constraints(venv)
        env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
        try:
            pip = subprocess.run([str(py), "-m", "pip", "install", "-c", str(cons), *FLWR_REQUIREMENTS],
                                 stdout=f, stderr=subprocess.STDOUT, env=env, timeout=1800)
        except subprocess.TimeoutExpired:
            return None, f"pip install of flwr timed out; see {log}"
    if pip.returncode != 0:
        return None, f"pip install of {' '.join(FLWR_REQUIREMENTS)} failed ({pip.returncode}); see {log}"
    check = subprocess.run([str(py), "-c", "import flwr, torch; print(flwr.__version__, torch.__version__)"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        return None, f"flwr does not import in {venv}: {check.stderr[-500:]}"
    stamp.write_text(want + "\n")
    return py, "made: flwr " + check.stdout.strip()


# -- the data, written once for every lane -----------------------------------------------------------
def write_shards(s: dict, shard_dir: Path) -> None:
    """Every device's IID shard and the test split as .npy files, cut by the devices' own code."""
    import numpy as np

    from edge_sdk.cli import partition_indices
    from edge_sdk.data import load_dataset

    root = s.get("data_root")
    train = load_dataset("mnist", root=root, split="train", mmap=True)
    parts = partition_indices(train, "iid", s["clients"], s["seed"])
    for i, idx in enumerate(parts):
        np.save(shard_dir / f"x{i:02d}.npy", np.asarray(train.x[idx]))
        np.save(shard_dir / f"y{i:02d}.npy", np.asarray(train.y[idx]))
    test = load_dataset("mnist", root=root, split="test")
    np.save(shard_dir / "x_test.npy", test.x)
    np.save(shard_dir / "y_test.npy", test.y)


# -- summary -----------------------------------------------------------------------------------------
def summarise(res: dict, device_steps: int | None = None) -> dict:
    """A lane's rounds: wall and CPU (all its processes) per round and over the warm rounds; with
    ``device_steps`` (devices a round x local steps), the CPU per device-step of each warm round."""
    rows = res.get("rounds") or []
    if not rows or any("t_end" not in r for r in rows):
        return {}
    times, lo = [], []
    for i, r in enumerate(rows):
        prev_t = r["t_start"] if i == 0 else rows[i - 1]["t_end"]
        prev_lo = r.get("lo_start") if i == 0 else rows[i - 1].get("lo_end")
        times.append(r["t_end"] - prev_t)
        lo.append(None if r.get("lo_end") is None or prev_lo is None else r["lo_end"] - prev_lo)
    series = [tuple(x) for x in res.get("cpu_series") or []]
    cpu = []
    for i, r in enumerate(rows):
        a = cpu_at(series, r["t_start"] if i == 0 else rows[i - 1]["t_end"])
        b = cpu_at(series, r["t_end"])
        cpu.append(None if a is None or b is None else b - a)
    warm_cpu = [c for c in cpu[1:] if c is not None]
    warm = times[1:] or times
    warm_lo = [b for b in lo[1:] if b is not None]
    out = {"round_s": times, "warm_round_s": statistics.mean(warm), "warm_round_median_s": statistics.median(warm),
           "rounds_total_s": rows[-1]["t_end"] - rows[0]["t_start"], "lo_bytes_per_round": lo,
           "warm_lo_bytes_per_round": statistics.mean(warm_lo) if warm_lo else None,
           "round_cpu_s": cpu, "warm_round_cpu_s": statistics.mean(warm_cpu) if warm_cpu else None}
    if device_steps and warm_cpu:
        out["step_cpu_ms"] = [1000 * c / device_steps for c in warm_cpu]
        out["warm_step_cpu_ms"] = statistics.median(out["step_cpu_ms"])
    if rows[0].get("bytes_sent") is not None:
        payload = [(r.get("bytes_sent") or 0) + (r.get("bytes_received") or 0) for r in rows]
        out["payload_bytes_per_round"] = payload
        out["warm_payload_bytes_per_round"] = statistics.mean(payload[1:] or payload)
    return out


def run_one_lane(lane: str, settings: dict, work: Path, logs: Path, base_env: dict, flwr_py: Path | None,
                 flwr_note: str, netns: bool, timeout: float) -> dict:
    """One run of ``lane``: its result, with the summary of its rounds."""
    s = dict(settings, out=str(work / f"{lane}.json"), log_dir=str(logs / lane))
    Path(s["log_dir"]).mkdir(parents=True, exist_ok=True)
    env = dict(base_env, VS_FLOWER_SETTINGS=json.dumps(s))
    if lane.startswith("flwr"):
        if flwr_py is None:
            return {"lane": lane, "skipped": f"Flower's environment could not be made: {flwr_note}"}
        argv = [str(flwr_py), str(BENCH / "flwr_app.py"), "simulate" if lane == "flwr-sim" else "deploy"]
        env["PATH"] = f"{Path(flwr_py).parent}{os.pathsep}{env.get('PATH', '')}"
    else:
        argv = [sys.executable, str(Path(__file__).resolve()), "--lane", lane]
    server_match = "flower-superlink" if lane == "flwr-deploy" else None
    print(f"lane {lane}: {LABELS[lane]} ...", flush=True)
    res = run_lane(lane, s, argv, env, logs / f"{lane}.log", server_match, netns, timeout)
    res["summary"] = summarise(res, settings["per_round"] * settings["steps"]) if "error" not in res else {}
    res.pop("cpu_series", None)
    if "error" in res:
        print(f"lane {lane} failed: {res['error'][:2000]}", flush=True)
    else:
        sm = res["summary"]
        print(f"  warm round {sm['warm_round_s']:.2f} s, rounds {[round(t, 2) for t in sm['round_s']]}, "
              f"total {res['total_wall_s']:.1f} s, accuracy {res.get('accuracy')}", flush=True)
    return res


#: Summary fields that several runs of a lane give as their median.
_MEDIAN_FIELDS = ("warm_round_s", "warm_round_median_s", "warm_round_cpu_s", "warm_step_cpu_ms", "rounds_total_s",
                  "warm_lo_bytes_per_round", "warm_payload_bytes_per_round")


def combine_runs(lane_runs: list[dict]) -> dict:
    """One lane's result over its runs: the last complete run, with the median of each summary
    figure, of the lane's total time and of each memory peak (``runs`` keeps every run's summary)."""
    done = [r for r in lane_runs if r.get("summary")]
    if not done:
        return lane_runs[-1]
    out = dict(done[-1])
    if len(lane_runs) == 1:
        return out
    summary = dict(out["summary"])
    for key in _MEDIAN_FIELDS:
        values = [r["summary"][key] for r in done if r["summary"].get(key) is not None]
        if values:
            summary[key] = statistics.median(values)
    out["summary"] = summary
    out["total_wall_s"] = statistics.median(r["total_wall_s"] for r in done)
    out["memory_peak_bytes"] = {k: statistics.median(r["memory_peak_bytes"][k] for r in done)
                                for k in out["memory_peak_bytes"]}
    out["runs"] = [{"summary": {k: r["summary"].get(k) for k in ("warm_round_s", "warm_round_cpu_s", "round_s",
                                                                  "round_cpu_s", "step_cpu_ms")},
                    "total_wall_s": r.get("total_wall_s"), "memory_peak_bytes": r.get("memory_peak_bytes"),
                    "load_avg_before": r.get("load_avg_before"), "accuracy": r.get("accuracy")}
                   if r.get("summary") else {"error": r.get("error") or r.get("skipped")} for r in lane_runs]
    return out


def paired_ratios(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Each lane's warm round over the plain loop's of the same repeat (wall and CPU): the lanes of
    one repeat ran minutes apart, so these ratios see the same machine; the median over repeats."""
    plain = runs.get("plain") or []
    out: dict[str, dict] = {}
    for lane, lane_runs in runs.items():
        ratios: dict[str, list[float]] = {"wall": [], "cpu": []}
        for base, run in zip(plain, lane_runs):
            a, b = base.get("summary") or {}, run.get("summary") or {}
            for kind, key in (("wall", "warm_round_s"), ("cpu", "warm_round_cpu_s")):
                if a.get(key) and b.get(key) is not None:
                    ratios[kind].append(b[key] / a[key])
        out[lane] = {f"{kind}_over_plain": statistics.median(v) for kind, v in ratios.items() if v}
        out[lane].update({f"{kind}_over_plain_each": v for kind, v in ratios.items() if v})
    return out


def fmt_mib(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**20:.1f}"


def print_table(results: dict[str, dict], paired: dict[str, dict]) -> str:
    """The lanes' table; the ratios to the plain loop are the medians of each repeat's own ratios
    (:func:`paired_ratios`; with one repeat, that repeat's)."""
    head = ("| lane | warm round s | / plain | CPU s per warm round (all processes) | / plain | round 1 s "
            "| rounds total s | lane total s | server peak RSS MiB | all processes peak RSS / PSS MiB "
            "| loopback MiB per warm round | test accuracy |")
    lines = [head, "|" + "---|" * 12]

    def ratio(lane: str, kind: str) -> str:
        value = paired.get(lane, {}).get(f"{kind}_over_plain")
        return "-" if value is None else f"{value:.2f}"

    for lane, res in results.items():
        sm = res.get("summary", {})
        if not sm:
            why = (res.get("skipped") or res.get("error") or "").strip().splitlines() or [""]
            lines.append(f"| {LABELS[lane]} | {'skipped' if res.get('skipped') else 'failed'}: {why[0][:120]} "
                         + "| " * 11)
            continue
        mem = res["memory_peak_bytes"]
        bytes_col = fmt_mib(sm.get("warm_lo_bytes_per_round"))
        if sm.get("warm_payload_bytes_per_round") is not None:
            bytes_col += f" (payloads {fmt_mib(sm['warm_payload_bytes_per_round'])})"
        acc = "-" if res.get("accuracy") is None else f"{res['accuracy']:.4f}"
        cpu = sm.get("warm_round_cpu_s")
        lines.append(
            f"| {LABELS[lane]} | {sm['warm_round_s']:.2f} | {ratio(lane, 'wall')} "
            f"| {'-' if cpu is None else f'{cpu:.2f}'} | {ratio(lane, 'cpu')} "
            f"| {sm['round_s'][0]:.2f} | {sm['rounds_total_s']:.1f} | {res['total_wall_s']:.1f} "
            f"| {fmt_mib(mem['server_rss'])} | {fmt_mib(mem['all_rss'])} / {fmt_mib(mem['all_pss'])} "
            f"| {bytes_col} | {acc} |")
    table = "\n".join(lines)
    print(table)
    return table


def step_cpu(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """CPU per device-step of each lane (all its processes' CPU in a warm round over the round's
    devices x local steps): the statistics of every warm round of every repeat (a round is a sample:
    R - 1 of them per repeat), and against the plain loop of the same repeat the ratio and the
    difference (the framework's own CPU per device-step), with their spread over the repeats. The
    plain loop's own rounds move by a quarter from one repeat to the next on a shared machine: the
    difference and the per-round spread show a regression a lone ratio hides."""
    from bench.harness.results import stats

    plain = [(r.get("summary") or {}).get("warm_step_cpu_ms") for r in runs.get("plain") or []]
    out: dict[str, dict] = {}
    for lane, lane_runs in runs.items():
        rounds = [c for r in lane_runs for c in (r.get("summary") or {}).get("step_cpu_ms") or []]
        if not rounds:
            continue
        mine = [(r.get("summary") or {}).get("warm_step_cpu_ms") for r in lane_runs]
        pairs = [(a, b) for a, b in zip(mine, plain) if a is not None and b]
        out[lane] = {"rounds_ms": stats(rounds), "repeats_ms": [m for m in mine if m is not None]}
        if lane != "plain" and pairs:
            out[lane]["over_plain"] = stats(a / b for a, b in pairs)
            out[lane]["minus_plain_ms"] = stats(a - b for a, b in pairs)
    return out


def print_step_cpu(table: dict[str, dict]) -> str:
    """The per-device-step table: median [quartiles] over warm rounds, per-repeat medians, and the
    paired ratio and difference to the plain loop (median, min-max over repeats)."""
    lines = ["| lane | CPU ms per device-step: median [q1, q3] of n warm rounds | per repeat | / plain (min-max) "
             "| - plain ms (min-max) |", "|---|---|---|---|---|"]
    def spread(st: dict | None) -> str:
        return "-" if not st or not st.get("n") else f"{st['median']:.2f} ({st['min']:.2f}-{st['max']:.2f})"

    for lane, t in table.items():
        r = t["rounds_ms"]
        lines.append(f"| {LABELS[lane]} | {r['median']:.2f} [{r['q1']:.2f}, {r['q3']:.2f}] of {r['n']} "
                     f"| {', '.join(f'{m:.2f}' for m in t['repeats_ms'])} | {spread(t.get('over_plain'))} "
                     f"| {spread(t.get('minus_plain_ms'))} |")
    text = "\n".join(lines)
    print(text)
    return text


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lanes", default=",".join(LANES), help="comma-separated, from " + ", ".join(LANES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--steps", type=int, default=5, help="local batches per round")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--flwr-venv", type=Path, default=BENCH / ".venv-flwr")
    ap.add_argument("--flwr-port", type=int, default=19100, help="SuperLink port (SuperNodes take the next ones)")
    ap.add_argument("--no-netns", action="store_true", help="do not run lanes in their own network namespace")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per lane")
    ap.add_argument("--keep-logs", type=Path, default=None, help="keep every lane's logs in this folder")
    ap.add_argument("--workers", type=int, default=2,
                    help="worker processes of ours-light, and parallel ClientApps of flwr-sim")
    ap.add_argument("--threads", type=int, default=2, help="training threads per ours-light worker")
    ap.add_argument("--noise-runs", type=int, default=4,
                    help="untimed reruns of the plain loop with other batch draws (the chance spread)")
    ap.add_argument("--lane", choices=[x for x in LANES if not x.startswith("flwr")], help=argparse.SUPPRESS)


def one_lane(lane: str) -> None:
    """``--lane``: one lane in this process, its result written where the settings say."""
    s = json.loads(os.environ["VS_FLOWER_SETTINGS"])
    s["server_defaults"] = lane in DEFAULTS_LANES
    if lane == "plain":
        res = lane_plain(s)
    elif lane.startswith("ours-light"):
        res = lane_light(s)
    else:
        res = lane_ours(s, lean=lane.startswith("ours-lean"), warm=lane.endswith("warm"))
    if lane != "plain":
        res["server_checks"] = ("defaults: norm bound 1.0 (a reference update per round), validation before "
                                "commit (max_loss_rise 1.0)") if s["server_defaults"] else \
            "off: norm_bound 0, max_loss_rise 0 (as Flower and the plain loop)"
    Path(s["out"]).write_text(json.dumps(res, indent=1, default=str))


def check_targets(results: dict[str, dict], paired: dict[str, dict]) -> dict[str, dict]:
    """The issue's targets: each edgetrain lane's overhead against Flower's simulation and the plain loop."""
    wall = {lane: results.get(lane, {}).get("summary", {}).get("warm_round_s") for lane in LANES}
    cpu = {lane: results.get(lane, {}).get("summary", {}).get("warm_round_cpu_s") for lane in LANES}
    targets = {}

    def over_plain(lane: str, kind: str) -> float | None:  # the median of each repeat's own ratio
        return paired.get(lane, {}).get(f"{kind}_over_plain")

    for ours in [x for x in LANES if x.startswith("ours")]:
        if wall[ours] and wall["flwr-sim"] and over_plain(ours, "wall") is not None:
            targets[f"{ours}: overhead per warm round below Flower simulation's (wall)"] = {
                "ours_over_plain": over_plain(ours, "wall"), "flwr_sim_over_plain": over_plain("flwr-sim", "wall"),
                "holds": wall[ours] < wall["flwr-sim"]}
        if cpu[ours] and cpu["flwr-sim"] and over_plain(ours, "cpu") is not None:
            targets[f"{ours}: overhead per warm round below Flower simulation's (CPU)"] = {
                "ours_over_plain": over_plain(ours, "cpu"), "flwr_sim_over_plain": over_plain("flwr-sim", "cpu"),
                "holds": cpu[ours] < cpu["flwr-sim"]}
        if over_plain(ours, "wall") is not None:
            targets[f"{ours}: warm round within 1.5x of the plain loop (wall)"] = {
                "ratio": over_plain(ours, "wall"), "holds": over_plain(ours, "wall") <= 1.5}
    # The issue's own targets.
    if over_plain("ours-light", "wall") is not None:
        targets["ours-light: warm round at most 1.05x the plain loop's (wall)"] = {
            "ratio": over_plain("ours-light", "wall"), "holds": over_plain("ours-light", "wall") <= 1.05}
    if cpu["ours-light"] and cpu["flwr-sim"]:
        targets["ours-light: CPU per warm round at most Flower simulation's"] = {
            "ours_light_s": cpu["ours-light"], "flwr_sim_s": cpu["flwr-sim"], "holds": cpu["ours-light"] <= cpu["flwr-sim"]}
    if over_plain("ours-light", "cpu") is not None:
        targets["ours-light: CPU per warm round at most 1.5x the plain loop's"] = {
            "ratio": over_plain("ours-light", "cpu"), "holds": over_plain("ours-light", "cpu") <= 1.5}
    if over_plain("ours", "cpu") is not None:
        targets["ours: CPU per warm round at most 1.5x the plain loop's"] = {
            "ratio": over_plain("ours", "cpu"), "holds": over_plain("ours", "cpu") <= 1.5}
    return targets


def run(ctx: Context) -> dict | None:
    args = ctx.args
    if args.lane:
        one_lane(args.lane)
        return None
    lanes = parse_list(args.lanes)
    unknown = sorted(set(lanes) - set(LANES))
    if unknown:
        raise SystemExit(f"unknown lanes {unknown}; choose from {', '.join(LANES)}")
    work = Path(tempfile.mkdtemp(prefix="vs-flower-"))
    logs = args.keep_logs or work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    shard_dir = work / "shards"
    shard_dir.mkdir()
    settings = {"rounds": args.rounds, "clients": args.clients, "per_round": args.per_round, "steps": args.steps,
                "batch": args.batch, "lr": args.lr, "momentum": args.momentum, "seed": args.seed,
                "data_root": args.data_root, "shard_dir": str(shard_dir), "flwr_port": args.flwr_port,
                "timeout": args.timeout, "workers": args.workers, "threads": args.threads,
                "noise_runs": args.noise_runs}
    try:
        write_shards(settings, shard_dir)
    except Exception as e:  # noqa: BLE001 (DatasetUnavailable and friends)
        raise SystemExit(f"MNIST is needed: {e}") from None
    netns = not args.no_netns and netns_works()
    flwr_py, flwr_note = None, "not needed"
    if any(lane.startswith("flwr") for lane in lanes):
        args.flwr_venv.parent.mkdir(parents=True, exist_ok=True)
        flwr_py, flwr_note = ensure_flwr_venv(args.flwr_venv.resolve(), logs / "pip-flwr.log")
        if flwr_py is None:
            print(f"Flower lanes skipped: {flwr_note}", flush=True)
    # The edgetrain devices keep their payloads under the run's folder (removed at the end), not in the
    # user's cache: each lane's server listens on a new port, so nothing there would be read again.
    base_env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", VS_FLOWER_REPO=str(ROOT), PYTHONUNBUFFERED="1",
                    RAY_DEDUP_LOGS="0", RAY_USAGE_STATS_ENABLED="0", EDGETRAIN_PAYLOAD_CACHE=str(work / "payloads"))
    runs: dict[str, list[dict]] = {lane: [] for lane in lanes}
    for repeat, lane in interleave(lanes, ctx.repeats):  # every lane once a repeat, the first one rotating
        if lane == lanes[0] and ctx.repeats > 1:
            print(f"-- repeat {repeat + 1} of {ctx.repeats}", flush=True)
        runs[lane].append(run_one_lane(lane, settings, work, logs, base_env, flwr_py, flwr_note, netns, args.timeout))
    results = {lane: combine_runs(lane_runs) for lane, lane_runs in runs.items()}
    paired = paired_ratios(runs)
    table = print_table(results, paired)
    steps = step_cpu(runs)
    step_table = print_step_cpu(steps)
    targets = check_targets(results, paired)
    for name, t in targets.items():
        print(f"target {name}: {'holds' if t['holds'] else 'MISSED'} ({json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in t.items()})})")
    records = [{"lane": lane, "repeat": i, **{k: (r.get("summary") or {}).get(k) for k in _MEDIAN_FIELDS},
                "total_wall_s": r.get("total_wall_s"), "accuracy": r.get("accuracy"),
                "load_avg_before": r.get("load_avg_before"), "error": r.get("error") or r.get("skipped")}
               for lane, lane_runs in runs.items() for i, r in enumerate(lane_runs)]
    report = {
        "note": "shared machine: other jobs ran at the same time (see each lane's load averages)",
        "settings": {k: v for k, v in settings.items() if k not in ("shard_dir",)},
        "workload": "mnist_cnn (409,034 parameters), IID MNIST shards, FedAvg, every device trains the whole model",
        "bytes_counted_on": "loopback of each lane's own network namespace" if netns else
                            "the host's loopback (shared with every other program: an upper bound)",
        "flower": {"venv": str(args.flwr_venv), "status": flwr_note},
        "paired_ratios": paired, "lanes": results, "targets": targets, "table": table,
        "step_cpu": steps, "step_table": step_table,
    }
    over = {f"{key}_over_plain": ratio_summary(records, key, "plain")
            for key in ("warm_round_s", "warm_round_cpu_s", "warm_step_cpu_ms")}
    doc = ctx.write(records, report, over)
    shutil.rmtree(work, ignore_errors=True)
    return doc


CASE = Case("vs_flower", __doc__, run, arguments=arguments, repeats=1, data_root=True,
            quick={"lanes": "plain,ours-light", "rounds": 2, "clients": 4, "per_round": 2, "steps": 1,
                   "noise_runs": 0, "workers": 1, "threads": 1},
            metrics=("warm_round_s", "warm_round_cpu_s", "warm_step_cpu_ms", "total_wall_s"), group_by=("lane",))


def main(argv: list[str] | None = None) -> dict | None:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
