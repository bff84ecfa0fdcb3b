"""EmbracingFL against width reduction on real non-IID data: the paper's client-mix cases, side by side.

Reproduces the shape of EmbracingFL (Lee et al.) Tables 3/4 and 6 (accuracy per client mix, both
methods on the same devices, data and budgets, mean and std over seeds, the paper's figure beside
ours) and Table 7 (rounds to a target accuracy), at a scale one shared machine can run:

- ``--dataset femnist``: FEMNIST writers (``femnist_leaf_flic``: 110 writers, natural split, every
  device whole writers), the LEAF CNN; strong devices train the whole model, moderate ones blocks
  [2, 4) (the two convolutions frozen, Table 1: capacity 0.99), weak ones the last dense layer
  (split 3, capacity 0.02). Paper: 128 clients, 25% per round, 200 rounds, lr 0.04.
- ``--dataset cifar10``: CIFAR-10 (``cifar10_jpg``), Dirichlet(0.1) label skew, ResNet20, 8 devices
  of at most 1,000 images, every one in every round (the paper's Table 6 runs, appendix 6.4); the
  planner gives weak devices split 7 from their budget, moderate ones have split 4 forced (Table 1:
  capacities 0.16 and 0.42); 280 rounds at lr 0.01, tenfold less after rounds 240 and 260. Paper:
  128 clients, 1,000 rounds, lr 0.4, tenfold less after rounds 800 and 900 (appendix 6.2).

Methods (one fleet, two strategies): ``embracingfl`` (partial training: frozen input-side layers
streamed, the output-side layers trained) and ``width`` (static HeteroFL / FjORD ordered dropout:
moderate devices keep 45% and weak ones 20% of every layer's channels, appendix 6.4). The all-strong
case is the same FedAvg run under both, so it runs once. A device's role comes from its budget (and
the fleet's forced splits), so both methods give every device the same role.

Every run goes through the real orchestrator (``orchestrator.server.Orchestrator``) and real device
clients (``edge_sdk.client.DeviceClient``) over websockets on 127.0.0.1, in the emulator's lightweight
mode (``emulator.lightweight``: devices as asyncio tasks in a few worker processes, no
memory caps; budgets steer the planner only). It is the run ``edgetrain emulate --fleet
embracing-<dataset>-<case> [--strategy width] --rounds R`` makes with the shipped fleets
(``--write-fleets`` renders them from the case table below); the bench adds seeds and evaluates the
global model every ``--eval-every`` rounds.

Resumable: each (dataset, case, method, seed) run lives in its own folder under ``--workdir``
(default ``bench/results/embracing-runs/``, not committed): its orchestrator store checkpoints every
completed round, and a finished run leaves ``result.json``. Running the bench again skips finished
runs, resumes an interrupted one from its last completed round, and extends a finished one whose
``--rounds`` grew; a report for fewer rounds than a run went reads that run's first ``--rounds``.
``--lr-decay-at 240,260`` drops the learning rate tenfold after those rounds (appendix 6.2's schedule);
such runs live in their own setting folder (``...-decay240_260``), which a copy of constant-rate runs
stopped at or before the first milestone can seed, as their first rounds are the same.

Writes ``bench/results/embracing.json`` (every dataset run so far), ``bench/results/embracing.md``
(the tables), and ``bench/results/embracing-<dataset>-<case>.png`` (learning curves per case).

Usage: ``python bench/embracing.py --dataset femnist --cases 1,6 --seeds 0,1,2`` (the paper's 200 rounds and 25%
of the devices per round; ``--fraction 0.125`` halves the cost per round)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case as BenchCase, Context, parse_list, report_of, runs_of  # noqa: E402
from bench.harness.fleets import build_fleet, fleet_toml, write_fleet  # noqa: E402

RESULTS = ROOT / "bench" / "results"
WORKDIR = RESULTS / "embracing-runs"
FLEETS = ROOT / "profiles" / "fleets"
METHODS = ("embracingfl", "width")
COLUMNS = ("width", "embracingfl")  # the paper's column order
METHOD_NAMES = {"embracingfl": "EmbracingFL", "width": "width reduction"}


# -- the paper's cases and figures ------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    number: int
    slug: str
    strong: int  # of the paper's 128 clients
    moderate: int
    weak: int

    def counts(self, devices: int) -> tuple[int, int, int]:
        """The mix scaled to `devices` (every role the paper has keeps at least one device)."""
        raw = [self.strong * devices / 128, self.moderate * devices / 128, self.weak * devices / 128]
        out = [max(1, round(x)) if x > 0 else 0 for x in raw]
        out[2 if self.weak else 1 if self.moderate else 0] += devices - sum(out)
        return out[0], out[1], out[2]

    def label(self, devices: int) -> str:
        s, m, w = self.counts(devices)
        return f"{s} strong / {m} moderate / {w} weak"


CASES = {c.number: c for c in (
    Case(1, "allstrong", 128, 0, 0),
    Case(2, "50moderate", 64, 64, 0),
    Case(3, "75moderate", 32, 96, 0),
    Case(4, "87moderate", 16, 112, 0),
    Case(5, "50weak", 64, 0, 64),
    Case(6, "75weak", 32, 0, 96),
    Case(7, "87weak", 16, 0, 112),
    Case(8, "25s25m50w", 32, 32, 64),
    Case(9, "12s25m62w", 16, 32, 80),
    Case(10, "12s12m75w", 16, 16, 96),
)}

# Average capacity per case (Tables 3 and 4).
PAPER_CAPACITY = {
    "cifar10": {1: 1.00, 2: 0.71, 3: 0.57, 4: 0.49, 5: 0.58, 6: 0.37, 7: 0.27, 8: 0.44, 9: 0.33, 10: 0.30},
    "femnist": {1: 1.00, 2: 0.99, 3: 0.99, 4: 0.99, 5: 0.51, 6: 0.27, 7: 0.14, 8: 0.51, 9: 0.39, 10: 0.26},
}
# Validation accuracy in %, (mean, std): FEMNIST Table 4 (EmbracingFL only: the paper runs width
# reduction on CIFAR-10 only), CIFAR-10 Table 6 (both; case 1 is one number for both).
PAPER_ACCURACY = {
    "femnist": {"embracingfl": {1: (81.27, 0.6), 2: (81.80, 0.5), 3: (81.55, 0.5), 4: (80.44, 0.7), 5: (80.80, 0.7),
                                6: (80.78, 0.5), 7: (79.63, 0.3), 8: (81.29, 0.4), 9: (81.18, 0.3), 10: (81.17, 0.4)},
                "width": {}},
    "cifar10": {"embracingfl": {1: (80.45, 0.2), 2: (80.20, 0.2), 3: (79.78, 0.4), 4: (79.72, 0.6), 5: (80.08, 0.4),
                                6: (78.91, 0.5), 7: (76.98, 1.6), 8: (80.33, 0.6), 9: (79.63, 0.1), 10: (77.63, 0.2)},
                "width": {1: (80.45, 0.2), 2: (76.77, 1.3), 3: (67.92, 2.1), 4: (59.03, 0.8), 5: (72.97, 2.5),
                          6: (69.70, 2.1), 7: (54.53, 2.9), 8: (67.93, 1.5), 9: (59.59, 0.8), 10: (58.17, 2.2)}},
}
# Table 7 (CIFAR-10): target accuracy %, rounds of width reduction, rounds of EmbracingFL (of 1,000).
PAPER_ROUNDS = {1: (80, 890, 890), 2: (76, 867, 817), 3: (67, 982, 801), 4: (59, 836, 483), 5: (72, 813, 811),
                6: (69, 806, 629), 7: (54, 939, 572)}
PAPER_ROUNDS_TOTAL = {"femnist": 200, "cifar10": 1000}


# -- the datasets' settings and fleets --------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    dataset: str
    model: str
    devices: int
    fraction: float
    rounds: int
    lr: float
    eval_every: int
    eval_limit: int | None
    partition: dict  # the fleet's [partition]
    samples: int | None  # per device at most (None: the whole shard)
    groups: dict  # role -> its group's keys (class, budget, force_split)
    note: str
    lr_decay_at: tuple[int, ...] = ()  # rounds after which lr drops tenfold (appendix 6.2)


SETUPS = {
    "femnist": Setup(
        dataset="femnist", model="leaf_cnn", devices=32, fraction=0.25, rounds=200, lr=0.04, eval_every=2,
        eval_limit=None, partition={"scheme": "natural"}, samples=None,
        groups={
            "strong": {"class": "pi-4-2gb"},
            # Table 1: the moderate client drops the two convolutions (capacity 0.99): no budget makes
            # the planner choose that split, so it is forced, as the weak client's (section 4).
            "moderate": {"class": "pi-4-2gb", "budget": "runtime+300MiB", "force_split": 2},
            "weak": {"class": "pi-3b", "budget": "runtime+154MiB", "force_split": 3},
        },
        note="128 clients scaled to 32 (the staged FEMNIST sample has 110 writers: 3-4 whole writers per "
             "device, the paper gives each client 2); 8 devices per round, the paper's 25% (paper: 32 of 128)."),
    "cifar10": Setup(
        dataset="cifar10", model="resnet20", devices=8, fraction=1.0, rounds=280, lr=0.01, eval_every=2,
        eval_limit=2000, partition={"scheme": "dirichlet", "alpha": 0.1}, samples=1000,
        groups={
            "strong": {"class": "mid-phone"},
            # Budgets over the runtime measured on the emulating machine, for 1,000 local samples: the
            # planner gives weak devices split 7 (capacity ~0.17, Table 1's weak client). A moderate
            # device's cached stage-1 activations (64 KiB a sample) make split 4 hold more than the
            # whole model at this dataset size, so no budget makes the planner choose it: it is forced,
            # as FEMNIST's are (Table 1: capacity ~0.42).
            "moderate": {"class": "pi-4-2gb", "budget": "runtime+156MiB", "force_split": 4},
            "weak": {"class": "entry-phone", "budget": "runtime+100MiB"},
        },
        lr_decay_at=(240, 260),
        note="128 clients scaled to 8, every device in every round as in the paper's Table 6 runs "
             "(appendix 6.4: all clients always join); at most 1,000 images each (Dirichlet 0.1 shards, "
             "seeded subset); lr 0.01, tenfold less after rounds 240 and 260 of 280 (paper: 0.4, decayed at "
             "rounds 800 and 900 of 1,000; 0.1 and 0.03 swung more on these 8 devices); the bench evaluates "
             "on 2,000 test images."),
}


#: CIFAR-10 at the paper's scale (Table 6; appendices 6.1, 6.2 and 6.4): 128 clients over the whole
#: training set (Dirichlet 0.1 shards of all 50,000 images), every client in every round, tau = 10
#: local steps of batch 32, lr 0.4 decayed tenfold after 80% and 90% of the rounds (the paper's 800
#: and 900 of 1,000), scored on the whole test set. The roles are forced to Table 1's splits (moderate
#: 4, weak 7) over generous budgets: a Dirichlet shard holds from a few to over 2,000 images, and the
#: paper gives a role the same split whatever its data (budgets steer only the planner here).
PAPER_CIFAR10 = Setup(
    dataset="cifar10", model="resnet20", devices=128, fraction=1.0, rounds=1000, lr=0.4, eval_every=10,
    eval_limit=None, partition={"scheme": "dirichlet", "alpha": 0.1}, samples=None,
    groups={
        "strong": {"class": "mid-phone", "budget": "runtime+2GiB"},
        "moderate": {"class": "pi-4-2gb", "budget": "runtime+2GiB", "force_split": 4},
        "weak": {"class": "entry-phone", "budget": "runtime+2GiB", "force_split": 7},
    },
    lr_decay_at=(800, 900),
    note="The paper's scale: 128 clients over all 50,000 training images (Dirichlet 0.1), every client in every "
         "round (Table 6), lr 0.4, tenfold less after 80% and 90% of the rounds (appendix 6.2); scored on the "
         "10,000 test images.")


def setup_of(dataset: str, paper: bool) -> Setup:
    """The dataset's bench setting, or (``paper``, CIFAR-10 only) the paper's scale."""
    if paper and dataset != "cifar10":
        raise ValueError("--paper-scale is CIFAR-10's (Table 6); FEMNIST's paper scale needs 3,500 writers")
    return PAPER_CIFAR10 if paper else SETUPS[dataset]


def paper_decay(rounds: int) -> tuple[int, int]:
    """Appendix 6.2's milestones, 800 and 900 of 1,000 rounds, for a run of ``rounds``."""
    return max(1, round(0.8 * rounds)), max(2, round(0.9 * rounds))


def fleet_name(dataset: str, case: Case) -> str:
    return f"embracing-{dataset}-{case.slug}"


def case_fleet(setup: Setup, case: Case, *, devices: int | None = None, fraction: float | None = None,
               rounds: int | None = None, lr: float | None = None, samples: int | None = -1,
               lr_decay_at: tuple[int, ...] | None = None, seed: int = 0):
    """The fleet of one case (the shipped profiles/fleets/ file's at the setup's defaults): SGD with
    momentum 0.9, weight decay 1e-4, batch 32, tau = 10 (appendix 6.1); the paper's aggregation,
    without the server's influence bounds, and the papers' sample-weighted mean (no weight cap)."""
    devices = devices or setup.devices
    samples = setup.samples if samples == -1 else samples
    lr_decay_at = setup.lr_decay_at if lr_decay_at is None else lr_decay_at
    s, m, w = case.counts(devices)
    groups = [{"name": role, **setup.groups[role], "count": count, "expect_role": role,
               **({"samples": samples} if samples is not None else {})}
              for role, count in (("strong", s), ("moderate", m), ("weak", w)) if count]
    return build_fleet(
        fleet_name(setup.dataset, case), model=setup.model, dataset=setup.dataset, seed=seed,
        description=f"EmbracingFL case {case.number}: {setup.model} / {setup.dataset}, {s} strong + {m} moderate "
                    f"+ {w} weak",
        training={"norm_bound": 0.0, "direction_trust": False, "max_loss_rise": 0.0, "strategy": "embracingfl",
                  "rounds": rounds or setup.rounds, "fraction": fraction or setup.fraction, "local_steps": 10,
                  "batch_size": 32, "lr": lr or setup.lr,
                  **({"lr_decay_at": list(lr_decay_at), "lr_decay": 0.1} if lr_decay_at else {}),
                  "momentum": 0.9, "weight_decay": 1e-4},
        strategy={"max_weight_share": 1.0}, partition=setup.partition,
        emulation={"mode": "lightweight", "memory_cap": "none", "timeout_s": 900, "throttle_cpu": False},
        groups=groups)


def fleet_comment(setup: Setup, case: Case, devices: int | None = None) -> str:
    """The header of a case's fleet file: the case, the paper's figures, and how to run it."""
    devices = devices or setup.devices
    s, m, w = case.counts(devices)
    paper = PAPER_ACCURACY[setup.dataset]
    pe = paper["embracingfl"].get(case.number)
    pw = paper["width"].get(case.number)
    head = (f"EmbracingFL case {case.number} ({case.strong} strong / {case.moderate} moderate / {case.weak} weak "
            f"of 128 clients; Tables 3/4 and 6), {setup.model} on {setup.dataset}, scaled to {devices} devices: "
            f"{s} strong, {m} moderate, {w} weak. {setup.note} The paper: EmbracingFL {pe[0]:.2f}% after "
            f"{PAPER_ROUNDS_TOTAL[setup.dataset]} rounds"
            + (f", width reduction {pw[0]:.2f}%" if pw and case.number > 1 else "") + ".")
    settings = ("Appendix 6.1: SGD momentum 0.9, weight decay 1e-4, batch 32, tau = 10 local steps. A paper's case: "
                "its aggregation as the paper gives it, without the server's influence bounds (norm bound, direction "
                "trust, validation before commit: docs/security.md), and the papers' sample-weighted mean, no cap on "
                "one device's weight (max_weight_share = 1, kept by --strategy width, which takes the same option), "
                "so its numbers are the paper's method.")
    return "\n".join([
        *textwrap.wrap(head, 98), *textwrap.wrap(settings, 98),
        "Both methods on these devices, data and budgets:",
        f"  edgetrain emulate --fleet {fleet_name(setup.dataset, case)} --data-root \"$EDGETRAIN_DATA\"",
        f"  edgetrain emulate --fleet {fleet_name(setup.dataset, case)} --strategy width --data-root \"$EDGETRAIN_DATA\"",
        "(add --resume runs/<timestamp> to continue an interrupted run). bench/embracing.py runs every case",
        "with seeds and writes the tables (BENCHMARKS.md, \"EmbracingFL against width reduction\").",
        "Generated by `python bench/embracing.py --write-fleets`."])


def render_fleet(setup: Setup, case: Case, **given) -> str:
    """The fleet file of one case (TOML text), as shipped in profiles/fleets/ (``given``: :func:`case_fleet`'s)."""
    return fleet_toml(case_fleet(setup, case, **given), fleet_comment(setup, case, given.get("devices")))


def write_fleets(datasets: list[str]) -> list[Path]:
    return [write_fleet(case_fleet(SETUPS[dataset], case), FLEETS / f"{fleet_name(dataset, case)}.toml",
                        fleet_comment(SETUPS[dataset], case))
            for dataset in datasets for case in CASES.values()]


# -- one run ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSpec:
    dataset: str
    case: int
    method: str
    seed: int
    rounds: int
    devices: int
    fraction: float
    lr: float
    eval_every: int
    samples: int | None
    workers: int
    data_root: str | None
    workdir: str
    lr_decay_at: tuple[int, ...] = ()
    paper: bool = False  # PAPER_CIFAR10's fleet (forced splits, whole test set)
    torch_device: str = ""  # EDGETRAIN_TORCH_DEVICE for the run's server and workers ("": their defaults)

    @property
    def setting(self) -> str:
        return f"{self.dataset}-d{self.devices}-f{self.fraction:g}-lr{self.lr:g}" + (
            f"-n{self.samples}" if self.samples else "") + (
            "-decay" + "_".join(map(str, self.lr_decay_at)) if self.lr_decay_at else "") + ("-paper" if self.paper else "")

    @property
    def folder(self) -> Path:
        return Path(self.workdir) / self.setting / f"c{self.case}-{CASES[self.case].slug}" / self.method / f"s{self.seed}"

    def key(self) -> str:
        return f"{self.dataset}/c{self.case}/{self.method}/s{self.seed}"


def load_result(spec: RunSpec) -> dict | None:
    path = spec.folder / "result.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


HISTORY_KEYS = ("round", "accuracy", "test_loss", "round_wall_s", "roles", "selected", "reported", "over_budget",
                "devices_per_width", "skipped_no_torch")


def result_from_store(spec: RunSpec) -> dict | None:
    """A run's result read from its store's journal (read-only, so the run may still be going): what a
    report for fewer rounds than an unfinished run has done uses. Its wall time is the kept rounds' wall
    time (start-ups not counted)."""
    from bench.harness.journal import round_metrics

    history = [{k: m[k] for k in HISTORY_KEYS if k in m} for m in round_metrics(spec.folder / "store") or []]
    if not history:
        return None
    sessions_file = spec.folder / "sessions.json"
    sessions = json.loads(sessions_file.read_text()) if sessions_file.is_file() else []
    return {"key": spec.key(), "spec": dataclasses.asdict(spec), "fleet": fleet_name(spec.dataset, CASES[spec.case]),
            "mode": "lightweight", "strategy": spec.method, "rounds": history[-1]["round"], "history": history,
            "roles": {}, "wall_s": round(sum(h.get("round_wall_s", 0) for h in history), 1), "sessions": sessions,
            "from_journal": True}


def run_one(spec: RunSpec) -> dict:
    """Run (or resume, or extend) one run in this process; write its result.json."""
    from bench.harness.journal import final_correct
    from emulator.runner import completed_rounds, run_emulation
    from emulator.schedule import server_config

    if spec.torch_device:
        from edge_sdk.accelerator import ENV

        os.environ[ENV] = spec.torch_device  # this run's server and, inherited, its workers
    setup = setup_of(spec.dataset, spec.paper)
    case = CASES[spec.case]
    fleet = case_fleet(setup, case, devices=spec.devices, fraction=spec.fraction, rounds=spec.rounds, lr=spec.lr,
                       samples=spec.samples, lr_decay_at=spec.lr_decay_at, seed=spec.seed)
    folder = spec.folder
    folder.mkdir(parents=True, exist_ok=True)
    store = folder / "store"
    done = completed_rounds(store)
    config = server_config(fleet, rounds=spec.rounds, store_dir=store, data_root=spec.data_root, deadline_s=600)
    # Both methods aggregate as the paper does: the fleet's [strategy] max_weight_share = 1.0 (no cap).
    config = dataclasses.replace(config, strategy=spec.method, strategy_options=dict(fleet.strategy_options),
                                 eval_every=spec.eval_every,
                                 eval_limit=setup.eval_limit, resume=done > 0, keep_checkpoints=1)
    sessions_file = folder / "sessions.json"
    sessions = json.loads(sessions_file.read_text()) if sessions_file.is_file() else []
    print(f"[{spec.key()}] {'resuming after round ' + str(done) if done else 'starting'}: {fleet.description}, "
          f"{spec.rounds} rounds, mode lightweight", flush=True)
    t0 = time.monotonic()
    last = [t0]

    def on_event(kind: str, data: dict) -> None:
        if kind == "round_end":
            acc = data.get("accuracy")
            now = time.monotonic()
            print(f"[{spec.key()}] round {data['round']}/{spec.rounds}: "
                  + (f"accuracy {acc:.4f}, " if acc is not None else "") + f"{now - last[0]:.1f} s", flush=True)
            last[0] = now

    run = asyncio.run(run_emulation(fleet, config, on_event=on_event, data_root=spec.data_root,
                                    stderr_dir=folder / "logs", workers=spec.workers))
    wall = time.monotonic() - t0
    sessions.append({"resumed_after": done, "rounds_run": spec.rounds - done, "wall_s": round(wall, 1),
                     "ended": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "load_average_15min": round(os.getloadavg()[2], 1)})
    sessions_file.write_text(json.dumps(sessions, indent=1))
    history = []
    for m in run.history:
        history.append({k: m[k] for k in HISTORY_KEYS if k in m})
    roles: dict[str, dict] = {}
    for d in run.to_dict()["devices"]:
        r = roles.setdefault(d.get("role") or "?", {"devices": 0, "splits": set()})
        r["devices"] += 1
        r["splits"].add(d.get("split"))
    result = {
        "key": spec.key(), "spec": dataclasses.asdict(spec), "fleet": fleet.name, "mode": run.mode,
        "strategy": spec.method, "rounds": spec.rounds, "history": history,
        "roles": {k: {"devices": v["devices"], "splits": sorted(x for x in v["splits"] if x is not None)}
                  for k, v in roles.items()},
        "wall_s": round(sum(s["wall_s"] for s in sessions), 1), "sessions": sessions,
        "final_correct": final_correct(config, store), "eval_set": f"seed{spec.seed}" if setup.eval_limit else "all",
    }
    tmp = folder / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, folder / "result.json")
    # What a later --rounds needs to extend the run is its last checkpoint and journal; exported chunks
    # and training graphs are made again on demand.
    for sub in ("chunks", "train_graphs"):
        shutil.rmtree(store / sub, ignore_errors=True)
    return result


def launch(spec: RunSpec) -> dict | None:
    """Run one spec in a child process (isolated, so several can run at once); its result."""
    folder = spec.folder
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(Path(__file__).resolve()), "--run-one", json.dumps(dataclasses.asdict(spec))]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with open(folder / "bench.log", "ab") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=env, cwd=ROOT)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            text = line.decode(errors="replace").rstrip()
            m = re.search(r"\] round (\d+)/", text)
            if m is None or int(m.group(1)) % 10 == 0:  # every 10th round on the console, all in bench.log
                print(text, flush=True)
        proc.wait()
    if proc.returncode != 0:
        print(f"[{spec.key()}] failed with exit code {proc.returncode}; see {folder / 'bench.log'}", flush=True)
        return None
    return load_result(spec)


# -- the report -----------------------------------------------------------------------------------------
def curve(result: dict) -> tuple[list[int], list[float]]:
    pts = [(h["round"], h["accuracy"]) for h in result["history"] if h.get("accuracy") is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def end_accuracy(result: dict) -> float:
    """Mean accuracy over the evaluations in the last tenth of the rounds: where a run ends, without the
    round-to-round swing of a global model averaged from a few non-IID devices (one round's accuracy
    moves by several points on FEMNIST with 4 devices per round)."""
    rounds, accs = curve(result)
    last = [a for r, a in zip(rounds, accs) if r > rounds[-1] - max(1, result["rounds"] // 10)]
    return sum(last) / len(last)


def summarize(results: list[dict]) -> dict:
    """Per run: best, end (last tenth of the rounds) and final accuracy; per group: mean and std over seeds."""
    import numpy as np

    out: dict = {"seeds": [r["spec"]["seed"] for r in results]}
    for measure, values in (("best", [max(curve(r)[1]) for r in results]),
                            ("end", [end_accuracy(r) for r in results]),
                            ("final", [curve(r)[1][-1] for r in results])):
        out |= {measure: values, f"{measure}_mean": float(np.mean(values)), f"{measure}_std": float(np.std(values))}
    out["wall_s"] = float(sum(r["wall_s"] for r in results))
    return out


def truncate(result: dict, rounds: int) -> dict:
    """A run's result as if it had stopped after `rounds` (a run extended past the report's rounds);
    its wall time keeps the start-up share and the kept rounds' wall time."""
    if result["rounds"] == rounds:
        return result
    kept = [h for h in result["history"] if h["round"] <= rounds]
    startup = result["wall_s"] - sum(h.get("round_wall_s", 0) for h in result["history"])
    return {**result, "rounds": rounds, "history": kept, "extended_to": result["rounds"], "final_correct": "",
            "wall_s": round(max(0.0, startup) + sum(h.get("round_wall_s", 0) for h in kept), 1)}


def rounds_to(result: dict, target: float) -> int | None:
    for rnd, acc in zip(*curve(result)):
        if acc >= target:
            return rnd
    return None


def pct(x: float) -> str:
    return f"{100 * x:.2f}"


def final_intervals(lanes: dict[str, list[dict]]) -> dict:
    """Final accuracy of each lane (``embracingfl``, ``width``, ``allstrong``) with its 95% bootstrap
    interval over seeds and test images, and EmbracingFL's paired differences to the others, with
    whether each is a win or within noise (``bench/intervals.py``). Empty unless every run kept its
    per-image results (``final_correct``) and the lanes ran the same seeds."""
    import numpy as np

    from bench.intervals import accuracy_of, difference, interval, paired_draws, verdict

    lanes = {k: sorted(v, key=lambda r: r["spec"]["seed"]) for k, v in lanes.items() if v}
    seeds = {tuple(r["spec"]["seed"] for r in rs) for rs in lanes.values()}
    if "embracingfl" not in lanes or len(seeds) != 1 or not all(r.get("final_correct") for rs in lanes.values()
                                                                  for r in rs):
        return {}
    results = {k: [np.frombuffer(r["final_correct"].encode(), np.uint8) - ord("0") for r in rs]
               for k, rs in lanes.items()}
    draws = paired_draws(results, [r.get("eval_set", "all") for r in lanes["embracingfl"]], accuracy_of)
    est = {k: float(np.mean([c.mean() for c in v])) for k, v in results.items()}
    out: dict = {k: interval(draws[k], est[k]).to_dict() for k in lanes}
    for other in ("width", "allstrong"):
        if other in lanes:
            diff = difference(draws["embracingfl"], draws[other], est["embracingfl"], est[other])
            out[f"embracingfl_minus_{other}"] = {**diff.to_dict(), "verdict": verdict(diff)}
    return out


def build_report(dataset: str, setting: dict, runs: dict[tuple[int, str], list[dict]]) -> dict:
    """Tables 3/4/6 and 7 of one dataset from the finished runs {(case, method): [result per seed]}."""
    import numpy as np

    cases = {}
    for number in sorted({c for c, _ in runs}):
        case = CASES[number]
        entry: dict = {"case": number, "slug": case.slug, "mix": case.label(setting["devices"]),
                       "paper_mix": f"{case.strong}/{case.moderate}/{case.weak}",
                       "paper_capacity": PAPER_CAPACITY[dataset][number], "methods": {}}
        for method in METHODS:
            rs = runs.get((number, method)) or (runs.get((number, "embracingfl")) if number == 1 else None)
            if not rs:
                continue
            s = summarize(rs)
            s["paper"] = PAPER_ACCURACY[dataset][method].get(number)
            s["same_run_as"] = "embracingfl" if number == 1 and method == "width" else None
            entry["methods"][method] = s
        # Table 7: rounds to reach a target: the lower of the two methods' mean best accuracy, floored to a
        # whole percent (the paper's targets sit at its width reduction's accuracy).
        bests = [v["best_mean"] for v in entry["methods"].values()]
        if bests:
            target = math.floor(100 * min(bests)) / 100
            entry["target"] = target
            for method, s in entry["methods"].items():
                rs = runs.get((number, method)) or runs.get((number, "embracingfl"))
                per_seed = [rounds_to(r, target) for r in rs]
                s["rounds_to_target"] = per_seed
                reached = [x for x in per_seed if x is not None]
                s["rounds_to_target_mean"] = float(np.mean(reached)) if len(reached) == len(per_seed) else None
        if number in PAPER_ROUNDS and dataset == "cifar10":
            entry["paper_rounds"] = dict(zip(("target", "width", "embracingfl"), PAPER_ROUNDS[number]))
        entry["wall_s"] = sum(r["wall_s"] for (c, _), rs in runs.items() if c == number for r in rs)
        entry["final_intervals"] = final_intervals({
            "embracingfl": runs.get((number, "embracingfl"), []),
            "width": runs.get((number, "width"), []) if number != 1 else [],
            "allstrong": runs.get((1, "embracingfl"), []) if number != 1 else []})
        cases[number] = entry
    # The check, per case: EmbracingFL against all strong (case 1) and against width reduction,
    # in accuracy points of the means over seeds.
    base = cases.get(1, {}).get("methods", {}).get("embracingfl")
    for number, entry in cases.items():
        emb, wid = entry["methods"].get("embracingfl"), entry["methods"].get("width")
        if number == 1 or emb is None:
            continue
        gaps = {}
        for measure in ("best_mean", "end_mean", "final_mean"):
            if base is not None:
                gaps[f"embracingfl_minus_allstrong_{measure}"] = round(100 * (emb[measure] - base[measure]), 2)
            if wid is not None:
                gaps[f"embracingfl_minus_width_{measure}"] = round(100 * (emb[measure] - wid[measure]), 2)
        entry["gaps_points"] = gaps
    return {"setting": setting, "cases": cases}


def method_cells(entry: dict, cell, same_run: str) -> list[str]:
    """One table cell per method, in the paper's column order: `cell(summary)`, '-' where a method did not
    run, `same_run` where it is case 1's single all-full-width run."""
    cells = []
    for method in COLUMNS:
        s = entry["methods"].get(method)
        cells.append("-" if s is None else same_run if s.get("same_run_as") else cell(s))
    return cells


def markdown(dataset: str, report: dict) -> str:
    st = report["setting"]
    paper_table = "Table 4 (EmbracingFL only: the paper runs width reduction on CIFAR-10 only)" \
        if dataset == "femnist" else "Table 6 (Table 3 has the same EmbracingFL figures)"
    tenth = max(1, st["rounds"] // 10)
    lines = [
        f"### {dataset}: {st['model']}, {st['devices']} devices ({st['per_round']} per round), {st['rounds']} rounds "
        f"(paper: 128 clients, {'32 (Table 4)' if dataset == 'femnist' else 'all 128 (Table 6)'} per round, "
        f"{PAPER_ROUNDS_TOTAL[dataset]} rounds), lr {st['lr']}"
        + (f" (tenfold less after rounds {', '.join(map(str, st['lr_decay_at']))})" if st.get("lr_decay_at") else "")
        + ", mode lightweight",
        "",
        f"Accuracy in %: best over the evaluated rounds (the paper's measure), mean ± std over seeds; in brackets "
        f"the end accuracy, the mean over the evaluations of the last {tenth} rounds. Paper: {paper_table}.",
        "",
        "| case | strong / moderate / weak | paper avg capacity | width reduction (ours) | EmbracingFL (ours) "
        "| paper: width reduction | paper: EmbracingFL | seeds | wall time (its runs summed) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for number, e in sorted(report["cases"].items()):
        cells = method_cells(e, lambda s: f"{pct(s['best_mean'])} ± {pct(s['best_std'])} ({pct(s['end_mean'])})",
                             "(same run as EmbracingFL: all full width)")
        papers = []
        for method in COLUMNS:
            p = PAPER_ACCURACY[dataset][method].get(number)
            papers.append(f"{p[0]:.2f} ± {p[1]:.1f}" if p else "-")
        seeds = max((len(s["seeds"]) for s in e["methods"].values()), default=0)
        lines.append(f"| {number} ({e['slug']}) | {e['mix']} | {e['paper_capacity']:.2f} | {cells[0]} | {cells[1]} "
                     f"| {papers[0]} | {papers[1]} | {seeds} | {e['wall_s'] / 60:.0f} min |")
    gap_lines = []
    for number, e in sorted(report["cases"].items()):
        g = e.get("gaps_points") or {}
        parts = []
        for other, name in (("allstrong", "all strong"), ("width", "width reduction")):
            if f"embracingfl_minus_{other}_best_mean" in g:
                parts.append(f"EmbracingFL - {name} " + ", ".join(
                    f"{g[f'embracingfl_minus_{other}_{m}_mean']:+.2f} ({m})" for m in ("best", "end", "final")))
        if parts:
            gap_lines.append(f"- case {number}: " + "; ".join(parts))
    if gap_lines:
        lines += ["", "Differences of the means over seeds, in points (best; end: the last "
                      f"{tenth} rounds' mean; final: the last round):", "", *gap_lines]
    lines += interval_lines(report)
    lines += ["", f"Rounds to the target accuracy (Table 7 shape; mean over seeds, evaluated every "
                  f"{st['eval_every']} rounds; '-' if a seed never reached it):", "",
              "| case | target | width reduction (ours) | EmbracingFL (ours) | paper: target | paper: width reduction "
              "| paper: EmbracingFL |", "|---|---|---|---|---|---|---|"]

    def reached(s: dict) -> str:
        per = ", ".join("-" if x is None else str(x) for x in s["rounds_to_target"])
        mean = s.get("rounds_to_target_mean")
        return f"{mean:.0f} ({per})" if mean is not None else f"- ({per})"

    for number, e in sorted(report["cases"].items()):
        if "target" not in e:
            continue
        cells = method_cells(e, reached, "(same run)")
        pr = e.get("paper_rounds")
        paper = [f"{pr['target']}%", str(pr["width"]), str(pr["embracingfl"])] if pr else ["-", "-", "-"]
        lines.append(f"| {number} | {pct(e['target'])}% | {cells[0]} | {cells[1]} | {' | '.join(paper)} |")
    return "\n".join(lines) + "\n"


def interval_lines(report: dict) -> list[str]:
    """The final accuracies with their 95% bootstrap intervals (seeds and test images), and
    EmbracingFL's paired differences: a win only where the interval excludes 0."""
    from bench.intervals import Interval

    rows = []
    for number, e in sorted(report["cases"].items()):
        fi = e.get("final_intervals") or {}
        if not fi:
            continue
        cells = [Interval(**fi[k]).scaled(100).text() if k in fi else "-" for k in ("width", "embracingfl")]
        diffs = []
        for other in ("width", "allstrong"):
            d = fi.get(f"embracingfl_minus_{other}")
            word = {"wins": "**win**", "loses": "**loss**"}.get(d["verdict"], "within noise") if d else ""
            diffs.append(f"{Interval(d['estimate'], d['low'], d['high']).scaled(100).text(sign=True)} {word}"
                         if d else "-")
        rows.append(f"| {number} | {cells[0]} | {cells[1]} | {diffs[0]} | {diffs[1]} |")
    if not rows:
        return []
    return ["", "Final accuracy in %, mean over seeds [95% bootstrap interval over seeds and test images]; "
                "EmbracingFL's differences paired on the same seeds and images, a win only where the interval "
                "excludes 0:", "", "| case | width reduction | EmbracingFL | EmbracingFL - width reduction "
                "| EmbracingFL - all strong |", "|---|---|---|---|---|", *rows]


def restate(path: Path) -> str:
    """The gaps of a results file written before runs kept per-image results, with intervals: per
    case and measure (end, final), EmbracingFL's difference to width reduction and to all strong,
    the seeds resampled in pairs (the same seed is the same devices and data for every method) and
    each seed's test-set noise drawn as a binomial of its accuracy, independently per method (wider
    than the paired interval a rerun gives). A win only where the interval excludes 0."""
    from bench.intervals import difference, interval, seed_draws, verdict

    lines = [f"{path.name}: difference in points [95% interval over seeds and test images, unpaired images]", "",
             "| dataset | case | measure | EmbracingFL | EmbracingFL - width reduction | EmbracingFL - all strong |",
             "|---|---|---|---|---|---|"]
    for dataset, rep in report_of(json.loads(path.read_text()))["datasets"].items():
        n = rep["setting"].get("eval_limit") or {"femnist": 1695, "cifar10": 10000}[dataset]
        cases = rep["cases"]
        for number, e in sorted(cases.items(), key=lambda kv: int(kv[0])):
            if number == "1":
                continue
            lanes = {"embracingfl": e["methods"].get("embracingfl"), "width": e["methods"].get("width"),
                     "allstrong": cases.get("1", {}).get("methods", {}).get("embracingfl")}
            for measure in ("end", "final"):
                draws = {k: seed_draws(v[measure], n, noise_seed=i + 7) for i, (k, v) in enumerate(lanes.items()) if v}
                est = {k: float(np.mean(v[measure])) for k, v in lanes.items() if v}
                cells = [interval(draws["embracingfl"], est["embracingfl"]).scaled(100).text()]
                for other in ("width", "allstrong"):
                    if other not in draws:
                        cells.append("-")
                        continue
                    d = difference(draws["embracingfl"], draws[other], est["embracingfl"], est[other])
                    cells.append(f"{d.scaled(100).text(sign=True)} {verdict(d)}")
                lines.append(f"| {dataset} | {number} | {measure} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_case(dataset: str, report: dict, number: int, runs: dict[tuple[int, str], list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    e = report["cases"][number]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    lanes = [("embracingfl", "EmbracingFL", "C0"), ("width", "width reduction", "C3")]
    if number != 1 and (1, "embracingfl") in runs:
        lanes.append(("allstrong", "all strong (case 1)", "0.4"))
    for method, label, color in lanes:
        rs = runs.get((1, "embracingfl")) if method == "allstrong" else runs.get((number, method))
        if not rs or (number == 1 and method == "width"):
            continue
        xs = curve(rs[0])[0]
        ys = np.array([curve(r)[1][: len(xs)] for r in rs if len(curve(r)[1]) >= len(xs)])
        mean = ys.mean(axis=0)
        style = "--" if method == "allstrong" else "-"
        ax.plot(xs, 100 * mean, style, color=color, label=f"{label} ({len(ys)} seeds)")
        if method != "allstrong":
            ax.fill_between(xs, 100 * ys.min(axis=0), 100 * ys.max(axis=0), color=color, alpha=0.15)
    st = report["setting"]
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{dataset}, case {number}: {e['mix']}\n{st['model']}, {st['devices']} devices, {st['per_round']} "
                 f"per round, {st['rounds']} rounds, lightweight mode", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(ctx: Context, specs: list[RunSpec]) -> dict:
    """The dataset's report (beside the other datasets' already in the results file), its tables and plots."""
    args, out = ctx.args, ctx.out
    setup = setup_of(args.dataset, args.paper_scale)
    runs: dict[tuple[int, str], list[dict]] = {}
    for spec in specs:
        r = load_result(spec)
        if (r is None or r["rounds"] < spec.rounds) and args.report_only:
            r = result_from_store(spec)  # an unfinished (or extended) run's journal
        if r is not None and r["rounds"] >= spec.rounds:
            runs.setdefault((spec.case, spec.method), []).append(truncate(r, spec.rounds))
    setting = {"dataset": args.dataset, "model": setup.model, "devices": args.devices, "fraction": args.fraction,
               "per_round": max(1, round(args.devices * args.fraction)), "rounds": args.rounds,
               "paper_rounds": PAPER_ROUNDS_TOTAL[args.dataset], "lr": args.lr,
               "lr_decay_at": list(args.lr_decay_at), "eval_every": args.eval_every,
               "eval_limit": setup.eval_limit, "samples_per_device": args.samples, "seeds": args.seeds,
               "local_steps": 10, "batch_size": 32, "momentum": 0.9, "weight_decay": 1e-4,
               "mode": "lightweight (devices as asyncio tasks in worker processes; real orchestrator, real "
                       "DeviceClient, websockets on 127.0.0.1; no memory caps)", "note": setup.note}
    report = build_report(args.dataset, setting, runs)
    records = [{"dataset": args.dataset, "case": c, "method": m, "seed": r["spec"]["seed"], "wall_s": r["wall_s"],
                "roles": r["roles"], "sessions": r["sessions"],
                "curve": [[h["round"], h.get("accuracy")] for h in r["history"] if h.get("accuracy") is not None],
                "round_wall_s": [round(h.get("round_wall_s", 0), 2) for h in r["history"]],
                "over_budget": sum(len(h.get("over_budget") or []) for h in r["history"])}
               for (c, m), rs in sorted(runs.items()) for r in rs]
    report["markdown"] = markdown(args.dataset, report)
    old = json.loads(out.read_text()) if out.is_file() else {}
    datasets = {**report_of(old).get("datasets", {}), args.dataset: report}
    kept = [r for r in runs_of(old) if isinstance(r, dict) and r.get("dataset") != args.dataset]
    ctx.write(kept + records, {"datasets": datasets, "paper": "Lee et al., Embracing Federated Learning: Enabling "
                               "Weak Client Participation via Partial Model Training (Tables 3, 4, 6, 7)"}, quiet=True)
    out.with_suffix(".md").write_text("\n".join(d["markdown"] for _, d in sorted(datasets.items())))
    for number in report["cases"]:
        plot_case(args.dataset, report, number, runs,
                  out.parent / f"{out.stem}-{args.dataset}-{CASES[number].slug}.png")
    return report


def resolve(args: argparse.Namespace) -> None:
    """Fill the options left out from the dataset's setting (or the paper's scale, or --quick)."""
    if args.paper_scale:
        args.dataset = "cifar10"
        args.rounds = args.rounds or PAPER_CIFAR10.rounds
        if args.lr_decay_at is None:
            args.lr_decay_at = ",".join(map(str, paper_decay(args.rounds)))
        args.workers = args.workers if args.workers > 1 else default_workers()
    setup = setup_of(args.dataset, args.paper_scale)
    args.cases = sorted(CASES) if args.cases == "all" else parse_list(args.cases, int)
    args.methods = parse_list(args.methods)
    args.seeds = parse_list(args.seeds, int)
    args.rounds = args.rounds or setup.rounds
    args.devices = args.devices or setup.devices
    args.fraction = args.fraction or setup.fraction
    args.lr = args.lr or setup.lr
    args.lr_decay_at = setup.lr_decay_at if args.lr_decay_at is None else tuple(
        int(r) for r in args.lr_decay_at.split(",") if r.strip())
    args.samples = args.samples if args.samples is not None else setup.samples
    args.eval_every = args.eval_every or setup.eval_every


def default_workers() -> int:
    """Worker processes for a paper-scale run: one per core but one (the server's), at least 2."""
    return max(2, (os.cpu_count() or 2) - 1)


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dataset", choices=sorted(SETUPS), default="femnist")
    ap.add_argument("--cases", default="1,6", help="paper case numbers, e.g. 1,5,6,7 or all")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--rounds", type=int, default=None, help="default: the dataset's (femnist 200, cifar10 280)")
    ap.add_argument("--devices", type=int, default=None, help="devices in the fleet (default: femnist 32, cifar10 8; paper 128)")
    ap.add_argument("--fraction", type=float, default=None, help="share sampled per round")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--lr-decay-at", default=None,
                    help="rounds after which lr drops tenfold, comma-separated (default: the dataset's; '' none)")
    ap.add_argument("--samples", type=int, default=None, help="at most this many samples per device")
    ap.add_argument("--eval-every", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (each its own orchestrator and workers)")
    ap.add_argument("--workers", type=int, default=1, help="lightweight worker processes per run")
    ap.add_argument("--workdir", default=str(WORKDIR))
    ap.add_argument("--report-only", action="store_true",
                    help="only render the tables and plots: from finished runs, or the journals of runs that have "
                         "completed at least --rounds rounds")
    ap.add_argument("--write-fleets", action="store_true", help="write profiles/fleets/embracing-*.toml and exit")
    ap.add_argument("--paper-scale", action="store_true",
                    help="CIFAR-10 at the paper's scale: 128 clients over all 50,000 images, all of them every round, "
                         "lr 0.4 decayed after 80%% and 90%% of --rounds (default 1000), the whole test set "
                         "(README.md, \"EmbracingFL's CIFAR-10 table at the paper's scale\")")
    ap.add_argument("--device", choices=("cpu", "cuda", "auto"), default=None,
                    help="torch device of the server's evaluation and the emulated devices (EDGETRAIN_TORCH_DEVICE; "
                         "default: a GPU where torch sees one)")
    ap.add_argument("--restate", nargs="+", type=Path, default=None,
                    help="print the gaps of these results files (runs without per-image results) with intervals")
    ap.add_argument("--run-one", default=None, help=argparse.SUPPRESS)


def results_name(args: argparse.Namespace) -> str:
    """embracing[-paper|-quick]"""
    return "embracing-paper" if args.paper_scale else "embracing-quick" if args.quick else "embracing"


def run(ctx: Context) -> dict | None:
    args = ctx.args
    if args.restate:
        print("\n".join(restate(p) for p in args.restate))
        return None
    if args.run_one:
        fields = json.loads(args.run_one)
        run_one(RunSpec(**{**fields, "lr_decay_at": tuple(fields.get("lr_decay_at", ()))}))
        return None
    if args.write_fleets:
        for p in write_fleets(sorted(SETUPS)):
            print(p.relative_to(ROOT))
        return None
    resolve(args)
    specs = [RunSpec(args.dataset, c, m, s, args.rounds, args.devices, args.fraction, args.lr, args.eval_every,
                     args.samples, args.workers, args.data_root, args.workdir, args.lr_decay_at, args.paper_scale,
                     args.device or "")
             for s in args.seeds for c in args.cases for m in args.methods if not (c == 1 and m != "embracingfl")]
    todo = [s for s in specs if (r := load_result(s)) is None or r["rounds"] < s.rounds]
    per_round = max(1, round(args.devices * args.fraction))
    print(f"bench/embracing.py: {args.dataset}, cases {args.cases}, seeds {args.seeds}, {args.rounds} rounds, "
          f"{args.devices} devices ({per_round} per round), mode lightweight; {len(specs) - len(todo)} of "
          f"{len(specs)} runs already finished, {len(todo)} to run ({args.jobs} at a time)", flush=True)
    if not args.report_only and todo:
        # Most informative first: every case's first seed, then the next seed, ...
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for spec, result in zip(todo, pool.map(launch, todo)):
                if result is not None:
                    print(f"[{spec.key()}] done: best {max(curve(result)[1]):.4f}, final {curve(result)[1][-1]:.4f}, "
                          f"{result['wall_s'] / 60:.1f} min", flush=True)
                    write_outputs(ctx, specs)
    report = write_outputs(ctx, specs)
    print(report["markdown"])
    print(f"wall {time.time() - ctx.started:.0f} s; wrote {ctx.out}, {ctx.out.with_suffix('.md')} and the plots")
    return report


CASE = BenchCase("embracing", __doc__, run, arguments=arguments, seeds="0,1,2", data_root=True, results=results_name,
                 quick={"cases": "1,6", "seeds": "0", "rounds": 6, "devices": 16, "fraction": 0.25})


def main(argv: list[str] | None = None) -> dict | None:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
