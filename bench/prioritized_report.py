"""The prioritized benchmarks' tables with their uncertainty: each algorithm's final score per
priority choice, and FedALIGN's and VaRSeL's differences to both baselines, each with a 95 %
bootstrap interval over the seeds and the held-out examples (patients, for the C-index), paired
across algorithms (``bench/intervals.py``). A difference is a win only where its interval excludes
zero; otherwise it is within noise.

The held-out-style check of the issue this answers is :func:`below_spread`: an algorithm is below
FedAvg over the priority devices by more than that baseline's seed spread (std), the failure a
prioritized strategy's default must not show.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bench.intervals import Interval, accuracy_of, cindex_of, difference, interval, paired_draws, verdict
from bench.prioritized_runner import ALGORITHMS

__all__ = ["BASELINES", "CHALLENGERS", "below_spread", "markdown", "summarise"]

BASELINES = ("fedavg-priority", "fedavg-all")
CHALLENGERS = ("fedalign", "varsel")
SHORT = {"fedavg-priority": "FedAvg-priority", "fedavg-all": "FedAvg-all", "fedalign": "FedALIGN", "varsel": "VaRSeL"}


def _per_example(detail: dict) -> np.ndarray:
    """A run's per-example results as the score functions take them: correctness (0/1), or rows of
    (risk, event, time) for the C-index."""
    if "correct" in detail:
        return np.frombuffer(detail["correct"].encode(), np.uint8) - ord("0")
    return np.column_stack([np.asarray(detail["risk"], np.float64), np.asarray(detail["y"], np.float64)])


def _score(result: np.ndarray, counts: np.ndarray) -> np.ndarray:
    if result.ndim == 1:
        return accuracy_of(result, counts)
    return cindex_of(result[:, 0], result[:, 1:], counts)


def _test_set(detail: dict) -> object:
    """Which test set a run was scored on: seeds of the same set share the example resampling."""
    if "correct" in detail:
        return ("n", len(detail["correct"]), detail.get("test_set"))
    return ("y", tuple(map(tuple, detail["y"])))


def below_spread(row: dict, algorithm: str) -> bool:
    """``algorithm``'s mean below FedAvg-over-the-priority-devices' mean by more than its std."""
    base = row.get("fedavg-priority")
    return base is not None and row[algorithm]["mean"] < base["mean"] - base["std"]


def _choice(runs: Sequence[dict]) -> dict:
    """One priority choice: per algorithm its finals and interval; per challenger its differences."""
    row: dict[str, dict] = {}
    for algorithm in ALGORITHMS:
        mine = sorted((r for r in runs if r["algorithm"] == algorithm), key=lambda r: r["seed"])
        if mine:
            finals = [r["final"] for r in mine]
            row[algorithm] = {"mean": float(np.nanmean(finals)), "std": float(np.nanstd(finals)), "per_seed": finals,
                              "seeds": [r["seed"] for r in mine]}
    complete = [a for a in row if all(r.get("final_detail") for r in runs if r["algorithm"] == a)]
    seeds = sorted({tuple(row[a]["seeds"]) for a in complete})
    if len(seeds) != 1 or not complete:  # intervals need every algorithm on the same seeds, with details
        return row
    by = {a: sorted((r for r in runs if r["algorithm"] == a), key=lambda r: r["seed"]) for a in complete}
    details = {a: [_per_example(r["final_detail"]) for r in by[a]] for a in complete}
    keys = [_test_set(r["final_detail"]) for r in by[complete[0]]]
    draws = paired_draws(details, keys, _score)
    for a in complete:
        row[a]["interval"] = interval(draws[a], row[a]["mean"]).to_dict()
    for a in CHALLENGERS:
        for base in BASELINES:
            if a in draws and base in draws:
                diff = difference(draws[a], draws[base], row[a]["mean"], row[base]["mean"])
                row[a][f"vs_{base}"] = {**diff.to_dict(), "verdict": verdict(diff)}
    return row


def summarise(runs: Sequence[dict]) -> dict:
    """Per priority choice (``run["choice"]``, one for MNIST): :func:`_choice`, plus whether each
    challenger beats both baselines (both differences' intervals above zero) and the held-out-style
    check (:func:`below_spread`)."""
    table: dict[str, dict] = {}
    for choice in dict.fromkeys(r.get("choice", "") for r in runs):
        row = _choice([r for r in runs if r.get("choice", "") == choice])
        for a in CHALLENGERS:
            if a in row and all(f"vs_{b}" in row[a] for b in BASELINES):
                row[a]["wins_both"] = all(row[a][f"vs_{b}"]["verdict"] == "wins" for b in BASELINES)
            if a in row and "fedavg-priority" in row:
                row[a]["below_priority_by_more_than_spread"] = below_spread(row, a)
        table[choice] = row
    return table


def _cell(entry: dict, scale: float) -> str:
    if "interval" in entry:
        return Interval(**entry["interval"]).scaled(scale).text()
    return f"{scale * entry['mean']:.2f} ± {scale * entry['std']:.2f}"


def _diff_cell(entry: dict, base: str, scale: float) -> str:
    d = entry.get(f"vs_{base}")
    if d is None:
        return ""
    word = {"wins": "**win**", "loses": "**loss**"}.get(d["verdict"], "within noise")
    return f"{Interval(d['estimate'], d['low'], d['high']).scaled(scale).text(sign=True)} {word}"


def markdown(table: dict, metric: str, scale: float = 100.0) -> str:
    """The two tables BENCHMARKS.md shows: scores with their intervals, then the differences."""
    head = "| priority group | " + " | ".join(SHORT[a] for a in ALGORITHMS) + " |\n|---|" + "---|" * len(ALGORITHMS)
    lines = [f"{metric}, x{scale:g}: mean over seeds [95% bootstrap interval over seeds and held-out examples]", "",
             head]
    for choice, row in table.items():
        cells = [(_cell(row[a], scale) + (" **-**" if row[a].get("below_priority_by_more_than_spread") else ""))
                 if a in row else "" for a in ALGORITHMS]
        lines.append(f"| {choice} | " + " | ".join(cells) + " |")
    lines += ["", "Differences (paired, same seeds and examples): a win only where the interval excludes 0", "",
              "| priority group | " + " | ".join(f"{SHORT[a]} - {SHORT[b]}" for a in CHALLENGERS for b in BASELINES)
              + " |", "|---|" + "---|" * 4]
    for choice, row in table.items():
        cells = [_diff_cell(row[a], b, scale) if a in row else "" for a in CHALLENGERS for b in BASELINES]
        lines.append(f"| {choice} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
