"""Peak memory per EmbracingFL role under hard caps, beside the paper's capacities (Table 1).

For each model a small fleet runs as capped OS processes against a local orchestrator (the same
``emulator.supervisor.run_fleet`` as ``edgetrain emulate``): the LEAF CNN on FEMNIST with
a strong device (split 0) and a weak one (forced split 3: the paper's weak model), taken from
``profiles/fleets/femnist-75weak.toml`` with that fleet's shard sizes; ResNet20 on a class-balanced
CIFAR-10 subset with one strong, one moderate (split 4) and one weak device (split 7), from
``profiles/fleets/cifar10-resnet20-mixed.toml``. Per role it reports the cgroup's peak charge, the
peak resident set, the budget, and the ratios role/strong of

- the total peak (what a device must have), and
- the peak above the runtime baseline: the peak minus that of an idle device process that has
  imported torch, ONNX Runtime and the device modules, measured in the same run under the same cap
  mechanism (cgroups do not charge library pages another process touched first, so the baseline
  is taken both ways),

next to the paper's capacity C = (2p + 2a) / (2P + 2A) (EmbracingFL section 4, "Client Capacity
Settings") and this project's accounting of the same split.

With ``--backends torch,onnxruntime`` (the default) each model runs twice: all devices on torch,
then the moderate and weak devices on the ONNX Runtime backend (the tail's training graph; the
process never loads torch) beside the same strong torch device, their budgets the fleet's margin over
the ONNX Runtime runtime instead of torch's, and the server's planner choosing their splits. Per
role and backend it reports the peak RSS, its ratio to the strong torch device, and the time per
local step. A planner table gives each device class in ``profiles/devices`` its split per backend.
Not a test: run it on a quiet machine,
``python bench/memory_ratio.py [--rounds 2] [--cifar-limit 256] [--data-root DIR]``.
Writes ``bench/results/memory_ratio.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.harness import Case, Context, SCHEMA, parse_list, report_of  # noqa: E402
from emulator import CappedProcess, DeviceSpec, Fleet, load_fleet  # noqa: E402
from emulator.recorder import EmulationRun  # noqa: E402
from emulator.schedule import server_config  # noqa: E402
from emulator.supervisor import run_fleet  # noqa: E402

MiB = float(1 << 20)
ROLES = ("strong", "moderate", "weak")

#: EmbracingFL Table 1, the Capacity column.
PAPER_CAPACITY: dict[str, dict[str, float]] = {
    "leaf_cnn": {"strong": 1.00, "moderate": 0.99, "weak": 0.02},
    "resnet20": {"strong": 1.00, "moderate": 0.42, "weak": 0.16},
}

#: model -> the fleet whose devices (a few per role) and shard sizes it measures.
CASES: dict[str, str] = {"leaf_cnn": "femnist-75weak", "resnet20": "cifar10-resnet20-mixed"}

#: What an idle device process holds: the runtimes and the device's own modules, nothing trained.
_IDLE = """
import json
import onnxruntime, torch
import edge_sdk.client, edge_sdk.data, edge_sdk.trainer
from edge_sdk.memory import process_memory
seen = process_memory()
print(json.dumps({"rss": seen.rss_bytes, "peak_rss": seen.peak_rss_bytes}), flush=True)
"""


@dataclasses.dataclass
class Baseline:
    """An idle device process: its cgroup peak (None without a cgroup) and resident set."""

    mechanism: str
    peak_bytes: int | None
    rss_bytes: int


@dataclasses.dataclass
class RolePeak:
    """The largest peaks among one role's devices."""

    role: str
    split: int
    devices: int
    budget_bytes: int
    peak_bytes: int | None  # the cgroup's max usage (the RSS high-water mark without a cgroup)
    peak_rss_bytes: int | None
    samples: int  # the largest local dataset among the role's devices
    rounds_reported: int
    status: str
    accounting_bytes: int  # profiles.accounting's footprint of the split (runtime included)
    accounting_capacity: float  # profiles.accounting's (2p + 2a) / (2P + 2A) of the split
    rss_by_round: list[int]  # the role's largest resident high-water mark after each round it reported
    backend: str = "torch"  # the training backend the role's devices reported
    torch_loaded: bool | None = None  # whether any of its device processes loaded torch
    step_s: float | None = None  # mean wall time per local step (train phase time / local steps)


def idle_baseline(mechanism: str) -> Baseline:
    """Start an idle device process under `mechanism` with a roomy budget; read its peaks."""
    from emulator.localfleet import device_env

    with tempfile.TemporaryFile() as out:
        proc = CappedProcess.start([sys.executable, "-c", _IDLE], 2 << 30, mechanism=mechanism, timeout_s=300,
                                   env=device_env(), stdout=out, cwd=str(Path(__file__).resolve().parents[1]))
        result = proc.wait()
        out.seek(0)
        text = out.read().decode()
    if result.returncode != 0:
        raise RuntimeError(f"the idle device process failed (rc {result.returncode}): {text}")
    fields = json.loads(text.strip().splitlines()[-1])
    return Baseline(result.mechanism, result.peak_bytes if result.mechanism.startswith("cgroup") else None,
                    fields["peak_rss"])


def pick(fleet: Fleet, per_role: int, extra_bytes: int) -> list[DeviceSpec]:
    """The first `per_role` devices of each expected role.

    With `extra_bytes`, each budget is raised by that much and each device is held to the split the
    planner gives at its fleet budget (a larger budget would otherwise buy it a larger suffix).
    """
    taken: dict[str, int] = {}
    chosen = []
    cost = None
    for d in fleet.devices():
        role = d.expect_role or "unknown"
        if taken.get(role, 0) >= per_role:
            continue
        taken[role] = taken.get(role, 0) + 1
        if extra_bytes and d.force_split is None:
            from edge_sdk.models.zoo import build_model
            from profiles.accounting import measure_model
            from profiles.planner import plan_split

            cost = cost or measure_model(build_model(fleet.model))
            d = dataclasses.replace(d, force_split=plan_split(cost, d.budget_bytes, fleet.training.batch_size).split)
        chosen.append(dataclasses.replace(d, budget_bytes=d.budget_bytes + extra_bytes))
    return chosen


def shard_sizes(fleet: Fleet, specs: list[DeviceSpec], data_root: str | None, limit: int | None) -> dict[str, int]:
    """Each device's number of local samples, partitioned as the device partitions them."""
    from edge_sdk.data import load_dataset, partition

    data = load_dataset(fleet.dataset, root=data_root, split="train", limit=limit)
    part = fleet.partition
    labels = data.groups if part.scheme == "natural" else data.y
    shards = partition(labels, fleet.num_devices, part.scheme, alpha=part.alpha or 0.5, seed=part.seed)
    return {s.id: len(shards[s.index]) for s in specs}


def role_peaks(model: str, fleet: Fleet, run: EmulationRun, samples: dict[str, int], batch: int,
               runtime: int, runtime_ort: int | None = None) -> dict[str, RolePeak]:
    """Per role: the largest peaks of its devices, and the accounting's footprint of its split."""
    from edge_sdk.models.zoo import build_model
    from profiles.accounting import measure_model

    cost = measure_model(build_model(model))
    out: dict[str, RolePeak] = {}
    for role in ROLES:
        devs = [d for d in run.devices if d.expect_role == role]
        if not devs:
            continue
        split = max(d.split for d in devs)
        peaks = [d.peak_bytes for d in devs if d.peak_bytes is not None]
        rss = [d.peak_rss_bytes for d in devs if d.peak_rss_bytes is not None]
        bad = sorted({d.status for d in devs} - {"finished", "stopped"})
        done = [e for d in devs for e in d.events if e.get("event") == "round_done" and e.get("phase", "train") == "train"]
        backend = next((str(r["backend"]) for r in done if r.get("backend")), "torch")
        steps = [float(r["train_s"]) / fleet.training.local_steps for r in done if r.get("train_s")]
        role_runtime = runtime_ort if backend == "onnxruntime" and runtime_ort is not None else runtime
        out[role] = RolePeak(
            role=role, split=split, devices=len(devs), budget_bytes=min(d.budget_bytes for d in devs),
            peak_bytes=max(peaks) if peaks else None, peak_rss_bytes=max(rss) if rss else None,
            samples=max(samples[d.device] for d in devs), rounds_reported=min(len(d.rounds) for d in devs),
            status=", ".join(bad) if bad else "finished",
            accounting_bytes=cost.footprint(max(split, 0), batch, runtime_bytes=role_runtime,
                                            local_samples=max(samples[d.device] for d in devs)).total,
            accounting_capacity=cost.capacity(max(split, 0), batch),
            rss_by_round=_by_round(devs), backend=backend,
            torch_loaded=any(bool(r.get("torch_loaded")) for r in done) if done else None,
            step_s=sum(steps) / len(steps) if steps else None,
        )
    return out


def _by_round(devices: list) -> list[int]:
    """Per round, the largest peak RSS the devices reported (a high-water mark: it never falls)."""
    peaks: dict[int, int] = {}
    for d in devices:
        for r in d.rounds:
            if r.get("round") is not None and r.get("peak_rss_bytes"):
                peaks[int(r["round"])] = max(peaks.get(int(r["round"]), 0), int(r["peak_rss_bytes"]))
    return [peaks[k] for k in sorted(peaks)]


def ratios(roles: dict[str, RolePeak], baseline: Baseline, runtime_bytes: int) -> dict[str, dict[str, float | None]]:
    """role / strong of the total peaks, of the peaks above the idle process's, and of the
    accounting's footprints above the runtime it plans with (`runtime_bytes`)."""
    strong = roles.get("strong")

    def ratio(a: int | None, b: int | None, base: int | None = 0) -> float | None:
        if a is None or b is None or base is None or b - base <= 0:
            return None
        return (a - base) / (b - base)

    out = {}
    for role, r in roles.items():
        if strong is None:
            break
        out[role] = {
            "cgroup_total": ratio(r.peak_bytes, strong.peak_bytes),
            "rss_total": ratio(r.peak_rss_bytes, strong.peak_rss_bytes),
            "cgroup_above_baseline": ratio(r.peak_bytes, strong.peak_bytes, baseline.peak_bytes),
            "rss_above_baseline": ratio(r.peak_rss_bytes, strong.peak_rss_bytes, baseline.rss_bytes),
            "accounting_above_runtime": ratio(r.accounting_bytes, strong.accounting_bytes, runtime_bytes),
        }
    return out


#: Verified training graphs, kept between runs (they depend on the architecture only).
GRAPH_DIR = Path.home() / ".cache" / "edgetrain" / "train-graphs"


def on_backend(specs: list[DeviceSpec], backend: str) -> tuple[list[DeviceSpec], dict[str, str]]:
    """Moderate and weak devices moved to `backend`: each budget keeps its margin over the training
    runtime but over that backend's runtime, and the planner picks the split (no forced splits).
    The strong device stays on torch: it is the reference of every ratio."""
    if backend == "torch":
        return specs, {s.id: "torch" for s in specs}
    from profiles.runtime import runtime_memory

    figures = runtime_memory()
    out, backends = [], {}
    for s in specs:
        if s.expect_role in ("moderate", "weak"):
            s = dataclasses.replace(s, budget_bytes=s.budget_bytes - figures.training + figures.for_backend(backend),
                                    force_split=None)
            backends[s.id] = backend
        else:
            backends[s.id] = "torch"
        out.append(s)
    return out, backends


async def measure(model: str, *, rounds: int, data_root: str | None, limit_per_device: int | None, per_role: int,
                  extra_bytes: int, eval_limit: int, console: Console, backend: str = "torch") -> dict:
    fleet = load_fleet(CASES[model])
    specs, backends = on_backend(pick(fleet, per_role, extra_bytes), backend)
    limit = None if limit_per_device is None else limit_per_device * fleet.num_devices
    samples = shard_sizes(fleet, specs, data_root, limit)
    before = idle_baseline(fleet.emulation.memory_cap)
    with tempfile.TemporaryDirectory() as tmp:
        config = server_config(fleet, rounds=rounds, store_dir=Path(tmp) / "store", data_root=data_root, deadline_s=600)
        # Memory is measured, not accuracy: without validation before commit a round whose model
        # diverges (ResNet20 at the fleet's lr 0.4 on 256 samples does) is not retried three times,
        # and the norm bound's reference update would only add server work.
        config = dataclasses.replace(config, min_devices=len(specs), fraction=1.0, wait_devices_s=600,
                                     eval_limit=eval_limit, train_graph_dir=GRAPH_DIR, max_loss_rise=0.0,
                                     norm_bound=0.0)

        def on_event(kind: str, data: dict) -> None:
            if kind == "round_end":
                console.print(f"  {model} round {data.get('round')} done")
            elif kind == "emulator:exit" and data.get("ended") not in ("finished", "stopped"):
                console.print(f"  [yellow]{data['device']}: {data['ended']} by {data.get('killed_by')}[/]")

        run = await run_fleet(fleet, config, specs=specs, data_root=data_root, data_limit=limit, on_event=on_event,
                              stderr_dir=Path(tmp) / "logs", backends=backends)
    after = idle_baseline(fleet.emulation.memory_cap)
    # The two idle processes bracket the run; the smaller is the runtime's own charge.
    cgroup = [b.peak_bytes for b in (before, after) if b.peak_bytes is not None]
    baseline = Baseline(before.mechanism, min(cgroup) if cgroup else None, min(before.rss_bytes, after.rss_bytes))
    from profiles.runtime import runtime_memory

    runtime = runtime_memory().training
    roles = role_peaks(model, fleet, run, samples, fleet.training.batch_size, runtime,
                       runtime_memory().for_backend("onnxruntime"))
    chunks = {d.expect_role: next((e.get("chunks") for e in d.events if e.get("event") == "welcome"), None)
              for d in run.devices}
    return {
        "fleet": fleet.name, "backend": backend, "dataset": fleet.dataset, "rounds": rounds, "devices": len(specs),
        "shard_of": fleet.num_devices, "samples_limit": limit, "extra_budget_bytes": extra_bytes,
        "baseline": dataclasses.asdict(baseline),
        "baseline_runs": [dataclasses.asdict(before), dataclasses.asdict(after)],
        "roles": {k: dataclasses.asdict(v) for k, v in roles.items()},
        "ratios": ratios(roles, baseline, runtime), "runtime_training_bytes": runtime,
        "paper_capacity": PAPER_CAPACITY[model],
        "frozen_chunks": chunks,
        "accuracy": [r.get("accuracy") for r in run.history],
    }


def _mib(v: int | None) -> str:
    return "-" if v is None else f"{v / MiB:.0f}"


def _r(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def print_results(console: Console, results: dict[str, dict]) -> None:
    table = Table(title="peak memory per role under hard caps (ratios: role / strong torch device)")
    for col in ("model", "role", "backend", "torch loaded", "split", "samples", "budget MiB", "cgroup peak MiB",
                "RSS peak MiB", "total (cg / RSS)", "above baseline (cg / RSS)", "ms/step", "accounting", "paper C",
                "status"):
        table.add_column(col, justify="left" if col in ("model", "role", "backend", "status") else "right")
    for key, res in results.items():
        model = res.get("model", key)
        b = res["baseline"]
        for role, r in res["roles"].items():
            q = res["ratios"].get(role, {})
            table.add_row(model, role, r.get("backend", "torch"), {None: "-", True: "yes", False: "no"}[r.get("torch_loaded")],
                          str(r["split"]), str(r["samples"]), _mib(r["budget_bytes"]),
                          _mib(r["peak_bytes"]), _mib(r["peak_rss_bytes"]),
                          f"{_r(q.get('cgroup_total'))} / {_r(q.get('rss_total'))}",
                          f"{_r(q.get('cgroup_above_baseline'))} / {_r(q.get('rss_above_baseline'))}",
                          "-" if r.get("step_s") is None else f"{1000 * r['step_s']:.0f}",
                          f"{r['accounting_capacity']:.2f}", f"{res['paper_capacity'][role]:.2f}", r["status"])
        table.add_row(model, "idle process (torch)", "", "", "", "", "", _mib(b["peak_bytes"]), _mib(b["rss_bytes"]),
                      "", "", "", "", "", b["mechanism"])
    console.print(table)


def device_class_splits(models: list[str]) -> list[dict]:
    """Per device class in profiles/devices and model: the planner's split on each backend (None:
    nothing fits). ONNX Runtime splits exclude graphs the export check refuses (exported and verified
    into GRAPH_DIR on first use)."""
    from edge_sdk.models.zoo import build_model
    from exporters.train_export import TrainGraphCache, train_graph_refusal
    from profiles.accounting import measure_model
    from profiles.devices import device_classes
    from profiles.planner import PlanError, plan_for_device

    cache = TrainGraphCache(GRAPH_DIR)
    rows = []
    for model in models:
        # The server's weights (seed 0): the export check compares with torch on the model's own
        # weights, and ResNet20's stem passes it with some initialisations and fails with others.
        net = build_model(model, seed=0)
        cost = measure_model(net)
        graphs = [k for k in range(len(net)) if train_graph_refusal(net, k) is None and cache.known_refusal(net, k) is None]
        for device in device_classes():
            row: dict = {"model": model, "device_class": device.name, "budget_bytes": device.budget_bytes}
            for backend in ("torch", "onnxruntime"):
                row[backend] = None
                while True:  # as the server plans: a split whose graph fails the export check is dropped
                    try:
                        plan = plan_for_device(cost, device, backends=(backend,), graph_splits=graphs)
                    except PlanError:
                        break
                    if backend == "onnxruntime" and cache.refusal(net, plan.split) is not None:
                        graphs.remove(plan.split)
                        continue
                    row[backend] = {"split": plan.split, "role": plan.role, "footprint_bytes": plan.footprint_bytes}
                    break
            rows.append(row)
    return rows


def print_splits(console: Console, rows: list[dict]) -> None:
    table = Table(title="the planner's split per device class and backend (batch 32)")
    for col in ("model", "device class", "budget MiB", "torch split", "onnxruntime split"):
        table.add_column(col, justify="left" if col in ("model", "device class") else "right")
    for r in rows:
        def cell(p: dict | None) -> str:
            return "does not fit" if p is None else f"{p['split']} ({p['role']})"
        table.add_row(r["model"], r["device_class"], _mib(r["budget_bytes"]), cell(r["torch"]), cell(r["onnxruntime"]))
    console.print(table)


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--models", default="leaf_cnn,resnet20", help="comma-separated: leaf_cnn, resnet20")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--per-role", type=int, default=1, help="devices per role")
    ap.add_argument("--cifar-limit", type=int, default=256, help="CIFAR-10 samples per device (fleet-wide subset)")
    ap.add_argument("--eval-limit", type=int, default=500, help="test samples the server evaluates per round")
    ap.add_argument("--extra-budget", type=float, default=0.0,
                    help="MiB added to every budget, to measure roles whose fleet budget is too tight")
    ap.add_argument("--backends", default="torch,onnxruntime",
                    help="comma-separated: the moderate and weak devices' backends, one run each")
    ap.add_argument("--splits-only", action="store_true", help="only the device-class table, into --out")


def splits_only(ctx: Context, models: list[str]) -> dict:
    """The device-class table recomputed into an existing results file (its runs kept)."""
    saved = json.loads(ctx.out.read_text())
    runs = saved["runs"] if saved.get("schema") == SCHEMA else [{"key": k, **v} for k, v in saved["models"].items()]
    splits = device_class_splits(models)
    print_splits(Console(), splits)
    return ctx.write(runs, {**report_of(saved), "device_class_splits": splits} if saved.get("schema") == SCHEMA
                     else {"device_class_splits": splits})


def run(ctx: Context) -> dict:
    args, ap = ctx.args, ctx.parser
    models = parse_list(args.models)
    unknown = sorted(set(models) - set(CASES))
    if unknown or args.rounds < 1 or args.per_role < 1:
        ap.error(f"unknown models {unknown}; choose from {sorted(CASES)}" if unknown else "rounds and per-role must be >= 1")
    from edge_sdk.data import DatasetUnavailable, data_root

    if args.splits_only:
        return splits_only(ctx, models)
    console = Console()
    root = data_root(args.data_root)
    root = None if root is None else str(root)
    results = {}
    backends = parse_list(args.backends)
    if set(backends) - {"torch", "onnxruntime"} or not backends:
        ap.error("--backends: torch and/or onnxruntime")
    for model in models:
        for backend in backends:
            console.print(f"[bold]{model}[/] ({backend}): fleet {CASES[model]}, {args.rounds} rounds, "
                          f"{args.per_role} device(s) per role")
            try:
                res = asyncio.run(measure(
                    model, rounds=args.rounds, data_root=root,
                    limit_per_device=args.cifar_limit if model == "resnet20" else None, per_role=args.per_role,
                    extra_bytes=int(args.extra_budget * MiB) if backend == "torch" else 0,
                    eval_limit=args.eval_limit, console=console, backend=backend))
            except DatasetUnavailable as e:
                console.print(f"[yellow]{model} skipped: {e}[/]")
                break
            results[model if backend == "torch" else f"{model}/{backend}"] = {"model": model, **res}
    if not results:
        sys.exit("no dataset available: nothing measured")
    print_results(console, results)
    for key, res in results.items():
        w = res["ratios"].get("weak", {})
        console.print(f"{key}: weak/strong total RSS {_r(w.get('rss_total'))}, above the idle process "
                      f"{_r(w.get('rss_above_baseline'))}; paper capacity {res['paper_capacity']['weak']:.2f}")
    splits = device_class_splits(models)
    print_splits(console, splits)
    return ctx.write([{"key": k, **v} for k, v in results.items()], {"device_class_splits": splits})


CASE = Case("memory_ratio", __doc__, run, arguments=arguments, data_root=True,
            quick={"models": "leaf_cnn", "rounds": 1, "backends": "torch", "eval_limit": 100})


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
