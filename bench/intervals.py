"""Bootstrap confidence intervals for the benchmarks' claims: a score, and the difference of two
methods' scores, with the uncertainty of both the finite test set and the training seeds.

A benchmark's cell is the mean over seeds of a score on one test set. Two things could make it come
out otherwise: other seeds (initial model, mini-batches, sampling) and another test set of the same
size. The bootstrap here resamples both at once (a two-level bootstrap): each draw takes the seeds
with replacement and the test examples (or, for the C-index, the patients) with replacement, and
recomputes the cell. Methods compared on the same seeds and the same test examples are resampled
with the same draws (paired), so what the two share (a hard example, a lucky seed) cancels in their
difference. A difference is a *win* only where its interval excludes zero; otherwise it is *within
noise* (:func:`verdict`).

Scores:

- accuracy (:func:`accuracy_of`): per-example correctness (0/1) of each seed's final model;
- Harrell's C-index (:func:`cindex_of`): per-patient risks and the patients' ``(event, time)``,
  resampled over patients, which is how the C-index of a small test set moves (40 patients with 4
  deaths give 44 comparable pairs).

:func:`paired_draws` makes the draws of every method of one comparison.

Where a run kept only its score per seed (older results), :func:`seed_draws` resamples the seeds
(paired across methods) and adds each seed's test-set noise as a binomial draw of its accuracy (``n``
examples), independent across methods: wider than the paired interval of a rerun that keeps its
per-example results.

Percentile intervals, 95 % and 4,000 draws by default, from a fixed seed (the same numbers on
every run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["DRAWS", "LEVEL", "Interval", "accuracy_of", "cindex_of", "cindex_pairs", "difference", "interval",
           "paired_draws", "seed_draws", "verdict"]

DRAWS = 4000
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile bootstrap interval (same unit as the score)."""

    estimate: float
    low: float
    high: float
    level: float = LEVEL

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def scaled(self, factor: float) -> Interval:
        return Interval(self.estimate * factor, self.low * factor, self.high * factor, self.level)

    def text(self, digits: int = 2, sign: bool = False) -> str:
        f = f"{{:{'+' if sign else ''}.{digits}f}}"
        return f"{f.format(self.estimate)} [{f.format(self.low)}, {f.format(self.high)}]"

    def to_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "level": self.level}


def _counts(rng: np.random.Generator, n: int, draws: int) -> np.ndarray:
    """How often each of ``n`` items is drawn, per bootstrap draw (``draws x n``)."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=draws).astype(np.float64)


def _seed_mean(per_seed: np.ndarray, seed_counts: np.ndarray) -> np.ndarray:
    """Per draw, the mean over the drawn seeds of each seed's score (``per_seed``: draws x seeds)."""
    valid = np.isfinite(per_seed)
    w = seed_counts * valid
    total = w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (np.where(valid, per_seed, 0.0) * w).sum(axis=1) / total, np.nan)


def accuracy_of(correct: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Accuracy per draw of a 0/1 correctness vector under example ``counts`` (``draws x n``)."""
    return counts @ np.asarray(correct, np.float64) / counts.sum(axis=1)


def cindex_pairs(risk: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concordance (1, or 0.5 for tied risks) and comparability of every patient pair (i, j): i had
    an event before j's time. Harrell's C-index is their ratio of sums (``edge_sdk.data.tcga_brca``)."""
    risk = np.asarray(risk, np.float64).reshape(-1)
    event, time = np.asarray(y)[:, 0] > 0, np.asarray(y)[:, 1]
    comparable = (event[:, None] & (time[:, None] < time[None, :])).astype(np.float64)
    concordant = comparable * ((risk[:, None] > risk[None, :]) + 0.5 * (risk[:, None] == risk[None, :]))
    return concordant, comparable


def cindex_of(risk: np.ndarray, y: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The C-index per draw of patient ``counts``; NaN for a draw without a comparable pair. A
    patient drawn twice is not comparable with itself (no time is before itself)."""
    concordant, comparable = cindex_pairs(risk, y)
    num = np.einsum("bi,ij,bj->b", counts, concordant, counts)
    den = np.einsum("bi,ij,bj->b", counts, comparable, counts)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def paired_draws(results: Mapping[str, Sequence[object]], test_sets: Sequence[Hashable],
                 score: Callable[[object, np.ndarray], np.ndarray], draws: int = DRAWS,
                 rng_seed: int = 0) -> dict[str, np.ndarray]:
    """Bootstrap draws of each method's seed-mean score, all methods resampled alike (paired).

    ``results[method][s]`` is seed s's per-example result (what ``score`` takes with example
    counts, e.g. a correctness vector; ``len`` gives its examples); ``test_sets[s]`` names seed s's
    test set: seeds that share one are resampled with the same example counts (another test set
    moves them together), seeds of different test sets (MNIST's priority classes are drawn per
    seed) independently. Each draw then takes the seeds with replacement."""
    rng = np.random.default_rng(rng_seed)
    seeds = len(test_sets)
    first = next(iter(results.values()))
    counts: dict[Hashable, np.ndarray] = {}
    for s, key in enumerate(test_sets):
        if key not in counts:
            counts[key] = _counts(rng, len(first[s]), draws)
    seed_counts = _counts(rng, seeds, draws)
    out = {}
    for method, per_seed in results.items():
        if len(per_seed) != seeds:
            raise ValueError(f"{method}: {len(per_seed)} seeds, the comparison has {seeds}")
        scores = np.stack([score(per_seed[s], counts[test_sets[s]]) for s in range(seeds)], axis=1)
        out[method] = _seed_mean(scores, seed_counts)
    return out


def seed_draws(per_seed: Sequence[float], examples: int | None, draws: int = DRAWS, rng_seed: int = 0,
               noise_seed: int | None = None) -> np.ndarray:
    """Draws of the seed-mean accuracy from per-seed accuracies only: the seeds resampled (from
    ``rng_seed``: two methods' calls with the same one draw the same seeds, paired), each drawn
    seed's accuracy redrawn as Binomial(examples, p) / examples (from ``noise_seed``: give two
    methods different ones, so their test-set noise is independent, wider than the paired noise of
    the same test images; None: seeds only)."""
    p = np.asarray(per_seed, np.float64)
    pick = np.random.default_rng(rng_seed).integers(0, len(p), size=(draws, len(p)))
    values = p[pick]
    if examples:
        noise = np.random.default_rng(rng_seed + 1 if noise_seed is None else noise_seed)
        values = noise.binomial(examples, np.clip(values, 0, 1)) / examples
    return values.mean(axis=1)


def interval(draws: np.ndarray, estimate: float, level: float = LEVEL) -> Interval:
    """The percentile interval of ``draws`` (NaN draws left out) around ``estimate``."""
    d = np.asarray(draws, np.float64)
    d = d[np.isfinite(d)]
    if not len(d):
        return Interval(estimate, math.nan, math.nan, level)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(d, [tail, 100 - tail])
    return Interval(float(estimate), float(low), float(high), level)


def difference(a_draws: np.ndarray, b_draws: np.ndarray, a_estimate: float, b_estimate: float,
               level: float = LEVEL) -> Interval:
    """The interval of a - b from draws made with the same resampling (paired) or independently."""
    return interval(np.asarray(a_draws) - np.asarray(b_draws), a_estimate - b_estimate, level)


def verdict(diff: Interval, *, better: str = "wins", worse: str = "loses") -> str:
    """``better`` where the difference's interval is above zero, ``worse`` where below, else
    "within noise"."""
    if not diff.excludes_zero:
        return "within noise"
    return better if diff.low > 0 else worse
