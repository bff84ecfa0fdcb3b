"""FedAvg against FedSubAvg on MovieLens rating classification (hot-and-cold FedSubAvg, Section 5).

The paper's setting (Section 5.1, appendix D.3/D.4) on MovieLens latest-small: ratings 4-5 are
positive, the rest negative; each user's latest 20% of ratings are the test set
(``load_dataset("movielens")``); one device per user (610 devices), K = 50 devices per round,
batch 5, 10 local steps of plain SGD, sample-weighted aggregation (appendix D.4).

Model: the paper's logistic regression over sparse one-hot features. latest-small has no user
gender, age or occupation, so the features are what it has: user id, movie id and the movie's genres
(multi-hot, ``movielens_genres``); each is a table of one weight per row, plus a dense bias:

    p(y = 1 | u, m) = sigmoid(b + w_user[u] + w_item[m] + sum_{g in genres(m)} w_genre[g])

A device's submodel is its own user row, the rows of the movies it rated and of their genres. The
server side is the real strategy: every round runs ``FedSubAvg.configure`` (heat from the devices'
declared rows, K sampled, row selections), ``on_report`` with each device's ``RowSparse`` deltas,
and ``aggregate``. FedAvg is the same strategy with ``correction=False``: the row update is
``sum_i w_i dx_{i,m} / sum_{i in C_r} w_i``, exactly FedAvg on full models, because plain SGD leaves
the rows a device does not touch unchanged (zero delta). Devices train in this process with numpy
(the update rule of Algorithm 1, lines 15-18), not over websockets: the run is about the
optimisation, and a round costs milliseconds.

Target: the minimum train loss centralised SGD reaches in the same number of rounds (batch K x 5 =
250, 10 iterations per round, the same learning-rate grid), as in the paper. Rounds to the target
are counted per algorithm at its best learning rate (median over seeds). Train loss is measured on
all training ratings every round; test accuracy and loss on the held-out ratings.

Writes ``bench/results/fedsubavg_movielens.json`` and ``.png``.

``--emulate``: the same comparison through the real orchestrator instead: a shipped fleet of 610
user devices (natural partition, K = 50, batch 5, 10 local steps) run by ``edgetrain emulate``'s
lightweight machinery (:func:`emulator.runner.run_emulation`, the fleet's lightweight mode: real
``DeviceClient`` devices over websockets in a few worker processes, row selections and row-sparse
uploads on the wire). ``--fleet movielens-lr-fedsubavg``: the LR above as the zoo model
``movielens_lr`` on the ``movielens_lr`` dataset (the ``paper`` features); the default
``movielens-fedsubavg``: the zoo's embedding recommender (rating regression). The server measures
test loss (BCE, or MSE) per round, not train loss; FedAvg is FedSubAvg with ``correction=False`` as
above. Writes ``bench/results/fedsubavg_movielens_emulated[_<fleet>].json``.

Usage: ``python bench/fedsubavg_movielens.py [--rounds 300] [--lrs 0.1,0.3,1] [--seeds 0,1] [--features paper|ids]``
       ``python bench/fedsubavg_movielens.py --emulate [--rounds 30] [--lrs 0.003,0.01]``
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, parse_list  # noqa: E402
from edge_sdk.data import load_dataset  # noqa: E402
from edge_sdk.data.datasets import movielens_genres  # noqa: E402
from edge_sdk.protocol import RowSparse  # noqa: E402
from orchestrator.rounds import RoundState  # noqa: E402
from orchestrator.strategies import DeviceInfo, DeviceReport, RoundContext  # noqa: E402
from orchestrator.strategies.fedsubavg import FedSubAvg  # noqa: E402

BIAS = "blocks.lr.bias"
FEATURE_SETS = ("paper", "ids")


@dataclass
class Data:
    """Samples as table rows: for each table an index matrix ``(n, c)`` (padded with the table's size,
    a row of weight 0), and the labels."""

    idx: dict[str, np.ndarray]
    y: np.ndarray
    user: np.ndarray  # whose rating: the device that holds the sample

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, rows: np.ndarray) -> Data:
        return Data({t: v[rows] for t, v in self.idx.items()}, self.y[rows], self.user[rows])


def load(features: str = "paper") -> tuple[Data, Data, dict[str, int]]:
    """MovieLens latest-small as one-hot feature tables (rating >= 4 is positive).

    ``paper``: the paper's structure (Section 5.1: gender, age, movie, gender x movie, age x movie,
    one-hot, into a logistic regression), as the ``movielens_lr`` dataset builds it: two per-user
    group features stand in for gender and age (latest-small has neither; see
    ``edge_sdk.data.datasets._movielens_lr``), the movie, and their crosses. The tables are the zoo
    model ``movielens_lr``'s. ``ids``: user id, movie id and the movie's genres (multi-hot): the user
    row is involved by exactly one device, the most extreme heat (N / K = 12 times the step under
    FedSubAvg's correction).
    """
    if features not in FEATURE_SETS:
        raise ValueError(f"features must be one of {FEATURE_SETS}")
    out = []
    if features == "paper":
        for split in ("train", "test"):
            d = load_dataset("movielens_lr", split=split)
            names = [f"blocks.lr.tables.{c}.weight" for c in d.info["columns"]]
            sizes = dict(zip(names, (int(r) for r in d.info["rows"])))
            out.append(Data({t: d.x[:, i : i + 1].astype(np.int64) for i, t in enumerate(names)},
                            d.y.astype(np.float64), d.groups.astype(np.int64)))
        return out[0], out[1], sizes
    genres, names = movielens_genres()
    pad = len(names)
    g = np.where(genres < 0, pad, genres)
    for split in ("train", "test"):
        d = load_dataset("movielens", split=split)
        u, m = d.x[:, 0].astype(np.int64), d.x[:, 1].astype(np.int64)
        out.append(Data({"blocks.lr.user": u[:, None], "blocks.lr.item": m[:, None], "blocks.lr.genre": g[m]},
                        (d.y >= 4).astype(np.float64), u))
    return out[0], out[1], {"blocks.lr.user": int(d.info["num_users"]), "blocks.lr.item": genres.shape[0],
                            "blocks.lr.genre": pad}


def logits(state: dict[str, np.ndarray], d: Data) -> np.ndarray:
    z = np.full(len(d), float(state[BIAS][0]))
    for t, ix in d.idx.items():
        w = np.concatenate([state[t][:, 0].astype(np.float64), [0.0]])  # the pad row is 0
        z += w[ix].sum(axis=1)
    return z


def bce(z: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def sgd_steps(w: dict[str, np.ndarray], d: Data, steps: int, batch: int, lr: float, rng: np.random.Generator) -> None:
    """Plain SGD on the logistic loss, in place on ``w`` (float64 tables indexed by global row)."""
    for _ in range(steps):
        b = d.subset(rng.integers(0, len(d), size=batch))
        g = (1.0 / (1.0 + np.exp(-logits(w, b))) - b.y) / batch
        for t, ix in b.idx.items():
            gt = np.zeros(len(w[t]) + 1)
            np.add.at(gt, ix.ravel(), np.repeat(g, ix.shape[1]))
            w[t][:, 0] -= lr * gt[:-1]
        w[BIAS][0] -= lr * g.sum()


def initial_state(sizes: dict[str, int]) -> dict[str, np.ndarray]:
    return {**{t: np.zeros((n, 1), np.float32) for t, n in sizes.items()}, BIAS: np.zeros(1, np.float32)}


def device_rows(d: Data, sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """A device's index set (Algorithm 1, line 5): the rows of each table its samples touch."""
    return {t: np.unique(ix[ix < sizes[t]]) for t, ix in d.idx.items()}


def run_federated(train: Data, test: Data, sizes: dict[str, int], *, correction: bool, lr: float,
                  rounds: int, seed: int, k: int, batch: int, steps: int) -> dict[str, list[float]]:
    shards = {f"u{u:03d}": train.subset(np.flatnonzero(train.user == u)) for u in np.unique(train.user)}
    infos = {d: DeviceInfo(d, "strong", 0, len(s), rows=device_rows(s, sizes)) for d, s in shards.items()}
    strategy = FedSubAvg(k=k, weighting="samples", correction=correction)
    state = initial_state(sizes)
    hist: dict[str, list[float]] = {"train_loss": [], "test_loss": [], "test_acc": []}
    for r in range(1, rounds + 1):
        ctx = RoundContext(round=r, global_state=state, devices=infos, state=RoundState(r, deadline=1e18),
                           blocks=("lr",), seed=seed)
        for ins in strategy.configure(ctx):
            d, sel = ins.device_id, ins.selection
            # The device's submodel: only its rows (Algorithm 1, lines 13-14), trained locally (15-17).
            local = {t: np.zeros((n, 1)) for t, n in sizes.items()}
            for t in sizes:
                local[t][sel.rows[t]] = state[t][sel.rows[t]]
            local[BIAS] = state[BIAS].astype(np.float64)
            rng = np.random.default_rng([seed, r, int(d[1:])])
            sgd_steps(local, shards[d], steps, batch, lr, rng)
            tensors: dict[str, object] = {t: RowSparse(sel.rows[t], (local[t][sel.rows[t]] - state[t][sel.rows[t]])
                                                        .astype(np.float32), n) for t, n in sizes.items()}
            tensors[BIAS] = (local[BIAS] - state[BIAS]).astype(np.float32)  # line 18: the upload
            rep = DeviceReport(d, r, "train", "strong", infos[d].num_samples, (0, 1), {}, tensors, sel)
            ctx.state.issue(d, "train")
            strategy.on_report(rep, ctx)
        state = strategy.aggregate(ctx).state
        record(hist, state, train, test)
    return hist


def run_central(train: Data, test: Data, sizes: dict[str, int], *, lr: float, rounds: int, seed: int,
                batch: int, steps: int) -> dict[str, list[float]]:
    """CentralSGD (Section 5.1): batch K x 5 over all training data, the same steps per round."""
    w = {k: v.astype(np.float64) for k, v in initial_state(sizes).items()}
    rng = np.random.default_rng([seed, 99])
    hist: dict[str, list[float]] = {"train_loss": [], "test_loss": [], "test_acc": []}
    for _ in range(rounds):
        sgd_steps(w, train, steps, batch, lr, rng)
        record(hist, w, train, test)
    return hist


def record(hist: dict[str, list[float]], state: dict[str, np.ndarray], train: Data, test: Data) -> None:
    hist["train_loss"].append(bce(logits(state, train), train.y))
    zt = logits(state, test)
    hist["test_loss"].append(bce(zt, test.y))
    hist["test_acc"].append(float(np.mean((zt > 0) == (test.y > 0.5))))


def rounds_to(curve: list[float], target: float) -> int | None:
    hit = np.flatnonzero(np.asarray(curve) <= target)
    return int(hit[0]) + 1 if hit.size else None


def run_emulated(ctx: Context) -> dict:
    """FedAvg and FedSubAvg through the orchestrator and the lightweight emulator (see the module docstring)."""
    import asyncio
    import dataclasses
    import tempfile

    from emulator import load_fleet
    from emulator.runner import run_emulation
    from emulator.schedule import server_config

    args = ctx.args
    fleet = load_fleet(args.fleet)
    runs: list[dict[str, object]] = []
    for lr in args.lrs:
        for name in ("fedavg", "fedsubavg"):
            for seed in ctx.seeds:
                with tempfile.TemporaryDirectory(prefix="fedsubavg-emulated-") as tmp:
                    config = server_config(fleet, rounds=args.rounds, store_dir=Path(tmp) / "store", deadline_s=300)
                    config = dataclasses.replace(config, lr=lr, seed=seed, strategy_options={
                        **config.strategy_options, "correction": name == "fedsubavg"})
                    t0 = time.time()
                    run = asyncio.run(run_emulation(fleet, config, stderr_dir=Path(tmp) / "logs"))
                hist = run.history
                entry = {"algorithm": name, "lr": lr, "seed": seed,
                         "test_loss": [float(h.get("test_loss", np.nan)) for h in hist],
                         "accuracy": [float(h.get("accuracy", np.nan)) for h in hist],
                         "reported": [int(h["reported"]) for h in hist],
                         "round_wall_s": [float(h.get("round_wall_s", np.nan)) for h in hist],
                         "bytes_sent": int(sum(h.get("bytes_sent", 0) for h in hist)),
                         "seconds": time.time() - t0}
                runs.append(entry)
                print(f"  emulated {name:9s} lr={lr:<6g} seed={seed}: test loss {entry['test_loss'][-1]:.4f} "
                      f"(min {np.nanmin(entry['test_loss']):.4f}), reported/round "
                      f"{np.mean(entry['reported']):.1f} of 50 ({entry['seconds']:.0f} s)", flush=True)

    def mean_curve(name: str, lr: float) -> np.ndarray:
        return np.mean([r["test_loss"] for r in runs if r["algorithm"] == name and r["lr"] == lr], axis=0)

    names = ("fedavg", "fedsubavg")
    best = {name: min(args.lrs, key=lambda lr: float(np.nanmin(mean_curve(name, lr)))) for name in names}
    # Target: the best test loss (MSE for the recommender, BCE for the LR) FedAvg reaches at its best
    # learning rate in these rounds (the server measures no train loss).
    target = float(np.nanmin(mean_curve("fedavg", best["fedavg"])))
    summary = {name: {"lr": float(best[name]), "rounds_to_target": rounds_to(mean_curve(name, best[name]).tolist(), target),
                      "final_test_mse": float(mean_curve(name, best[name])[-1]),
                      "min_test_mse": float(np.nanmin(mean_curve(name, best[name])))} for name in names}
    print(f"target test loss (FedAvg's best): {target:.4f}")
    for name, s_ in summary.items():
        print(f"  {name:9s} best lr {s_['lr']:g}: rounds to target {s_['rounds_to_target']}, "
              f"final test loss {s_['final_test_mse']:.4f}")
    return ctx.write(runs, {"mode": "emulated", "fleet": fleet.name, "devices": fleet.num_devices,
                            "target_test_mse": target, "summary": summary})


def federated_runs(args: argparse.Namespace, seeds: list[int], train, test, sizes) -> list[dict]:
    """CentralSGD, FedAvg and FedSubAvg at every learning rate and seed: each run's curves."""
    runs = []
    for lr in args.lrs:
        for name in ("central", "fedavg", "fedsubavg"):
            for seed in seeds:
                t0 = time.time()
                if name == "central":
                    h = run_central(train, test, sizes, lr=lr, rounds=args.rounds, seed=seed,
                                    batch=args.k * args.batch, steps=args.steps)
                else:
                    h = run_federated(train, test, sizes, correction=name == "fedsubavg", lr=lr, rounds=args.rounds,
                                      seed=seed, k=args.k, batch=args.batch, steps=args.steps)
                runs.append({"algorithm": name, "lr": lr, "seed": seed, **h, "seconds": time.time() - t0})
                print(f"  {name:9s} lr={lr:<5g} seed={seed}: final train loss {h['train_loss'][-1]:.4f}, "
                      f"min {min(h['train_loss']):.4f}, test acc {h['test_acc'][-1]:.4f} ({time.time() - t0:.0f} s)")
    return runs


def best_rates(runs: list[dict], lrs: list[float], target: float) -> dict[str, dict[str, object]]:
    """Per algorithm, its learning rate of the fewest median rounds to ``target`` (then the lowest final loss)."""
    summary: dict[str, dict[str, object]] = {}
    for name in ("central", "fedavg", "fedsubavg"):
        best = None
        for lr in lrs:
            mine = [r for r in runs if r["algorithm"] == name and r["lr"] == lr]
            per_seed = [rounds_to(r["train_loss"], target) for r in mine]
            reached = [x for x in per_seed if x is not None]
            med = float(np.median(reached)) if len(reached) == len(per_seed) else None
            entry = {"lr": float(lr), "rounds_per_seed": per_seed, "median_rounds": med,
                     "final_train_loss": float(np.mean([r["train_loss"] for r in mine], axis=0)[-1]),
                     "final_test_acc": float(np.mean([r["test_acc"] for r in mine], axis=0)[-1]),
                     "best_test_acc": float(np.mean([r["test_acc"] for r in mine], axis=0).max())}
            key = (med if med is not None else np.inf, entry["final_train_loss"])
            if best is None or key < best[0]:
                best = (key, entry)
        assert best is not None
        summary[name] = best[1]
    return summary


def run(ctx: Context) -> dict:
    args = ctx.args
    if args.emulate:
        return run_emulated(ctx)
    train, test, sizes = load(args.features)
    print(f"MovieLens latest-small: {len(train):,} train / {len(test):,} test ratings, positives "
          f"{train.y.mean():.2f}; tables {sizes}; {len(np.unique(train.user))} devices, K={args.k}")
    runs = federated_runs(args, ctx.seeds, train, test, sizes)

    def mean_curve(name: str, lr: float, key: str) -> np.ndarray:
        return np.mean([r[key] for r in runs if r["algorithm"] == name and r["lr"] == lr], axis=0)

    target = min(float(mean_curve("central", lr, "train_loss").min()) for lr in args.lrs)
    summary = best_rates(runs, args.lrs, target)
    fa, fs = summary["fedavg"]["median_rounds"], summary["fedsubavg"]["median_rounds"]
    speedup = (fa / fs) if fa and fs else None
    # FedAvg short of the target in every round run: its rounds are "rounds+" (the paper's Table 2
    # notation), so the ratio is at least rounds / FedSubAvg's.
    speedup_at_least = (args.rounds / fs) if fs and not fa else speedup
    print(f"target train loss (min of CentralSGD): {target:.4f}")
    for name, s in summary.items():
        print(f"  {name:9s} best lr {s['lr']:g}: rounds to target {s['rounds_per_seed']} (median {s['median_rounds']}), "
              f"final train loss {s['final_train_loss']:.4f}, test acc {s['final_test_acc']:.4f}")
    print(f"FedAvg / FedSubAvg rounds to target: {speedup if speedup is None else round(speedup, 2)}"
          + (f" (FedAvg {args.rounds}+: at least {speedup_at_least:.1f})" if speedup is None and speedup_at_least else ""))
    out = {"target_train_loss": target, "summary": summary, "speedup": speedup, "speedup_at_least": speedup_at_least,
           "curves": {name: {str(lr): {key: mean_curve(name, lr, key).tolist() for key in ("train_loss", "test_acc")}
                             for lr in args.lrs} for name in ("central", "fedavg", "fedsubavg")}}
    doc = ctx.write(runs, out)
    plot(out, ctx.out.with_suffix(".png"))
    return doc


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--emulate", action="store_true",
                    help="run through the orchestrator and the lightweight emulator")
    ap.add_argument("--fleet", default="movielens-fedsubavg",
                    help="--emulate: the fleet (movielens-fedsubavg: the embedding recommender; "
                         "movielens-lr-fedsubavg: the paper's LR)")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--lrs", type=lambda v: parse_list(v, float), default=[0.1, 0.3, 1.0])
    ap.add_argument("--features", choices=FEATURE_SETS, default="paper",
                    help="paper: the paper's hot user groups, movie and their crosses; ids: user id, movie, genres")
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--batch", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)


def results_name(args: argparse.Namespace) -> str:
    """fedsubavg_movielens[_emulated[_<fleet>]]"""
    if not args.emulate:
        return "fedsubavg_movielens"
    return "fedsubavg_movielens_emulated" + ("" if args.fleet == "movielens-fedsubavg" else "_" + args.fleet.replace("-", "_"))


CASE = Case("fedsubavg_movielens", __doc__, run, arguments=arguments, seeds="0,1", results=results_name,
            quick={"rounds": 3, "lrs": "0.3", "seeds": "0"})


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, style in (("central", ":"), ("fedavg", "--"), ("fedsubavg", "-")):
        lr = str(out["summary"][name]["lr"])
        c = out["curves"][name][lr]
        a.plot(range(1, len(c["train_loss"]) + 1), c["train_loss"], style, label=f"{name} (lr {lr})")
        b.plot(range(1, len(c["test_acc"]) + 1), c["test_acc"], style, label=f"{name} (lr {lr})")
    a.axhline(out["target_train_loss"], color="grey", lw=0.8)
    a.set(xlabel="round", ylabel="train loss", title="MovieLens latest-small, LR, K=50")
    b.set(xlabel="round", ylabel="test accuracy")
    a.legend()
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
