"""Same numbers before and after: short seeded runs whose per-round numbers a refactor must not change.

Runs a fixed list of short, seeded cases, each through its command line in a child process (never
by importing the server's modules, whose paths a refactor moves), and writes per case and round the
global model's accuracy and loss and, for the DP runs, the epsilon the ledger spent (the model's and
each block's), to ``bench/results/same_numbers/<label>.json``. ``--compare A.json B.json`` (or
``--against LABEL`` after a run) prints every number that differs, case by case and round by round,
and exits 1 if any does: equality is exact.

The cases:

- ``embracing-femnist``: ``bench/embracing.py``, FEMNIST case 8 (2 strong, 2 moderate, 4 weak devices
  of the LEAF CNN), EmbracingFL, seed 0, 3 rounds, 4 of the 8 devices per round;
- ``prioritized-mnist``: ``bench/prioritized.py``, FedALIGN and VaRSeL at their defaults, seed 0,
  6 rounds (3 priority and 18 non-priority devices in one process);
- ``fedsubavg-movielens``: ``bench/fedsubavg_movielens.py --emulate``, the paper's LR fleet
  (``movielens-lr-fedsubavg``: 610 user devices, K = 50) through the orchestrator and the lightweight
  emulator, FedAvg and FedSubAvg, lr 0.3, seed 0, 4 rounds;
- ``fleet-plain``, ``fleet-secure``, ``fleet-central-dp``, ``fleet-distributed-dp``: one fleet
  (:func:`fleet_text`: ``mnist_2nn`` on MNIST, 6 devices training both blocks and 4 the head only,
  EmbracingFL, every device every round, 4 rounds) through ``edgetrain emulate``, four ways: plain,
  ``secure_aggregation``, ``dp`` (central Gaussian noise) and both (distributed discrete Gaussian noise
  added by the devices inside the secure round), the noise multiplier fixed at 0.5.

What keeps a case repeatable:

- every device reports in every round: fleets and benches wait for all their devices before round 1,
  draw their cohorts from numpy generators seeded with (seed, round), and no deadline closes a round
  early (``--deadline 3600`` for the fleet; the benches' own are 300-600 s, far above these rounds).
  The ``selected``/``reported`` numbers are compared too, and the script names a round where a selected
  device did not report, so a run that lost a device is not mistaken for a change of the code;
- one thread per process (``OMP_NUM_THREADS=1``, ``MKL_NUM_THREADS=1``; the devices set theirs),
  ``PYTHONHASHSEED=0``, torch on the CPU (``EDGETRAIN_TORCH_DEVICE=cpu``): :data:`ENV`;
- the OS randomness of secure aggregation's stochastic rounding and of the DP noise, fixed in those runs
  (:attr:`Case.seeded`) by ``bench/same_numbers_hook/sitecustomize.py``: without it the same code gives
  a secure run's test loss differing in its 8th digit and a DP run's accuracy by several points (the
  epsilons stay equal). The hook gives each device, and the server, its own seeded stream, read in the
  order that device draws, so the numbers do not depend on which device or worker draws first. The
  streams are read draw by draw: code that draws the same noise in pieces of other sizes, or in
  another order within a device, may give other numbers. The script checks that each fixed module
  drew bytes through the hook, and that the devices' draws were told apart.

The fleet runs with the server's default defences (norm bound, direction trust, validation before
commit); the secure and DP runs switch the first two off themselves.

``python bench/same_numbers.py --label before-b18d409`` runs every case (about 5 minutes on the shared
2-core machine); ``--against before-b18d409`` runs them and compares; ``--cases`` picks some;
``--os-randomness`` leaves the randomness to the OS (the secure and DP cases then differ run to run).
The results file is the harness's (bench/harness/results.py), one run record per case; ``--compare``
also reads the files written before the harness (their cases under ``cases``), such as the baseline.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "bench" / "same_numbers_hook"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import RESULTS as ALL_RESULTS, SCHEMA, Case, Context, parse_list, report_of  # noqa: E402
from bench.harness.fleets import build_fleet, fleet_toml, group, same_fleet  # noqa: E402

RESULTS = ALL_RESULTS / "same_numbers"


def cli_entry() -> list[str]:
    """The ``edgetrain`` command line: the top-level ``edgetrain`` package where it exists, else the
    server's ``orchestrator.cli`` (where the CLI lived before it moved)."""
    try:
        module = "edgetrain" if importlib.util.find_spec("edgetrain.__main__") else "orchestrator.cli"
    except ModuleNotFoundError:
        module = "orchestrator.cli"
    return [sys.executable, "-m", module]


CLI = cli_entry()
BENCH = [sys.executable]
#: The modules whose ``os.urandom`` the hook fixes, per kind of randomness: a secure round's stochastic
#: rounding, and the DP noise (central: the server's Gaussian; distributed: the devices' shares).
ROUNDING, NOISE = "edge_sdk.secagg.fixedpoint", "edge_sdk.dp"
#: One thread everywhere, a fixed hash seed, torch on the CPU: what every case runs with.
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1",
       "EDGETRAIN_TORCH_DEVICE": "cpu"}

#: The fleet's [training] beside the plain run's: secure aggregation, and DP with a fixed noise multiplier.
SECURE = {"secure_aggregation": True}
DP = {"dp": True, "dp_noise_multiplier": 0.5, "dp_clip": 1.0}


def fleet_text(mode: dict[str, object]) -> str:
    """The fleet file of the fleet cases: mnist_2nn on MNIST, 10 devices, every one in every round."""
    fleet = build_fleet(
        "same-numbers", model="mnist_2nn", dataset="mnist", seed=0,
        description="same numbers: mnist_2nn, 6 devices train both blocks, 4 the head only",
        training={"strategy": "embracingfl", "rounds": 4, "fraction": 1.0, "local_steps": 5, "batch_size": 16,
                  "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, **mode},
        partition={"scheme": "iid"},
        emulation={"mode": "lightweight", "memory_cap": "none", "timeout_s": 900, "throttle_cpu": False},
        groups=[group("mid-phone", 6, "strong"), group("mid-phone", 4, "head", force_split=1)])
    return fleet_toml(fleet, "bench/same_numbers.py's fleet: mnist_2nn on MNIST, 10 devices, every one in every round.")


Rounds = list[dict[str, float]]


@dataclass(frozen=True)
class SeededCase:
    """One seeded run (or a few: a bench's algorithms) and how to read its per-round numbers."""

    name: str
    command: Callable[[Path, str], list[str]]  # (its work folder, the data root) -> argv
    read: Callable[[Path], dict[str, Rounds]]  # its work folder -> {run: [{round, accuracy, ...}]}
    seeded: tuple[str, ...] = ()  # modules whose OS randomness is fixed (and must be drawn through the hook)
    by_device: tuple[str, ...] = ()  # of those, the ones only devices draw from (each on its own stream)
    files: dict[str, str] = field(default_factory=dict)  # written into the work folder first


def only_one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise RuntimeError(f"expected one {pattern} under {folder}, found {len(found)}")
    return found[0]


def numbers(row: dict[str, object]) -> dict[str, float]:
    """The entries of a round that are numbers (None: not measured that round, left out)."""
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


# -- the cases --------------------------------------------------------------------------------------------
def embracing_command(work: Path, data_root: str) -> list[str]:
    return [*BENCH, "bench/embracing.py", "--dataset", "femnist", "--cases", "8", "--methods", "embracingfl",
            "--seeds", "0", "--rounds", "3", "--devices", "8", "--fraction", "0.5", "--eval-every", "1",
            "--workers", "2", "--workdir", str(work / "runs"), "--out", str(work / "embracing.json"),
            "--data-root", data_root]


def embracing_read(work: Path) -> dict[str, Rounds]:
    result = json.loads(only_one(work / "runs", "**/result.json").read_text())
    keep = ("round", "accuracy", "test_loss", "selected", "reported")
    return {"embracingfl": [numbers({k: h.get(k) for k in keep}) for h in result["history"]]}


def prioritized_command(work: Path, data_root: str) -> list[str]:
    return [*BENCH, "bench/prioritized.py", "--seeds", "0", "--algorithms", "fedalign,varsel", "--rounds", "6",
            "--out", str(work / "prioritized.json")]


def prioritized_read(work: Path) -> dict[str, Rounds]:
    """Per round the priority test set's accuracy and, for FedALIGN, the priority loss and its threshold
    (the strategy's epsilon, not a privacy one), and how many non-priority devices each folded."""
    out = {}
    for run in json.loads((work / "prioritized.json").read_text())["runs"]:
        out[run["algorithm"]] = [
            numbers({"round": r["round"], "accuracy": acc, "priority_loss": r.get("priority_loss"),
                     "fedalign_epsilon": r.get("epsilon"), "included": len(r.get("included") or {})})
            for acc, r in zip(run["priority_accuracy"], run["rounds"], strict=True)]
    return out


def fedsubavg_command(work: Path, data_root: str) -> list[str]:
    return [*BENCH, "bench/fedsubavg_movielens.py", "--emulate", "--fleet", "movielens-lr-fedsubavg", "--rounds", "4",
            "--lrs", "0.3", "--seeds", "0", "--out", str(work / "fedsubavg.json")]


def fedsubavg_read(work: Path) -> dict[str, Rounds]:
    """Per algorithm, learning rate and seed: the test accuracy and loss and the devices that reported."""
    out = {}
    for r in json.loads(only_one(work, "fedsubavg*.json").read_text())["runs"]:
        out[f"{r['algorithm']}/lr{r['lr']}/s{r['seed']}"] = [
            {"round": i + 1, "accuracy": acc, "test_loss": loss, "reported": rep}
            for i, (acc, loss, rep) in enumerate(zip(r["accuracy"], r["test_loss"], r["reported"], strict=True))]
    return out


def fleet_command(work: Path, data_root: str) -> list[str]:
    return [*CLI, "emulate", "--fleet", str(work / "fleet.toml"), "--out", str(work / "runs"), "--deadline", "3600",
            "--workers", "2", "--data-root", data_root]


def fleet_read(work: Path) -> dict[str, Rounds]:
    """``edgetrain emulate``'s metrics.json: accuracy, test loss, the cohort, and the privacy ledger's
    epsilon after each round (the model's and each block's)."""
    metrics = json.loads(only_one(work / "runs", "*/metrics.json").read_text())
    rows = []
    for r in metrics["rounds"]:
        privacy = r.get("privacy") or {}
        blocks = {f"epsilon[{b}]": e for b, e in sorted((privacy.get("blocks") or {}).items())}
        rows.append(numbers({"round": r["round"], "accuracy": r.get("accuracy"), "test_loss": r.get("test_loss"),
                             "selected": r.get("selected"), "reported": r.get("reported"),
                             "epsilon": privacy.get("epsilon"), **blocks}))
    return {"fleet": rows}


def fleet_case(name: str, mode: dict[str, object], seeded: tuple[str, ...] = (), by_device: tuple[str, ...] = ()
               ) -> SeededCase:
    return SeededCase(name, fleet_command, fleet_read, seeded, by_device, {"fleet.toml": fleet_text(mode)})


CASES = {c.name: c for c in (
    SeededCase("embracing-femnist", embracing_command, embracing_read),
    SeededCase("prioritized-mnist", prioritized_command, prioritized_read),
    SeededCase("fedsubavg-movielens", fedsubavg_command, fedsubavg_read),
    fleet_case("fleet-plain", {}),
    fleet_case("fleet-secure", SECURE, (ROUNDING,), (ROUNDING,)),
    fleet_case("fleet-central-dp", DP, (NOISE,)),  # the server draws the noise
    fleet_case("fleet-distributed-dp", SECURE | DP, (ROUNDING, NOISE), (ROUNDING, NOISE)),
)}


# -- running ----------------------------------------------------------------------------------------------
def case_env(case: SeededCase, work: Path, data_root: str, fixed: bool) -> dict[str, str]:
    env = {**os.environ, **ENV, "EDGETRAIN_DATA": data_root}
    if case.seeded and fixed:
        env.update(PYTHONPATH=os.pathsep.join([str(HOOK), *filter(None, [os.environ.get("PYTHONPATH")])]),
                   SAME_NUMBERS_SEEDED=",".join(case.seeded), SAME_NUMBERS_HOOK_LOG=str(work / "seeded.log"))
    return env


def shown(argv: list[str], work: Path, data_root: str = "") -> str:
    """The command as recorded: ``python`` for the interpreter, ``<work>`` for the case's temporary folder,
    ``<data>`` for the data root."""
    def one(a: str) -> str:
        return "python" if a == sys.executable else "<data>" if data_root and a == data_root else a.replace(
            str(work), "<work>")
    return " ".join(map(one, argv))


def run_case(case: SeededCase, root: Path, data_root: str, timeout_s: float, fixed: bool = True) -> dict:
    """Run one case in its own process group (killed whole on a timeout); its numbers, or its error.
    ``fixed`` False: the OS randomness left as it is (the secure and DP cases then differ run to run)."""
    work = root / case.name
    work.mkdir(parents=True)
    for name, text in case.files.items():
        (work / name).write_text(text)
    argv = case.command(work, data_root)
    entry: dict = {"command": shown(argv, work, data_root), "files": dict(case.files),
                   "seeded": list(case.seeded) if fixed else []}
    started = time.monotonic()
    with open(work / "output.log", "wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=case_env(case, work, data_root, fixed), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | str = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            rc = f"no result after {timeout_s:.0f} s"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    entry["wall_s"] = round(time.monotonic() - started, 1)
    if rc != 0:
        tail = (work / "output.log").read_text(errors="replace").splitlines()[-15:]
        entry["error"] = f"exit {rc}: " + "\n".join(tail)
        return entry
    try:
        entry["runs"] = case.read(work)
    except (OSError, RuntimeError, ValueError, KeyError, TypeError) as exc:  # the run's output has changed shape
        entry["error"] = f"ran, but its numbers could not be read: {exc!r} (update {case.read.__name__})"
        return entry
    if entry["seeded"] and (problem := hook_problem(case, work / "seeded.log")):
        entry["error"] = problem
    entry["incomplete_rounds"] = [f"{run}: round {r['round']}" for run, rows in entry["runs"].items() for r in rows
                                  if r.get("reported", 0) < r.get("selected", 0)]
    return entry


def hook_problem(case: SeededCase, log: Path) -> str | None:
    """Why the hook did not fix the case's randomness (the numbers would not repeat), or None."""
    streams: dict[str, set[str]] = {}
    for line in log.read_text().splitlines() if log.is_file() else []:
        module, _, device = line.partition("\t")
        streams.setdefault(module, set()).add(device)
    if missing := [m for m in case.seeded if m not in streams]:
        return (f"{', '.join(missing)} drew no bytes through the hook: the randomness comes from elsewhere now "
                "(update ROUNDING/NOISE)")
    if unkeyed := [m for m in case.by_device if "" in streams[m]]:
        return (f"draws from {', '.join(unkeyed)} came from no device object with a device_id near the call, so "
                "devices sharing a worker share a stream (update the hook's drawing_device)")
    return None


def run_all(names: list[str], data_root: str, workdir: Path | None, timeout_s: float, fixed: bool) -> list[dict]:
    """Every case in turn: one run record each (its command, numbers or error)."""
    root = Path(tempfile.mkdtemp(prefix="same-numbers-")) if workdir is None else workdir
    runs = []
    try:
        for name in names:
            print(f"{name}: running", flush=True)
            entry = run_case(CASES[name], root, data_root, timeout_s, fixed)
            runs.append({"case": name, **entry})
            print(f"{name}: {'FAILED ' + entry['error'] if 'error' in entry else 'done'} in {entry['wall_s']:.0f} s",
                  flush=True)
            if entry.get("incomplete_rounds"):
                print(f"{name}: not every selected device reported in {', '.join(entry['incomplete_rounds'])}",
                      flush=True)
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    return runs


# -- comparing --------------------------------------------------------------------------------------------
def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def case_differences(a: dict | None, b: dict | None) -> list[tuple[str, str, str, object, object]]:
    """(run, round, number, A's value, B's value) for every number that is not the same in both."""
    if a is None or b is None or "error" in a or "error" in b:
        def state(c: dict | None) -> str:
            return "missing" if c is None else c.get("error", "ran").splitlines()[0]
        return [("-", "-", "case", state(a), state(b))]
    rows = []
    for run in sorted(set(a["runs"]) | set(b["runs"])):
        ra, rb = a["runs"].get(run, []), b["runs"].get(run, [])
        for i in range(max(len(ra), len(rb))):
            x, y = (ra[i] if i < len(ra) else {}), (rb[i] if i < len(rb) else {})
            for key in sorted(set(x) | set(y)):
                if not same(x.get(key), y.get(key)):
                    rows.append((run, str(i + 1), key, x.get(key, "-"), y.get(key, "-")))
    return rows


def cases_of(doc: dict) -> dict[str, dict]:
    """A results file's cases by name: the run records of a harness document, ``cases`` of an older file."""
    if doc.get("schema") == SCHEMA:
        return {r["case"]: {k: v for k, v in r.items() if k != "case"} for r in doc["runs"]}
    return doc["cases"]


def same_files(a: dict[str, str], b: dict[str, str]) -> bool:
    """The cases' files alike: fleet files describing the same fleet, others the same text."""
    return set(a) == set(b) and all(same_fleet(a[k], b[k]) if k.endswith(".toml") else a[k] == b[k] for k in a)


def heading(doc: dict) -> str:
    label = doc.get("label") or report_of(doc).get("label")
    return f"{label} ({(doc.get('commit') or '?')[:9]}{', dirty' if doc.get('dirty') else ''}, {doc['date']})"


def compare(a: dict, b: dict, names: list[str] | None = None) -> int:
    """Print the differences of B from A per case; 1 if any number differs (or a case is missing or failed)."""
    ca_all, cb_all = cases_of(a), cases_of(b)
    names = names or sorted(set(ca_all) | set(cb_all), key=lambda n: list(CASES).index(n) if n in CASES else 99)
    print(f"A: {heading(a)}\nB: {heading(b)}")
    differ = 0
    for name in names:
        ca, cb = ca_all.get(name) or {}, cb_all.get(name) or {}
        for what in ("command", "files", "seeded"):
            if what in ca and what in cb and not (same_files(ca[what], cb[what]) if what == "files"
                                                  else ca[what] == cb[what]):
                print(f"{name}: note: ran with another {what} (A: {ca[what]!r:.200}; B: {cb[what]!r:.200})")
        rows = case_differences(ca_all.get(name), cb_all.get(name))
        if not rows:
            runs = ca_all[name]["runs"]
            count = sum(len(row) for rounds in runs.values() for row in rounds)
            print(f"{name}: identical ({', '.join(f'{k} {len(v)} rounds' for k, v in runs.items())}; {count} numbers)")
            continue
        differ += 1
        print(f"{name}: {len(rows)} differ")
        print(f"  {'run':26s} {'round':>5s}  {'number':18s} {'A':>22s} {'B':>22s} {'B - A':>10s}")
        for run, rnd, key, x, y in rows:
            delta = f"{y - x:+.2e}" if isinstance(x, (int, float)) and isinstance(y, (int, float)) else ""
            print(f"  {run:26s} {rnd:>5s}  {key:18s} {x!s:>22s} {y!s:>22s} {delta:>10s}")
    print(f"{differ} of {len(names)} cases differ" if differ else f"all {len(names)} cases give the same numbers")
    return 1 if differ else 0


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()


def label_of(args: argparse.Namespace) -> str:
    """same_numbers/<label> (default label: the commit, '-dirty' if a tracked file differs)"""
    if args.label:
        return f"same_numbers/{args.label}"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return f"same_numbers/{git('rev-parse', '--short=7', 'HEAD')}{'-dirty' if dirty else ''}"


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--cases", default="all", help=f"comma-separated, of: {', '.join(CASES)} (default all)")
    ap.add_argument("--label", default=None, help="name of the results file (default: the commit, '-dirty' if so)")
    ap.add_argument("--against", default=None, metavar="LABEL",
                    help="after the run, compare with bench/results/same_numbers/LABEL.json; exit 1 if any differ")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="only compare two results files")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the runs' folders here (default: a temporary one)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one case may take")
    ap.add_argument("--os-randomness", action="store_true",
                    help="leave the secure rounding and the DP noise to the OS CSPRNG (shows that those cases then "
                         "differ from run to run)")


def run(ctx: Context) -> int:
    args, ap = ctx.args, ctx.parser
    if args.compare:
        return compare(load(args.compare[0]), load(args.compare[1]))
    names = list(CASES) if args.cases == "all" else parse_list(args.cases)
    if unknown := [n for n in names if n not in CASES]:
        ap.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    if not args.data_root or not Path(args.data_root).is_dir():
        ap.error("give --data-root (or set EDGETRAIN_DATA): the folder holding femnist_leaf_flic, mnist and "
                 "movielens_latest_small")
    baseline = load(RESULTS / f"{args.against}.json") if args.against else None  # a missing one fails before the runs
    runs = run_all(names, args.data_root, args.workdir, args.timeout, not args.os_randomness)
    doc = ctx.write(runs, {"label": ctx.name.split("/", 1)[1], "cli": shown(CLI, ROOT), "env": ENV}, quiet=True)
    print(f"wall {doc['wall_s']:.0f} s; wrote {ctx.out}")
    if baseline is not None:
        return compare(baseline, doc, names)
    return 1 if any("error" in r for r in runs) else 0


CASE = Case("same_numbers", __doc__, run, arguments=arguments, data_root=True, results=label_of)


def main(argv: list[str] | None = None) -> int:
    return CASE.main(argv)


if __name__ == "__main__":
    sys.exit(main())
