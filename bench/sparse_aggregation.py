"""Server aggregation throughput for row-sparse updates (FedSubAvg), beside memory bandwidth.

A table of ``--rows`` x ``--dim`` float32 (1,000,000 x 64 = 244 MiB by default) and ``--devices``
updates of ``--touch`` random rows each (1,000). Each update goes through the real strategy,
``FedSubAvg.on_report`` (heat counted from each device's declared rows at ``configure``), and the
round closes with ``aggregate`` (Algorithm 1, line 9 on the touched rows, one copy of the table).

Printed and written to ``bench/results/sparse_aggregation.json``:

- fold throughput in rows/s (and MiB/s of row data), the work proportional to the rows;
- aggregate time per round;
- the ceiling: a numpy copy of the whole table, in MiB/s and in rows/s;
- the server's peak traced memory (tracemalloc) during fold + aggregate as a multiple of the table,
  for several fleet sizes: it stays O(table) however many devices report (the row accumulator
  never holds more slots than the table has rows).

Usage: ``python bench/sparse_aggregation.py [--rows 1000000] [--dim 64] [--touch 1000] [--devices 200]``
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, interleave, parse_list, ratio_summary  # noqa: E402
from edge_sdk.protocol import RowSparse  # noqa: E402
from orchestrator.rounds import RoundState  # noqa: E402
from orchestrator.strategies import DeviceInfo, DeviceReport, RoundContext  # noqa: E402
from orchestrator.strategies.fedsubavg import FedSubAvg  # noqa: E402

TABLE = "blocks.emb.weight"
BIAS = "blocks.head.bias"


def make_round(rows: int, dim: int, touch: int, devices: int, seed: int = 0):
    """The state, the devices (their declared rows) and their updates."""
    rng = np.random.default_rng(seed)
    state = {TABLE: rng.standard_normal((rows, dim), dtype=np.float32), BIAS: np.zeros(dim, np.float32)}
    infos, updates = {}, {}
    for i in range(devices):
        d = f"d{i:05d}"
        r = np.unique(rng.integers(0, rows, size=touch))
        infos[d] = DeviceInfo(d, "strong", 0, 10, rows={TABLE: r})
        updates[d] = RowSparse(r, rng.standard_normal((r.size, dim), dtype=np.float32) * np.float32(0.01), rows)
    return state, infos, updates


def run_round(state, infos, updates, fraction: float = 1.0) -> dict[str, float]:
    strategy = FedSubAvg(weighting="samples")
    ctx = RoundContext(round=1, global_state=state, devices=infos, state=RoundState(1, deadline=1e18),
                       blocks=("emb", "head"), fraction=fraction)
    t0 = time.perf_counter()
    instructions = strategy.configure(ctx)
    t_configure = time.perf_counter() - t0
    reports = []
    for ins in instructions:
        d = ins.device_id
        reports.append(DeviceReport(d, 1, "train", "strong", 10, (0, 2), {}, {TABLE: updates[d],
                                    BIAS: np.zeros_like(state[BIAS])}, ins.selection))
    t0 = time.perf_counter()
    for rep in reports:
        strategy.on_report(rep, ctx)
    t_fold = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = strategy.aggregate(ctx)
    t_aggregate = time.perf_counter() - t0
    folded_rows = sum(updates[i.device_id].indices.size for i in instructions)
    del result
    return {"configure_s": t_configure, "fold_s": t_fold, "aggregate_s": t_aggregate, "folded_rows": folded_rows,
            "updates": len(instructions)}


def traced_peak(state, infos, updates) -> int:
    tracemalloc.start()
    tracemalloc.reset_peak()
    run_round(state, infos, updates)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--touch", type=int, default=1_000)
    ap.add_argument("--devices", type=int, default=200)
    ap.add_argument("--fleets", type=lambda v: parse_list(v, int), default=[50, 200, 2000],
                    help="fleet sizes whose peak memory is traced (2,000 x 1,000 rows touch most of the table)")


def timed_runs(state, infos, updates, repeats: int) -> list[dict]:
    """A numpy copy of the table (the ceiling) and a round of folds and aggregate, side by side each repeat."""
    table = state[TABLE]
    table.copy()  # warm-up: the copy's pages
    runs = []
    for rep, lane in interleave(("copy", "round"), repeats):
        if lane == "copy":
            t0 = time.perf_counter()
            c = table.copy()
            runs.append({"lane": "copy", "repeat": rep, "seconds": time.perf_counter() - t0, "rows": len(table)})
            del c
        else:
            r = run_round(state, infos, updates)
            runs.append({"lane": "round", "repeat": rep, "seconds": r["fold_s"], **r})
    for r in runs:
        r["rows_per_s"] = (r["folded_rows"] if r["lane"] == "round" else r["rows"]) / r["seconds"]
    return runs


def run(ctx: Context) -> dict:
    args = ctx.args
    state, infos, updates = make_round(args.rows, args.dim, args.touch, args.devices)
    table = state[TABLE]
    row_bytes = args.dim * 4
    runs = timed_runs(state, infos, updates, ctx.repeats)
    rounds = [r for r in runs if r["lane"] == "round"]
    copy_s = min(r["seconds"] for r in runs if r["lane"] == "copy")
    best = min(rounds, key=lambda r: r["fold_s"])
    fold_rows_s = best["folded_rows"] / best["fold_s"]
    agg = min(r["aggregate_s"] for r in rounds)
    table_mib = table.nbytes / 2**20

    peaks = {}
    for n in args.fleets:
        fleet = (state, infos, updates) if n == args.devices else make_round(args.rows, args.dim, args.touch, n, seed=n)
        peaks[str(n)] = traced_peak(*fleet) / table.nbytes
        del fleet
    out = {
        "rows": args.rows, "dim": args.dim, "touch": args.touch, "devices": args.devices,
        "table_mib": table_mib,
        "fold_rows_per_s": fold_rows_s, "fold_mib_per_s": fold_rows_s * row_bytes / 2**20,
        "fold_s_per_update": best["fold_s"] / best["updates"],
        "aggregate_s": agg, "configure_s": min(r["configure_s"] for r in rounds),
        "copy_s": copy_s, "copy_mib_per_s": table_mib / copy_s, "copy_rows_per_s": args.rows / copy_s,
        "fold_vs_copy_rows": fold_rows_s / (args.rows / copy_s),
        "peak_traced_over_table": peaks,
    }
    print(f"table {args.rows:,} x {args.dim} float32 ({table_mib:.0f} MiB); {args.devices} updates of "
          f"{args.touch:,} rows")
    print(f"  fold (FedSubAvg.on_report): {fold_rows_s:,.0f} rows/s ({out['fold_mib_per_s']:,.0f} MiB/s), "
          f"{1e3 * out['fold_s_per_update']:.2f} ms per update")
    print(f"  aggregate (line 9 + one table copy): {agg:.3f} s per round; configure (heat): {out['configure_s']:.3f} s")
    print(f"  ceiling, numpy copy of the table: {out['copy_mib_per_s']:,.0f} MiB/s = {out['copy_rows_per_s']:,.0f} rows/s"
          f"  (fold/copy: {out['fold_vs_copy_rows']:.2f})")
    for k, v in out["peak_traced_over_table"].items():
        print(f"  peak traced memory (fold + aggregate) with {k} updates: {v:.2f} x the table")
    return ctx.write(runs, out, {"rows_per_s_over_copy": ratio_summary(runs, "rows_per_s", "copy")})


CASE = Case("sparse_aggregation", __doc__, run, arguments=arguments, repeats=3,
            quick={"rows": 20_000, "dim": 8, "touch": 100, "devices": 20, "fleets": "10,20", "repeats": 1},
            metrics=("seconds", "rows_per_s"), group_by=("lane",))


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
