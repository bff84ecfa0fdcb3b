"""The transformer language model beside the character LSTM on Tiny Shakespeare's speaking roles.

One fleet of devices, each holding whole speaking roles (LEAF's Shakespeare clients), and the same
device budgets for every model; held-out roles (every fifth role, none of which any device holds)
score the global model: next-character accuracy and perplexity (exp of the mean cross-entropy).

Fleets (``--cases``):

- ``allstrong``: every device trains the whole model;
- ``75weak``: EmbracingFL's 75%-weak fleet: a quarter of the devices strong, the rest at one weak
  budget, the one at which ``char_transformer@rank=8`` is planned to train all its transformer
  blocks through their adapters (split 1). At that budget ``char_transformer`` (no adapters) is
  planned to train its last blocks whole, so the two transformer rows compare "weak on full last
  blocks" with "weak on adapters"; ``char_lstm`` gets what the same budget buys it.

Models: ``char_lstm`` (``allstrong`` and ``75weak``), ``char_transformer`` (both) and
``char_transformer@rank=8`` (``75weak``: its strong devices train weights and adapters). EmbracingFL's
per-entry averaging throughout (FedAvg where every device is strong). Every run goes through the real
orchestrator (``Orchestrator``) and real device clients (``DeviceClient``, torch backend) over
websockets on 127.0.0.1 in this process; budgets steer the planner (no memory caps here: the
per-runtime memory is ``--parts runtimes``).

Reported per (model, fleet), over ``--seeds`` (initial model and mini-batches; the roles are fixed):
accuracy and perplexity after ``--rounds`` with 95% bootstrap intervals over seeds and held-out
samples (``bench/intervals.py``), each device role's plan (split, whole or adapters), and bytes per
device-round (down and up, from the server's per-device counts).

``--parts runtimes``: each role's tail (strong: split 0; weak whole: the plain model's weak split;
weak through adapters) trained in fresh processes: s per local step and peak resident memory of the
Python torch device, and (through ``bench/js_devices.py --parts speed``) the Python ONNX Runtime
device, the Node device on onnxruntime-node and -web, and a headless Chromium tab.

``--parts pilot``: each model trained without federation (every device's windows pooled, 600 steps)
at the learning rates tried; the table's rates are the best of them.

Usage: ``python bench/lm_roles.py [--seeds 0,1,2] [--rounds 20] [--parts pilot,accuracy,runtimes]``;
writes ``bench/results/lm_roles.json`` (after every run: an interrupted bench keeps what it did) and
``bench/results/lm_roles.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import results as results_io  # noqa: E402
from bench.harness.case import Case, Context  # noqa: E402
from bench.intervals import interval, paired_draws  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ADAPTED = "char_transformer@rank=8"
#: (model, fleet) rows of the accuracy table, in the order printed.
ROWS = (("char_lstm", "allstrong"), ("char_lstm", "75weak"), ("char_transformer", "allstrong"),
        ("char_transformer", "75weak"), (ADAPTED, "75weak"))
#: Learning rates (momentum 0.9): the fleet file's for char_lstm; the transformer's from a pilot
#: (bench/results/lm_roles.json, "pilot").
LR = {"char_lstm": 0.5, "char_transformer": 0.01}


@dataclass(frozen=True)
class Fleet:
    """Each device's windows, the held-out roles' windows, and the weak budget."""

    devices: list[tuple[np.ndarray, np.ndarray]]
    test_x: np.ndarray
    test_y: np.ndarray
    weak_budget: int


def load_fleet(root: str, devices: int, samples: int, test_samples: int) -> tuple[list, np.ndarray, np.ndarray]:
    """Roles j with j % 5 == 4 held out; the others dealt round-robin to the devices, each keeping a
    fixed random ``samples`` of its windows (every 8th character, 40 of context)."""
    from edge_sdk.data.shakespeare import SEQ_LEN, STRIDE, load_roles, windows

    roles, vocab = load_roles(root)
    rng = np.random.default_rng(12345)

    def pooled(group: list) -> tuple[np.ndarray, np.ndarray]:
        parts = [windows(vocab.encode(r.text), SEQ_LEN, STRIDE) for r in group]
        x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        keep = np.sort(rng.permutation(len(x))[:samples if group is not held else test_samples])
        return np.ascontiguousarray(x[keep]), y[keep]

    held = [r for j, r in enumerate(roles) if j % 5 == 4]
    train = [r for j, r in enumerate(roles) if j % 5 != 4]
    shares = [pooled(train[d::devices]) for d in range(devices)]
    test_x, test_y = pooled(held)
    return shares, test_x, test_y


def weak_budget(samples: int, batch: int) -> int:
    """The least budget at which the adapted transformer is planned through adapters at split 1."""
    from edge_sdk.models import build_model
    from emulator.localfleet import min_budget_for_split
    from profiles.accounting import measure_model

    return min_budget_for_split(measure_model(build_model(ADAPTED, seed=None)), 1, batch, samples)


def plans(budget: int, samples: int, batch: int) -> dict[str, dict]:
    """What each model is planned at ``budget`` (torch devices): split, role, whole or adapters."""
    from edge_sdk.models import build_model
    from profiles.accounting import measure_model
    from profiles.planner import plan_split

    out = {}
    for model in dict.fromkeys(m for m, _ in ROWS):
        plan = plan_split(measure_model(build_model(model, seed=None)), budget, batch, local_samples=samples)
        out[model] = {"split": plan.split, "role": plan.role, "adapters": plan.adapters,
                      "trainable_params": plan.trainable_params, "footprint_bytes": plan.footprint_bytes}
    return out


class HeldOut:
    """A global state's per-sample results on the held-out roles: correctness and cross-entropy."""

    def __init__(self, model: str, x: np.ndarray, y: np.ndarray, batch: int = 256) -> None:
        self.model, self.x, self.y, self.batch = model, x, y, batch
        self._net = None

    def __call__(self, state: dict) -> dict:
        import torch

        from edge_sdk.models import build_model

        if self._net is None:
            self._net = build_model(self.model, seed=0)
        self._net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
        self._net.eval()
        with torch.no_grad():
            logits = torch.cat([self._net(torch.from_numpy(self.x[i:i + self.batch]))
                                for i in range(0, len(self.x), self.batch)])
            losses = torch.nn.functional.cross_entropy(logits, torch.from_numpy(self.y), reduction="none").numpy()
        correct = logits.argmax(1).numpy() == self.y
        return {"accuracy": float(correct.mean()), "perplexity": float(math.exp(losses.mean())),
                "correct": "".join("1" if c else "0" for c in correct), "losses": [round(float(v), 5) for v in losses]}


def pilot(model: str, lr: float, steps: int, fleet: Fleet, seed: int = 0) -> dict:
    """``steps`` of momentum SGD (0.9, batch 32) on every device's windows pooled, in one process:
    how a learning rate does without federation (it chose :data:`LR`'s transformer rate)."""
    import torch

    from edge_sdk.models import build_model

    torch.set_num_threads(1)
    x = np.concatenate([d[0] for d in fleet.devices])
    y = np.concatenate([d[1] for d in fleet.devices])
    rng = np.random.default_rng(seed)
    net = build_model(model, seed=seed).train()
    params = list(net.parameters())
    momentum = [torch.zeros_like(p) for p in params]
    for _ in range(steps):
        idx = rng.integers(0, len(x), 32)
        loss = net.loss(net(torch.from_numpy(x[idx])), torch.from_numpy(y[idx]))
        for p in params:
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p, b in zip(params, momentum):
                b.mul_(0.9).add_(p.grad)
                p.sub_(lr * b)
    scored = HeldOut(model, fleet.test_x, fleet.test_y)({k: v.detach().numpy() for k, v in net.state_dict().items()})
    return {"model": model, "lr": lr, "steps": steps, "accuracy": scored["accuracy"], "perplexity": scored["perplexity"]}


def budgets(kind: str, devices: int, weak: int) -> list[int]:
    """Per-device budgets: every device strong, or a quarter strong and the rest at ``weak``."""
    strong = 4 << 30
    return [strong] * devices if kind == "allstrong" else [strong if d < devices // 4 else weak for d in range(devices)]


async def run_one(model: str, kind: str, seed: int, fleet: Fleet, args: argparse.Namespace, store: Path) -> dict:
    """One run through the real server and devices; the held-out score every ``eval_every`` rounds."""
    import torch

    from edge_sdk.client import DeviceClient
    from edge_sdk.settings import DeviceSettings
    from bench.prioritized_runner import in_process_server
    from orchestrator.config import ServerConfig

    torch.set_num_threads(1)
    base = model.partition("@")[0]
    config = ServerConfig(model=model, strategy="fedavg" if kind == "allstrong" else "embracingfl",
                          strategy_options={"max_weight_share": 1.0}, norm_bound=0.0, max_loss_rise=0.0,
                          direction_trust=False,
                          rounds=args.rounds, min_devices=len(fleet.devices), local_steps=args.local_steps,
                          batch_size=args.batch, lr=LR[base], momentum=0.9, weight_decay=0.0, seed=seed,
                          store_dir=store, eval_every=0, deadline_s=3600)
    score = HeldOut(model, fleet.test_x, fleet.test_y)
    curve: list[dict] = []
    orch = None

    def on_event(event: str, data: dict) -> None:
        if event == "round_end" and orch is not None and (data["round"] % args.eval_every == 0
                                                          or data["round"] == args.rounds):
            result = score(orch.global_state)
            curve.append({"round": data["round"], "accuracy": result["accuracy"], "perplexity": result["perplexity"]})
            curve[-1]["detail"] = {k: result[k] for k in ("correct", "losses")} if data["round"] == args.rounds else None

    started = time.monotonic()
    orch, server, url = await in_process_server(config, on_event)
    clients = [DeviceClient(DeviceSettings(server=url, device_id=f"d{i}", budget_bytes=b, backend="torch"), x, y).run()
               for i, ((x, y), b) in enumerate(zip(fleet.devices, budgets(kind, len(fleet.devices), fleet.weak_budget)))]
    history = (await asyncio.gather(server, *clients))[0]
    return {"model": model, "fleet": kind, "seed": seed, "seconds": time.monotonic() - started, "curve": curve,
            "final": {k: curve[-1][k] for k in ("accuracy", "perplexity")}, "detail": curve[-1]["detail"],
            "bytes": device_round_bytes(history, store)}


def device_round_bytes(history: list[dict], store: Path) -> dict:
    """Mean bytes per device-round, down (payloads fetched) and up (its update), by planned role."""
    from orchestrator.store import Store

    with Store.open_readonly(store) as journal:
        role = {d["device_id"]: ("adapters" if d["plan"].get("adapters") else d["plan"]["role"]) for d in journal.devices.all()}
    sums: dict[str, list[float]] = {}
    for h in history:
        for device, b in (h.get("bytes") or {}).items():
            row = sums.setdefault(role.get(device, "?"), [0.0, 0.0, 0])
            row[0] += sum(b.get("down", {}).values())
            row[1] += sum(b.get("up", {}).values())
            row[2] += 1
    return {r: {"down": d / n, "up": u / n, "device_rounds": n} for r, (d, u, n) in sums.items()}


def summarise(runs: list[dict]) -> list[dict]:
    """Per row: mean accuracy and perplexity over the seeds every row has, with paired intervals."""
    from bench.intervals import accuracy_of

    by_row = {(m, k): {r["seed"]: r for r in runs if (r["model"], r["fleet"]) == (m, k)} for m, k in ROWS}
    seeds = sorted(set.intersection(*(set(v) for v in by_row.values() if v)) if any(by_row.values()) else set())
    present = {row: v for row, v in by_row.items() if v and seeds}
    if not present:
        return []
    correct = {row: [np.array([c == "1" for c in v[s]["detail"]["correct"]]) for s in seeds] for row, v in present.items()}
    losses = {row: [np.array(v[s]["detail"]["losses"]) for s in seeds] for row, v in present.items()}
    same = ["held-out roles"] * len(seeds)  # one held-out set: every row resampled alike (paired)
    acc = paired_draws(correct, same, accuracy_of)
    ppl = paired_draws(losses, same, lambda l, c: np.exp(c @ l / c.sum(axis=1)))
    out = []
    for row, v in present.items():
        a = float(np.mean([v[s]["final"]["accuracy"] for s in seeds]))
        p = float(np.mean([math.log(v[s]["final"]["perplexity"]) for s in seeds]))
        bytes_rows: dict[str, list[dict]] = {}
        for s in seeds:
            for role, b in v[s]["bytes"].items():
                bytes_rows.setdefault(role, []).append(b)
        out.append({"model": row[0], "fleet": row[1], "seeds": seeds, "accuracy": interval(acc[row], a).__dict__,
                    "perplexity": interval(ppl[row], math.exp(p)).__dict__,
                    "bytes": {role: {k: float(np.mean([b[k] for b in bs])) for k in ("down", "up")}
                              for role, bs in bytes_rows.items()},
                    "seconds": float(np.mean([v[s]["seconds"] for s in seeds]))})
    return out


def _ci(cell: dict, digits: int) -> str:
    return f"{cell['estimate']:.{digits}f} [{cell['low']:.{digits}f}, {cell['high']:.{digits}f}]"


def markdown(results: dict) -> str:
    """The accuracy table, then the runtimes table."""
    s = results["settings"]
    lines = [f"Held-out roles: {s['test_samples']} windows of the roles no device holds; {s['devices']} devices of "
             f"{s['samples']} windows each; {s['rounds']} rounds of {s['local_steps']} local steps at batch "
             f"{s['batch']}; weak budget {results['weak_budget'] / 2**20:.1f} MiB (torch devices). Mean over seeds "
             f"{results['summary'][0]['seeds'] if results['summary'] else []}, 95% intervals over seeds and held-out "
             "windows.", "",
             "| model | fleet | weak devices' plan | accuracy | perplexity | KB down / up per device-round (role) | s per run |",
             "|---|---|---|---|---|---|---|"]
    for row in results["summary"]:
        plan = results["plans"][row["model"]]
        weak = "-" if row["fleet"] == "allstrong" else (
            f"split {plan['split']} ({plan['role']}), " + ("through adapters" if plan["adapters"] else "whole")
            + f", {plan['trainable_params']:,} trained")
        traffic = "; ".join(f"{b['down'] / 1e3:.0f} / {b['up'] / 1e3:.0f} ({role})" for role, b in sorted(row["bytes"].items()))
        lines.append(f"| `{row['model']}` | {row['fleet']} | {weak} | {_ci(row['accuracy'], 3)} | "
                     f"{_ci(row['perplexity'], 2)} | {traffic} | {row['seconds']:.0f} |")
    if results.get("runtimes"):
        lines += ["", "| role (tail) | runtime | s per local step | peak memory (MiB) |", "|---|---|---|---|"]
        for role, rows in results["runtimes"].items():
            for r in rows:
                lines.append(f"| {role} | {r['runtime']} | {r['msPerStep'] / 1e3:.3f} | {r['peakRss'] / 2**20:.0f} |")
    return "\n".join(lines) + "\n"


_TORCH_STEP = r"""
import json, re, sys, time
import numpy as np
from pathlib import Path
from edge_sdk.forward import multi_step_forward
from edge_sdk.trainer import TrainConfig, build_tail, load_tail_state, train_tail
folder, name, split, adapters, steps, warm = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", \
    int(sys.argv[5]), int(sys.argv[6])
hwm = lambda: int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024
data, state = np.load(folder / "data.npz"), dict(np.load(folder / "state.npz"))
x, y = data["x"], data["y"]
if (folder / "chunk.onnx").exists():
    x = multi_step_forward([(folder / "chunk.onnx").read_bytes()], x, batch_size=32).array
def rounds(steps):
    tail = build_tail(name, split, adapters=adapters)
    load_tail_state(tail, split, state)
    t0 = time.perf_counter()
    train_tail(tail, split, x, y, TrainConfig(local_steps=steps, batch_size=32, lr=0.05, seed=1, eval_samples=32), state)
    return (time.perf_counter() - t0) * 1000 / steps
rounds(warm)
print(json.dumps({"runtime": "python torch", "msPerStep": rounds(steps), "peakRss": hwm()}))
"""


def torch_row(case: str, folder: Path, steps: int, warmup: int, samples: int) -> dict:
    """s per local step and peak memory of a torch device training ``case``'s tail, in a fresh process
    (the frozen chunk exported here, run there in ONNX Runtime, as a device does)."""
    import torch

    from edge_sdk.models import build_model
    from exporters.bundle import tail_arrays
    from exporters.onnx_export import export_chunk

    name, split, how = (case.split(":") + [""])[:3]
    model = build_model(name, seed=0)
    folder.mkdir(parents=True, exist_ok=True)
    if int(split):
        (folder / "chunk.onnx").write_bytes(export_chunk(model, 0, int(split)))
    np.savez(folder / "state.npz", **tail_arrays(model, int(split)))
    np.savez(folder / "data.npz", x=model.sample_input(samples, generator=torch.Generator().manual_seed(0)).numpy(),
             y=np.random.default_rng(0).integers(0, model.num_outputs, samples))
    out = subprocess.run([sys.executable, "-c", _TORCH_STEP, str(folder), name, split, "1" if how else "0", str(steps),
                          str(warmup)], check=True, capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def runtimes(cases: dict[str, str], args: argparse.Namespace, tmp: Path) -> dict[str, list[dict]]:
    """Each role's tail in every runtime: the torch device here, the others through bench/js_devices.py."""
    out: dict[str, list[dict]] = {}
    for role, case in cases.items():
        rows = [torch_row(case, tmp / role, args.runtime_steps, 5, 256)]
        report = tmp / f"{role}.json"
        subprocess.run([sys.executable, str(ROOT / "bench" / "js_devices.py"), "--parts", "speed", "--case", case,
                        "--steps", str(args.runtime_steps), "--warmup", "5", "--repeats", "1", "--samples", "256",
                        "--batch", str(args.batch), "--out", str(report)], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
        rows += json.loads(report.read_text())["speed"]["rows"]
        out[f"{role} ({case})"] = [{k: r[k] for k in ("runtime", "msPerStep", "peakRss")} for r in rows]
        print(role, case, [(r["runtime"], round(r["msPerStep"]), r["peakRss"] >> 20) for r in rows], flush=True)
    return out


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--samples", type=int, default=1500, help="windows per device")
    ap.add_argument("--test-samples", type=int, default=3000, help="held-out windows")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--rows", default=",".join(f"{m}/{k}" for m, k in ROWS), help="model/fleet rows to run")
    ap.add_argument("--parts", default="accuracy,runtimes")
    ap.add_argument("--runtime-steps", type=int, default=20)
    ap.add_argument("--pilot-steps", type=int, default=600, help="--parts pilot: steps per learning rate")


def run(ctx: Context) -> dict:
    """Every (model, fleet, seed) run not already in the results file, then the parts asked for;
    the results file rewritten after every run, so an interrupted bench keeps what it did."""
    args = ctx.args
    args.data_root = ctx.data_root
    before = results_io.load(ctx.out) if ctx.out.exists() else {}
    runs: list[dict] = results_io.runs_of(before)
    report = {k: v for k, v in results_io.report_of(before).items() if k != "runs"} if before else {}
    shares, test_x, test_y = load_fleet(args.data_root, args.devices, args.samples, args.test_samples)
    weak = weak_budget(args.samples, args.batch)
    fleet = Fleet(shares, test_x, test_y, weak)
    report.update({"weak_budget": weak, "plans": plans(weak, args.samples, args.batch),
                   "settings": {k: v for k, v in vars(args).items() if k not in ("out", "data_root")} | {"lr": LR}})
    import tempfile

    with tempfile.TemporaryDirectory(prefix="edgetrain-lm-") as tmp:
        if "pilot" in args.parts:  # the learning rates tried for each model, without federation
            report["pilot"] = [pilot(m, lr, args.pilot_steps, fleet) for m, lrs in
                               (("char_lstm", (0.5,)), ("char_transformer", (0.3, 0.1, 0.03, 0.01))) for lr in lrs]
            print(json.dumps(report["pilot"]), flush=True)
        if "accuracy" in args.parts:
            wanted = [tuple(r.split("/")) for r in args.rows.split(",")]
            for seed in ctx.seeds:
                for model, kind in wanted:
                    if any((r["model"], r["fleet"], r["seed"]) == (model, kind, seed) for r in runs):
                        continue
                    one = asyncio.run(run_one(model, kind, seed, fleet, args, Path(tmp) / f"{model}-{kind}-{seed}"))
                    runs.append(one)
                    print(f"{model:26s} {kind:9s} seed {seed}: accuracy {one['final']['accuracy']:.3f} perplexity "
                          f"{one['final']['perplexity']:.2f} ({one['seconds']:.0f} s)", flush=True)
                    report["summary"] = summarise(runs)
                    ctx.write(runs, report, quiet=True)
        if "runtimes" in args.parts:
            full = report["plans"]["char_transformer"]["split"]
            adapted = report["plans"][ADAPTED]
            cases = {"strong": "char_transformer:0", "weak, whole blocks": f"char_transformer:{full}",
                     "weak, adapters": f"{ADAPTED}:{adapted['split']}:adapters"}
            report["runtimes"] = runtimes(cases, args, Path(tmp))
    report["summary"] = summarise(runs)
    doc = ctx.write(runs, report)
    ctx.out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return doc


CASE = Case("lm_roles", __doc__, run, arguments=arguments, seeds="0,1,2", data_root=True,
            quick={"rounds": 2, "seeds": "0", "rows": "char_lstm/allstrong", "parts": "accuracy", "samples": 64,
                   "test_samples": 128, "devices": 2, "eval_every": 1})


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
