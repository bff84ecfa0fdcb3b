"""VaRSeL: variance-reduction selfish learning (Wang et al., "Selfish Federated Learning", Section 4
and Algorithm 1).

The objective is that of the M internal devices (eq. 2). Each external device j counts with a
weight w_j in [0, 1] in the surrogate objective (eq. 3), with ``1'w <= K`` (the communication
budget), and the weights are chosen to make the surrogate gradient as close as possible to the
internal one: minimise the variance of eq. 4,

    Phi(w) = (A + || sum_j w_j (g_j - g_I) ||^2) / (M + 1'w)^2,      A = sum_i ||g_i - g_I||^2,

where g_I is the internal mean update (eq. 6, its unbiased estimate). Before the externals send
their updates, the server only knows d_j = ||g_j - g_I||^2 (the communicated term of eq. 7) and
minimises the upper bound of eq. 7,

    Phi~(w) = (A + (1'w) sum_j w_j d_j) / (M + 1'w)^2                 (eq. 8, w~),

then samples the externals by w~ (Algorithm 1, line 10), receives their updates (lines 11-13), solves
eq. 4 on them (line 14, w*) and applies (M g_I + sum_j w*_j g_j) / (M + 1'w*) (line 15; the deltas
already carry the step -eta, line 16). With tau > 1 local steps, updates replace gradients (end of
Section 4.3). Eq. 5 predicts that 1'w* shrinks as training converges (the "fine-tune effect"):
every round logs it as ``external_weight_sum``.

One round, hook by hook: ``configure`` sends the internal devices ``train`` (and ``evaluate``, for
the internal loss and accuracy the round reports); ``on_report`` folds them with weight 1 and, when
the last is in (line 3), sends every external ``compare`` with one :class:`Broadcast` of g_I (line
4) over the entries every participant trains (the common tail, so distances are comparable); each
external trains once and reports ``sq_distance`` (lines 5-8); then eq. 8 (line 9) and sampling (line
10) give ``train`` follow-ups, which the devices answer with the update they already trained; the
chosen updates are held until ``aggregate`` solves eq. 4 and folds them with weight w*_j into the
same :class:`WeightedSums`, so an external that trained only its tail (an EmbracingFL weak role) is
averaged in where it trained.

A needs M >= 2: from one internal update the scatter sum_i ||g_i - g_I||^2 is 0, and with A = 0
eq. 4 gives every external weight 0 (the internal update alone has no estimated variance to reduce).
The paper assumes several internal clients (for FeTS it splits one site's data over 3). A fleet
whose internal group never had two devices is refused with a clear error at ``configure``, unless
``internal_noise`` sigma is set: then A is estimated from Assumption 1,
E||g_I - grad l||^2 <= sigma ||grad l||^2, at equality with grad l ~ g_I: A = sigma ||g_I||^2. A
round in which only one internal update arrived (a device dropped) trains the internal device only
and says so (``externals_skipped``).

An external whose update is identically zero on the compared entries (its loss does not depend on
the model on its data: a Cox partial likelihood without a death, or whose deaths each have only
themselves at risk, a constant 0) is left out of eq. 8 and eq. 4 and reported as ``zero_updates``.
In eq. 3 such a device's w_j l_j is a constant: it adds nothing to the surrogate's gradient and
only enlarges the denominator M + 1'w, so its whole effect is (M / (M + 1'w)) g_I, the internal
estimate shrunk, i.e. a smaller learning rate, which eta already sets (line 16). Eq. 4 would price
that shrinkage as variance reduction (the plug-in bias term ||0 - g_I||^2 is often the smallest
distance of all), but it uses no knowledge of the external client, which is what Section 4.1
weights externals for. The device knows the update exactly and already reports its squared norm
with the distance (``sq_norm``, a few bytes more than line 7); only an exact 0 counts, no threshold.

``variant="all_externals"`` is the reweighting of Section 4.1 itself, not Algorithm 1's
approximation: every sampled external trains and eq. 4 is solved over all of their updates (no
eq. 8 step, no sampling; each external's whole update is sent every round).
"""

from __future__ import annotations

import math
import logging
from collections.abc import Sequence
from typing import Literal

import numpy as np

from edge_sdk.protocol import RowSparse
from orchestrator.strategies.base import (
    Broadcast,
    Combines,
    DeviceReport,
    Instruction,
    Refused,
    RoundContext,
    RoundResult,
    Strategy,
    WeightedSums,
)
from orchestrator.strategies.groups import (
    PRIORITIZED_SERVER_SETTINGS, PriorityRule, flag_option, json_ready, number_option, parse_ids, weighted_metrics,
)
from orchestrator.strategies.selection import Selection
from orchestrator.values import NonNegative, NonNegativeInt

__all__ = ["VaRSeL", "approx_weights", "phi", "phi_tilde", "solve_weights"]

log = logging.getLogger(__name__)


# -- the two weight problems ---------------------------------------------------------------------
def phi_tilde(w: np.ndarray, d: np.ndarray, a: float, m: int) -> float:
    """Eq. 7's bound: (A + (1'w) sum_j w_j d_j) / (M + 1'w)^2."""
    s = float(np.sum(w))
    return (a + s * float(np.dot(w, d))) / (m + s) ** 2


def phi(w: np.ndarray, gram: np.ndarray, a: float, m: int) -> float:
    """Eq. 4: (A + w' G w) / (M + 1'w)^2 with G_jk = <g_j - g_I, g_k - g_I>."""
    s = float(np.sum(w))
    return (a + float(w @ gram @ w)) / (m + s) ** 2


def approx_weights(d: Sequence[float] | np.ndarray, a: float, m: int, budget: float) -> np.ndarray:
    """Eq. 8, exactly: w~ = argmin Phi~(w) over w in [0, 1]^N, 1'w <= K.

    For a fixed total s = 1'w the numerator A + s sum_j w_j d_j is least when the weight goes to
    the smallest d_j first (a fractional knapsack), so w~ is 1 on the k nearest externals and
    s - k on the next. On s in [k, k+1] the objective is (A + b s + d s^2) / (M + s)^2 with
    d = d_(k+1) and b = C_k - k d (C_k: the k smallest distances' sum), whose derivative vanishes
    where b M - 2A + s (2 d M - b) = 0: the optimum is an end of a segment or that point.
    """
    d = np.asarray(d, dtype=np.float64)
    if m < 1:
        raise ValueError("VaRSeL needs at least one internal device (M >= 1)")
    if d.ndim != 1 or not np.all(np.isfinite(d)) or np.any(d < 0):
        raise ValueError("distances must be finite and non-negative")
    if budget < 0 or not math.isfinite(a) or a < 0:
        raise ValueError(f"need budget >= 0 and A >= 0, got {budget} and {a}")
    n = len(d)
    w = np.zeros(n)
    s_max = min(float(budget), float(n))
    if n == 0 or s_max <= 0:
        return w
    order = np.argsort(d, kind="stable")
    ds = d[order]
    prefix = np.concatenate([[0.0], np.cumsum(ds)])

    def value(s: float) -> float:
        k = min(int(math.floor(s)), n - 1)
        c = prefix[k] + (s - k) * ds[k]
        return (a + s * c) / (m + s) ** 2

    best_s, best = 0.0, a / m**2
    for k in range(int(math.ceil(s_max))):
        lo, hi = float(k), min(float(k + 1), s_max)
        dk = ds[k]
        b = prefix[k] - k * dk
        candidates = [lo, hi]
        denom = 2 * dk * m - b
        if denom != 0:
            s_star = (2 * a - b * m) / denom
            if lo < s_star < hi:
                candidates.append(s_star)
        for s in candidates:
            v = value(s)
            if v < best - 1e-15 * max(1.0, abs(best)):
                best_s, best = s, v
    k = int(math.floor(best_s + 1e-12))
    w[order[:k]] = 1.0
    if k < n and best_s - k > 1e-12:
        w[order[k]] = best_s - k
    return w


def _project(y: np.ndarray, s: float) -> np.ndarray:
    """Euclidean projection of y on {w in [0, 1]^n : 1'w = s}: w = clip(y - tau, 0, 1), with tau
    found exactly among the breakpoints of the piecewise-linear sum(clip(y - tau, 0, 1))."""
    knots = np.sort(np.concatenate([y, y - 1.0]))
    totals = np.clip(y[None, :] - knots[:, None], 0.0, 1.0).sum(1)  # decreasing in tau
    i = int(np.searchsorted(-totals, -s, side="left"))
    if i == 0:
        tau = float(knots[0])
    elif i >= len(knots):
        tau = float(knots[-1])
    else:
        t0, t1, f0, f1 = knots[i - 1], knots[i], totals[i - 1], totals[i]
        tau = float(t0 if f0 == f1 else t0 + (f0 - s) * (t1 - t0) / (f0 - f1))
    return np.clip(y - tau, 0.0, 1.0)


def _min_quadratic(gram: np.ndarray, s: float, lip: float, start: np.ndarray | None = None,
                   iters: int = 500) -> np.ndarray:
    """argmin w' G w over {w in [0, 1]^n : 1'w = s}: accelerated projected gradient (a convex QP)."""
    n = len(gram)
    w = _project(np.full(n, s / n) if start is None else start, s)
    if lip <= 0:
        return w
    z, t = w.copy(), 1.0
    for _ in range(iters):
        w_next = _project(z - (2.0 / lip) * (gram @ z), s)
        if float(np.max(np.abs(w_next - w))) < 1e-10:
            return w_next
        t_next = 0.5 * (1 + math.sqrt(1 + 4 * t * t))
        z = w_next + ((t - 1) / t_next) * (w_next - w)
        w, t = w_next, t_next
    return w


def solve_weights(gram: np.ndarray, a: float, m: int, budget: float, *, grid: int = 24) -> np.ndarray:
    """Eq. 4 (Algorithm 1, line 14): w* = argmin (A + w' G w) / (M + 1'w)^2 over w in [0, 1]^n,
    1'w <= K, for the externals whose updates arrived (G their Gram matrix around g_I).

    For a fixed total s the numerator's minimum q(s) is a convex QP; q is convex in s, and
    (A + q(s)) / (M + s)^2 is searched over s on a grid, then refined by golden section.
    """
    gram = np.asarray(gram, dtype=np.float64)
    n = len(gram)
    if m < 1:
        raise ValueError("VaRSeL needs at least one internal device (M >= 1)")
    if gram.shape != (n, n) or not np.all(np.isfinite(gram)):
        raise ValueError(f"the Gram matrix must be a finite square matrix, got shape {gram.shape}")
    gram = 0.5 * (gram + gram.T)
    s_max = min(float(budget), float(n))
    if n == 0 or s_max <= 0:
        return np.zeros(n)
    cache: dict[float, tuple[float, np.ndarray]] = {0.0: (a / m**2, np.zeros(n))}
    lip = 2.0 * float(np.linalg.eigvalsh(gram)[-1])

    def value(s: float) -> float:
        if s not in cache:
            near = min(cache, key=lambda k: abs(k - s))  # warm start from the nearest total solved
            w = _min_quadratic(gram, s, lip, cache[near][1] + (s - near) / n)
            cache[s] = (phi(w, gram, a, m), w)
        return cache[s][0]

    points = np.linspace(0.0, s_max, grid + 1)
    values = [value(float(s)) for s in points]
    i = int(np.argmin(values))
    lo, hi = float(points[max(i - 1, 0)]), float(points[min(i + 1, grid)])
    g = (math.sqrt(5) - 1) / 2
    x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
    for _ in range(30):
        if value(x1) <= value(x2):
            hi, x2 = x2, x1
            x1 = hi - g * (hi - lo)
        else:
            lo, x1 = x1, x2
            x2 = lo + g * (hi - lo)
    best = min(cache, key=lambda s: cache[s][0])
    return cache[best][1]


# -- the strategy --------------------------------------------------------------------------------
class VaRSeL(Strategy):
    """Selfish FL: internal devices' objective; external devices weighted by variance reduction.

    ``budget`` is K (the expected number of externals per round, 1'w <= K); without it,
    ``budget_fraction`` C_b gives K = C_b N for the N externals of the round. ``exact`` solves eq. 4
    on the received updates (holding them until the round closes); False folds them with w~ as
    they arrive (O(model) memory). ``evaluate`` also asks every device for the loss and accuracy of
    the received model, which the round reports for the internal and the external devices.
    ``internal_noise`` sigma estimates the internal scatter A = sigma ||g_I||^2 when the fleet has
    one internal device (Assumption 1; without it such a fleet is refused). ``variant``
    ``"all_externals"``: Section 4.1's reweighting over every sampled external (see the module).
    """

    name = "varsel"
    combines = Combines.own("external devices weighted to minimise the gradient variance, from compare reports")
    #: The norm bound off where the user left it on (:data:`~orchestrator.strategies.groups.PRIORITIZED_SERVER_SETTINGS`).
    server_settings = PRIORITIZED_SERVER_SETTINGS

    def __init__(self, budget: NonNegative | None = None, budget_fraction: NonNegative = 0.25, *,
                 exact: bool = True, evaluate: bool = True, internal: tuple[str, ...] | None = None,
                 internal_label: str = "internal", seed: NonNegativeInt = 0, internal_noise: NonNegative | None = None,
                 variant: Literal["algorithm1", "all_externals"] = "algorithm1") -> None:
        self.budget = None if budget is None else number_option("budget", budget)
        self.budget_fraction = number_option("budget_fraction", budget_fraction)
        self.exact = flag_option("exact", exact)
        self.evaluate = flag_option("evaluate", evaluate)
        self.rule = PriorityRule(parse_ids(internal), internal_label)
        self.seed = int(number_option("seed", seed))
        self.internal_noise = None if internal_noise is None else number_option("internal_noise", internal_noise)
        if variant == "all_externals" and not self.exact:
            raise ValueError("variant all_externals solves eq. 4 on every update: it needs exact=true")
        self.variant = variant
        self._most_internal = 0  # the most internal devices any round began with
        self._reset()

    def _reset(self) -> None:
        self._sums: WeightedSums | None = None
        self._internal: list[str] = []
        self._external: list[str] = []
        self._selection: dict[str, Selection] = {}
        self._names: tuple[str, ...] = ()  # entries compared (the common tail's float entries)
        self._internal_in: set[str] = set()
        self._internal_sq = 0.0  # sum_i ||g_i||^2 over the compared entries
        self._internal_sum: dict[str, np.ndarray] = {}  # sum_i g_i over the compared entries (float64)
        self._g_internal: dict[str, np.ndarray] | None = None
        self._a = 0.0
        self._k = 0.0
        self._distances: dict[str, float] = {}
        self._zero: set[str] = set()  # externals whose update is identically 0 (see the module)
        self._w_tilde: dict[str, float] = {}
        self._sampled: list[str] = []
        self._held: dict[str, DeviceReport] = {}
        self._weights: dict[str, float] = {}
        self._evaluated: dict[str, tuple[float, float, int]] = {}
        self._decided = False
        self._skipped = ""  # why this round left the externals out, if it did
        self._refused = 0

    def configure(self, ctx: RoundContext) -> Sequence[Instruction]:
        self._reset()
        self._sums = WeightedSums(ctx.global_state)
        self._internal, others = self.rule.split(ctx.devices, ctx.devices)
        self._most_internal = max(self._most_internal, len(self._internal))
        if others and self._most_internal == 1 and self.internal_noise is None:
            raise ValueError(
                "varsel: the fleet has one internal device, so the internal scatter A of eq. 4 is 0 and no external "
                "device could get weight. Connect two or more internal devices (the paper splits one site's data "
                "over 3), or set internal_noise=sigma to estimate A = sigma ||g_I||^2 (Assumption 1).")
        self._external = sorted(ctx.sample(others)) if others and self._internal else []
        for d in self._internal + self._external:
            self._selection[d] = Selection.tail(ctx.devices[d].split)
        self._k = self.budget if self.budget is not None else self.budget_fraction * len(self._external)
        common = max((ctx.devices[d].split for d in self._selection), default=0)
        keep = set(ctx.blocks[common:]) if ctx.blocks else None
        self._names = tuple(n for n, v in ctx.global_state.items() if v.dtype.kind == "f"
                            and (keep is None or n.split(".", 2)[1] in keep))
        out: list[Instruction] = []
        for d in self._internal:
            if self.evaluate:
                out.append(Instruction(d, "evaluate", self._selection[d]))
            out.append(Instruction(d, "train", self._selection[d]))
        if self.evaluate:
            out.extend(Instruction(d, "evaluate", self._selection[d]) for d in self._external)
        if self.variant == "all_externals":  # Section 4.1: every external's update, eq. 4 over all
            self._sampled = list(self._external)
            out.extend(Instruction(d, "train", self._selection[d]) for d in self._external)
        return out

    # -- reports ----------------------------------------------------------------------------------
    def on_report(self, report: DeviceReport, ctx: RoundContext) -> Sequence[Instruction]:
        if self._sums is None:
            raise RuntimeError("varsel: report before configure")
        d = report.device_id
        if report.phase == "evaluate":
            self._evaluated[d] = (report.metric("loss"), report.metric("accuracy"), int(report.num_samples))
            return ()
        if report.phase == "train" and d in self._internal:
            # Algorithm 1, line 3: the internal updates g_i, each with weight 1 (eq. 3).
            self._sums.add_report(report, 1.0)
            for n in self._names:
                if n in report.tensors:
                    g = _dense(report.tensors[n]).astype(np.float64)
                    self._internal_sq += float(np.sum(g * g))
                    acc = self._internal_sum.get(n)
                    self._internal_sum[n] = g if acc is None else acc + g
            self._internal_in.add(d)
            return self._broadcast(ctx)
        if report.phase == "compare" and d in self._external:
            dist = report.metric("sq_distance")
            if not math.isfinite(dist) or dist < 0:
                self._refused += 1
                raise Refused(f"sq_distance must be a finite non-negative number, got {dist}")
            self._distances[d] = dist  # eq. 7's communicated term, lines 5-8
            if report.metric("sq_norm") == 0.0:  # no gradient on its data: not a candidate (module doc)
                self._zero.add(d)
            return self._choose(ctx)
        if report.phase == "train" and d in self._sampled:
            if self.exact:
                self._held[d] = report  # lines 11-13: held until eq. 4 is solved (aggregate)
            else:
                w = self._w_tilde[d]
                self._sums.add_report(report, w)
                self._weights[d] = w
            return ()
        self._refused += 1
        raise Refused(f"varsel did not ask {d} for a {report.phase!r} report")

    def on_missing(self, device_id: str, phases: Sequence[str], ctx: RoundContext) -> Sequence[Instruction]:
        if device_id in self._internal and "train" in phases:
            return self._broadcast(ctx)
        if device_id in self._external and "compare" in phases:
            return self._choose(ctx)
        return ()

    def _broadcast(self, ctx: RoundContext) -> list[Instruction]:
        """Line 4: once every internal update is in (or its device gone), send g_I to the externals."""
        assert self._sums is not None
        if self._g_internal is not None or any(d not in self._internal_in and ctx.state.expects(d, "train")
                                               for d in self._internal):
            return []
        m = len(self._internal_in)
        if m == 0:
            self._g_internal = {}
            return []
        # Eq. 6: g_I = (1/M) sum_i g_i, the unbiased estimate of the internal gradient (update).
        self._g_internal = {n: v / m for n, v in self._internal_sum.items()}
        g_sq = sum(float(np.sum(v * v)) for v in self._g_internal.values())
        # A = sum_i ||g_i - g_I||^2 = sum_i ||g_i||^2 - M ||g_I||^2 (eq. 4's first term); with one
        # internal update, Assumption 1 at equality: A = sigma ||g_I||^2 (internal_noise).
        self._a = max(0.0, self._internal_sq - m * g_sq) if m > 1 else (self.internal_noise or 0.0) * g_sq
        if m == 1 and self.internal_noise is None and self._external:
            self._skipped = "one internal update this round: the internal scatter A cannot be estimated"
            log.warning("varsel round %d: %s; the externals are left out", ctx.round, self._skipped)
            return []
        if not self._external or self.variant == "all_externals":
            return []
        b = Broadcast({n: v.astype(np.float32) for n, v in self._g_internal.items()})
        return [Instruction(d, "compare", self._selection[d], broadcast=b) for d in self._external]

    def _choose(self, ctx: RoundContext) -> list[Instruction]:
        """Lines 9-10: w~ from eq. 8, then each external sampled with probability w~_j."""
        if self._decided or any(d not in self._distances and ctx.state.expects(d, "compare") for d in self._external):
            return []
        self._decided = True
        devices = sorted(d for d in self._distances if d not in self._zero)
        m = len(self._internal_in)
        if not devices or m == 0:
            return []
        w = approx_weights([self._distances[d] for d in devices], self._a, m, self._k)
        self._w_tilde = {d: float(x) for d, x in zip(devices, w)}
        rng = np.random.default_rng(None if ctx.seed is None else [self.seed, ctx.seed, ctx.round])
        draws = rng.random(len(devices))
        self._sampled = [d for d, x, u in zip(devices, w, draws) if u < x]
        return [Instruction(d, "train", self._selection[d]) for d in self._sampled]

    # -- closing ----------------------------------------------------------------------------------
    def aggregate(self, ctx: RoundContext) -> RoundResult:
        sums = self._sums if self._sums is not None else WeightedSums(ctx.global_state)
        if self._held and not self._skipped:
            devices = sorted(self._held)
            weights = self._exact_weights(devices)
            for d, w in zip(devices, weights):
                if w > 0:  # line 15: (M g_I + sum_j w*_j g_j) / (M + 1'w*), per entry
                    sums.add_report(self._held[d], float(w))
                    self._weights[d] = float(w)
        internal = weighted_metrics(self._evaluated, self._internal)
        external = weighted_metrics(self._evaluated, self._external)
        m = len(self._internal_in)
        extra: dict[str, object] = {
            "strategy": self.name,
            "internal_devices": m,
            "external_devices": len(self._external),
            "budget": self._k,
            "internal_loss": internal[0],
            "internal_accuracy": internal[1],
            "external_loss": external[0],
            "external_accuracy": external[1],
            "internal_spread": self._a,  # A of eq. 4
            "w_tilde_sum": float(sum(self._w_tilde.values())),
            "sampled": list(self._sampled),
            # The externals folded and their weights w*_j (eq. 4); the fine-tune effect: this decays.
            "included": {d: w for d, w in sorted(self._weights.items())},
            "external_weight_sum": float(sum(self._weights.values())),
            "variant": self.variant,
            "zero_updates": sorted(self._zero),
            **({"externals_skipped": self._skipped} if self._skipped else {}),
        }
        self._sums, self._held = None, {}
        return sums.result(ctx.round, self._refused, extra={k: json_ready(v) for k, v in extra.items()})

    def _exact_weights(self, devices: list[str]) -> np.ndarray:
        """Eq. 4 on the received updates: G_jk = <g_j - g_I, g_k - g_I> over the compared entries;
        an update that is identically zero there gets weight 0 and is left out of the problem."""
        g = self._g_internal or {}
        rows = []
        for d in devices:
            t = self._held[d].tensors
            ups = {n: _dense(t[n]).astype(np.float64).ravel() for n in self._names if n in t and n in g}
            if ups and not any(np.any(u) for u in ups.values()):
                self._zero.add(d)
            rows.append(np.concatenate([u - g[n].ravel() for n, u in ups.items()]) if ups else np.zeros(0))
        width = max((len(r) for r in rows), default=0)
        if width == 0 or any(len(r) != width for r in rows):
            return np.array([self._w_tilde.get(d, 0.0) for d in devices])
        keep = np.array([d not in self._zero for d in devices])
        w = np.zeros(len(devices))
        if keep.any():
            diff = np.stack(rows)[keep]
            w[keep] = solve_weights(diff @ diff.T, self._a, max(len(self._internal_in), 1), self._k)
        return w


def _dense(v: np.ndarray | RowSparse) -> np.ndarray:
    return v.dense() if isinstance(v, RowSparse) else np.asarray(v)

