"""FedALIGN: prioritized federated learning (Lamsal et al., "FedALIGN: Federated Adaptive Learning
with Inclusion of Global Needs"; published as "Utilizing Free Clients in Federated Learning for
Focused Model Enhancement").

The objective is the priority devices' (sample-weighted) loss. Non-priority devices help only when
the global model fits their data about as well as it fits the priority devices' data:

- Section 3.1, selection rule: a non-priority device k is included in a round iff
  ``|F_k(w) - F(w)| <= epsilon_t``, with F(w) the global (priority) loss of the model w it received
  and F_k(w) the device's loss of w on its own data. The server sends w with F(w) and epsilon_t;
  the device evaluates w once (on the ``eval_samples`` the instruction asks) and reports F_k(w)
  with its own verdict (its incentive to take part); the server applies the rule to that same
  F_k(w), once, and asks the devices it admits to train.
- Sections 3.1-3.2, the threshold: "a chosen threshold (which can, in general be tuned in every
  communication round)", reduced in later rounds to remove the bias ("fine-tuning epsilon").
  Three forms (:meth:`FedALIGN.threshold`): a constant loss gap (``epsilon``), a gap relative to
  the priority loss (``relative_epsilon`` c: epsilon_t = c F(w_t)), and either of them decayed
  after the warm-up (``epsilon_decay``, ``epsilon_min``). The paper picks the value per dataset by
  trying values; ``bench/fedalign_epsilon.py`` does that on the priority devices' held-out data.
- Appendix A.1, eq. 15: the new model is the data-weighted mean of the included devices' models,
  renormalised by the data of the devices included this round (``WeightedSums`` with sample weights,
  per entry, so partial tails of EmbracingFL roles count only where they trained).
- Section 4: the first ``warmup`` rounds train the priority devices only.
- Appendix C.2: the FedProx variant adds the proximal term (``prox_mu``, factor 1 in the paper) to
  every device's local objective; the selection rule is unchanged.

One round, hook by hook:

1. ``configure``: every connected priority device gets ``evaluate`` then ``train`` (priority devices
   always take part); ``fraction`` of the non-priority devices are sampled.
2. When the priority devices' ``evaluate`` reports are in, F(w) is their sample-weighted mean loss
   and epsilon_t is set; the sampled non-priority devices get ``evaluate`` with ``config``
   ``global_loss`` = F(w) and ``epsilon`` = epsilon_t (what a device needs for its own check).
3. A non-priority ``evaluate`` report within epsilon_t gets a ``train`` follow-up on the same
   selection (the device reuses its download), unless the device declined: its own check
   (``within_epsilon`` = 0, :func:`edge_sdk.algorithms.fedalign.incentive_check`) said it is outside. That is
   the only loss check: a ``train`` report is folded if the device was asked to train and does
   not say ``within_epsilon`` = 0 on it. (The ``loss_before`` of a train report is measured on
   one training batch, a noisier number than the rule's F_k(w), and is not compared again.)
4. ``aggregate``: eq. 15 over the folded devices; ``RoundResult.extra`` names the included
   non-priority devices and their weights, and reports the priority loss and accuracy, the
   threshold, and the non-priority devices' own accuracy on the received model.

Which devices are priority is an operator's choice (:class:`PriorityRule`): device ids or globs, a
hello label (``priority=1``, ``edgetrain device --label priority=1``), or ``key=value`` on a label.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from orchestrator.strategies.base import (
    Combines,
    Weighting,
    DeviceReport,
    Instruction,
    Refused,
    RoundContext,
    RoundResult,
    Strategy,
    WeightedSums,
)
from orchestrator.strategies.groups import (
    PRIORITIZED_SERVER_SETTINGS, PriorityRule, json_ready, number_option, parse_ids, weighted_metrics,
)
from orchestrator.strategies.selection import Selection
from orchestrator.values import NonNegative, NonNegativeInt, Unit

__all__ = ["DEFAULT_EVAL_SAMPLES", "DEFAULT_RELATIVE_EPSILON", "DEFAULT_WARMUP", "FedALIGN"]

#: The default threshold, relative to the priority loss: epsilon_t = 0.5 F(w_t). Chosen with
#: ``bench/fedalign_epsilon.py`` (a grid scored on the priority devices' held-out data, every value
#: with :data:`DEFAULT_WARMUP` warm-up rounds): best or tied on the MNIST and TCGA-BRCA settings,
#: within one seed's noise of the best on Tiny Shakespeare; smaller gaps shut helpful devices out on
#: MNIST (BENCHMARKS.md, "FedALIGN's epsilon").
DEFAULT_RELATIVE_EPSILON = 0.5

#: Rounds that train the priority devices only before the selection rule runs (Section 4's warm-up).
#: Why there is one by default: in round 1 the model is the initial one, which fits nobody's data,
#: so every device's loss of it is about the same (near ln C for C classes) and |F_k(w) - F(w)| is
#: within any useful epsilon_t for every device, whatever its data: the rule cannot yet tell a
#: helpful device from a harmful one and admits them all. Their updates then pull the model towards
#: their own labels. Where the non-priority devices' labels differ from the priority devices'
#: (another label pair), that first pull is the largest the model ever gets and the rule, which
#: compares losses of the model it produced, does not undo it: on MNIST with every non-priority
#: device holding the 5 classes the priority devices lack (``bench/prioritized.py
#: --nonpriority-labels other``, 3 seeds, 30 rounds) epsilon_t = 0.5 F(w_t) without a warm-up ended
#: at 51.5 % [22.4, 70.5] on the priority classes, against 91.2 % for FedAvg over the priority
#: devices, which 3 warm-up rounds equal exactly (BENCHMARKS.md). After a few priority-only rounds
#: F(w) is the priority devices' own fit, below what the model scores on other data, and the gap
#: separates devices by what their data says. Every prioritized benchmark and the epsilon grid ran 3
#: (``bench/validated.toml``).
DEFAULT_WARMUP = 3

#: Local samples each device scores the received model on for F(w) and F_k(w): what the
#: natural-group benchmarks and the epsilon grid ran (the MNIST benchmark's devices hold fewer, so
#: they score all of theirs).
DEFAULT_EVAL_SAMPLES = 256


class FedALIGN(Strategy):
    """Prioritized FL: priority devices always train; a non-priority device is folded only when its
    loss on the received model is within epsilon_t of the priority loss (Section 3.1).

    The threshold epsilon_t (:meth:`threshold`) is one of:

    - ``epsilon``: a constant loss gap, as the paper's experiments (``inf``: every non-priority
      device, i.e. FedAvg on all; ``0``: in practice none, i.e. FedAvg on the priority devices);
      a program may pass a callable ``round -> epsilon`` instead;
    - ``relative_epsilon`` c: epsilon_t = c F(w_t), a gap relative to the priority loss (the
      default, c = :data:`DEFAULT_RELATIVE_EPSILON`; ``epsilon``, when given, replaces it). Why relative: an
      absolute gap means different things on different losses (a 5-class cross-entropy near 0.3,
      a 65-character one near 2.5, a loss that falls tenfold during training), so no constant is
      right across tasks or across the rounds of one task, while c F(w_t) tightens by itself as
      the priority loss falls, the fine-tuning of Section 3.2 without a schedule to tune. In the
      grid of ``bench/fedalign_epsilon.py`` c = 0.5 was the best value, or tied with it, on each of
      the three settings it was run on (MNIST, Shakespeare, TCGA-BRCA; BENCHMARKS.md). Smaller c
      shuts out helpful devices: F(w) is the priority devices' loss on their own training data,
      below what the same model scores on anyone else's data (c = 0.1 scored lower on MNIST and
      TCGA-BRCA, c = 0.02 on Shakespeare);
    - either of them decayed after the warm-up: ``epsilon_decay`` < 1 multiplies it by
      ``epsilon_decay ** (t - warmup - 1)`` in round t, never below ``epsilon_min`` (in the same
      unit: a loss gap, or a fraction of F(w_t)).

    ``warmup`` is the number of rounds that train the priority devices only (Section 4), 3 by
    default (:data:`DEFAULT_WARMUP` says why a warm-up is needed before the rule can select).
    ``eval_samples`` is the number of local samples each device scores the received model on, the
    same for F(w) and every F_k(w) (0: all of each device's samples, the paper's F_k exactly).
    ``prox_mu`` > 0 is the FedProx variant (appendix C.2). The defaults are the settings the
    prioritized benchmarks ran (``bench/validated.toml``; a test holds them equal).
    """

    name = "fedalign"
    combines = Combines.own("the priority devices' mean, other devices admitted by their loss against epsilon_t")
    #: The norm bound off where the user left it on (:data:`~orchestrator.strategies.groups.PRIORITIZED_SERVER_SETTINGS`).
    server_settings = PRIORITIZED_SERVER_SETTINGS

    def __init__(self, epsilon: NonNegative | Callable[[int], float] | None = None,
                 warmup: NonNegativeInt = DEFAULT_WARMUP, *,
                 relative_epsilon: NonNegative = DEFAULT_RELATIVE_EPSILON, epsilon_decay: Unit = 1.0,
                 epsilon_min: NonNegative = 0.0, eval_samples: NonNegativeInt = DEFAULT_EVAL_SAMPLES,
                 prox_mu: NonNegative = 0.0, priority: tuple[str, ...] | None = None,
                 priority_label: str = "priority", weighting: Weighting = "samples") -> None:
        if epsilon is not None and relative_epsilon != DEFAULT_RELATIVE_EPSILON:
            raise ValueError("give epsilon (a loss gap) or relative_epsilon (a fraction of the priority loss), not both")
        self.relative = epsilon is None
        self._epsilon_fn: Callable[[int], float] | None = epsilon if callable(epsilon) else None
        if self._epsilon_fn is not None:
            self.epsilon = math.nan
        elif self.relative:
            self.epsilon = number_option("relative_epsilon", relative_epsilon, allow_inf=True)
        else:
            self.epsilon = number_option("epsilon", epsilon, allow_inf=True)
        warm = number_option("warmup", warmup)
        if warm != int(warm):
            raise ValueError(f"warmup must be a whole number of rounds, got {warmup!r}")
        self.warmup = int(warm)
        self.epsilon_decay = number_option("epsilon_decay", epsilon_decay)
        if self.epsilon_decay > 1.0:
            raise ValueError(f"epsilon_decay must be in [0, 1], got {epsilon_decay!r}")
        self.epsilon_min = number_option("epsilon_min", epsilon_min, allow_inf=True)
        samples = number_option("eval_samples", eval_samples)
        if samples != int(samples):
            raise ValueError(f"eval_samples must be a whole number of samples, got {eval_samples!r}")
        self.eval_samples = int(samples)
        self.prox_mu = number_option("prox_mu", prox_mu)
        self.weighting = weighting
        self.rule = PriorityRule(parse_ids(priority), priority_label)
        self._reset()

    # -- per round --------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._sums: WeightedSums | None = None
        self._priority: list[str] = []
        self._candidates: list[str] = []  # sampled non-priority devices
        self._selection: dict[str, Selection] = {}
        self._evaluated: dict[str, tuple[float, float, int]] = {}  # device -> (loss, accuracy, samples)
        self._global_loss: float | None = None
        self._base = math.inf  # epsilon_at(round): a loss gap, or c of c F(w)
        self._eps = math.inf  # the round's threshold epsilon_t, a loss gap
        self._accepted: list[str] = []  # non-priority devices asked to train
        self._declined: list[str] = []  # non-priority devices whose own check said outside
        self._included: dict[str, float] = {}  # non-priority device -> fold weight
        self._refused = 0
        self._folded = 0.0  # sum of the fold weights

    def epsilon_at(self, round: int) -> float:
        """The threshold's scheduled value in ``round``: constant, decayed after the warm-up, or the
        callable's; a loss gap, or (``relative_epsilon``) the factor c of c F(w)."""
        if self._epsilon_fn is not None:
            return number_option("epsilon(round)", self._epsilon_fn(round), allow_inf=True)
        if self.epsilon_decay == 1.0 or math.isinf(self.epsilon):
            return self.epsilon
        return max(self.epsilon_min, self.epsilon * self.epsilon_decay ** max(0, round - self.warmup - 1))

    def threshold(self, round: int, priority_loss: float | None) -> float:
        """epsilon_t of Section 3.1 as a loss gap: :meth:`epsilon_at`, times F(w_t) when relative."""
        base = self.epsilon_at(round)
        if not self.relative or base == 0.0 or math.isinf(base):
            return base
        if priority_loss is None or not math.isfinite(priority_loss):
            return math.nan  # no F(w): no non-priority device can be admitted
        return base * abs(priority_loss)

    def configure(self, ctx: RoundContext) -> Sequence[Instruction]:
        self._reset()
        self._sums = WeightedSums(ctx.global_state)
        self._eps = self.threshold(ctx.round, None)  # set again once F(w) is known
        self._priority, others = self.rule.split(ctx.devices, ctx.devices)
        if ctx.round > self.warmup and others:  # Section 4: warm-up rounds train the priority devices only
            self._candidates = sorted(ctx.sample(others))
        for d in self._priority + self._candidates:
            self._selection[d] = Selection.tail(ctx.devices[d].split)
        out: list[Instruction] = []
        for d in self._priority:  # priority devices always take part: F(w) first, then their update
            out.append(Instruction(d, "evaluate", self._selection[d], config=self._eval_config(ctx, d)))
            out.append(Instruction(d, "train", self._selection[d], config=self._train_config()))
        if not self._priority:
            out.extend(self._ask_candidates(ctx))  # nothing to wait for (no priority device connected)
        return out

    def _eval_config(self, ctx: RoundContext, device: str) -> dict[str, float]:
        """The sample count of F_k(w): ``eval_samples``, or (0) all of the device's samples."""
        n = self.eval_samples or ctx.devices[device].num_samples
        return {"eval_samples": max(1, n)}

    def _train_config(self) -> dict[str, float]:
        return {"prox_mu": self.prox_mu} if self.prox_mu > 0 else {}

    def _weight(self, report: DeviceReport) -> float:
        return float(report.num_samples) if self.weighting == "samples" else 1.0

    def _ask_candidates(self, ctx: RoundContext) -> list[Instruction]:
        """Step 2: the non-priority devices receive w with F(w) and epsilon_t, and evaluate w."""
        config: dict[str, float] = {"epsilon": self._eps} if math.isfinite(self._eps) else {}
        if self._global_loss is not None and math.isfinite(self._global_loss):
            config["global_loss"] = self._global_loss
        return [Instruction(d, "evaluate", self._selection[d], config={**config, **self._eval_config(ctx, d)})
                for d in self._candidates]

    def _priority_loss_ready(self, ctx: RoundContext) -> list[Instruction]:
        """Once every priority device evaluated w (or vanished): F(w), then the non-priority devices."""
        if self._global_loss is not None or not self._priority:
            return []
        pending = [d for d in self._priority if d not in self._evaluated and ctx.state.expects(d, "evaluate")]
        if pending:
            return []
        # F(w) = sum_k n_k F_k(w) / sum_k n_k over the priority devices (the prioritized objective).
        losses = [(loss, n) for d, (loss, _, n) in self._evaluated.items() if d in self._priority and math.isfinite(loss)]
        total = sum(n for _, n in losses)
        self._global_loss = sum(loss * n for loss, n in losses) / total if total else math.nan
        self._eps = self.threshold(ctx.round, self._global_loss)
        return self._ask_candidates(ctx)

    def _within(self, loss: float) -> bool:
        """Section 3.1: |F_k(w) - F(w)| <= epsilon_t, F_k(w) being the device's evaluate report."""
        if math.isinf(self._eps):
            return True
        g = self._global_loss
        return g is not None and math.isfinite(g) and math.isfinite(loss) and abs(loss - g) <= self._eps

    # -- hooks ------------------------------------------------------------------------------------
    def on_report(self, report: DeviceReport, ctx: RoundContext) -> Sequence[Instruction]:
        if self._sums is None:
            raise RuntimeError("fedalign: report before configure")
        d = report.device_id
        if report.phase == "evaluate":
            self._evaluated[d] = (report.metric("loss"), report.metric("accuracy"), int(report.num_samples))
            if d in self._priority:
                return self._priority_loss_ready(ctx)
            if d in self._candidates and report.metric("within_epsilon", 1.0) == 0.0:
                self._declined.append(d)  # the device's own check said no (Section 3.1): it is not asked
                return ()
            if d in self._candidates and self._within(report.metric("loss")):
                self._accepted.append(d)  # the rule, applied once, to the loss the device reported (step 3)
                return [Instruction(d, "train", self._selection[d], config=self._train_config())]
            return ()
        if report.phase != "train":
            self._refused += 1
            raise Refused(f"fedalign has no {report.phase!r} phase")
        if d not in self._priority:
            # The rule was applied to this device's evaluate report (step 3): a train report is
            # taken from a device the rule admitted, unless the device itself declines on it.
            if report.metric("within_epsilon", 1.0) == 0.0:
                self._refused += 1
                raise Refused("the device declined: its own check found its loss outside epsilon")
            if d not in self._accepted:
                self._refused += 1
                raise Refused("fedalign did not admit this device this round: its evaluated loss was not within "
                              f"epsilon {self._eps:.6g} of the priority loss "
                              f"{self._global_loss if self._global_loss is not None else math.nan:.6g}")
        w = self._weight(report)
        # Appendix A.1, eq. 15: data-weighted mean over the devices included this round, per entry.
        self._sums.add_report(report, w)
        self._folded += w
        if d not in self._priority:
            self._included[d] = w
        return ()

    def on_missing(self, device_id: str, phases: Sequence[str], ctx: RoundContext) -> Sequence[Instruction]:
        if device_id in self._priority and "evaluate" in phases:
            return self._priority_loss_ready(ctx)  # decide without it
        return ()

    def round_complete(self, ctx: RoundContext) -> bool:
        # Not before the non-priority devices were asked (their evaluate follow-ups are still to come).
        if self._candidates and self._global_loss is None and self._priority:
            return False
        return super().round_complete(ctx)

    def aggregate(self, ctx: RoundContext) -> RoundResult:
        sums = self._sums if self._sums is not None else WeightedSums(ctx.global_state)
        total = self._folded
        included = {d: w / total for d, w in sorted(self._included.items())} if total else {}
        pri = weighted_metrics(self._evaluated, self._priority)
        non = weighted_metrics(self._evaluated, self._candidates)
        extra: dict[str, object] = {
            "strategy": self.name,
            "warmup": ctx.round <= self.warmup,
            "epsilon": self._eps if math.isfinite(self._eps) else ("inf" if math.isinf(self._eps) else None),
            "epsilon_form": "relative" if self.relative else "absolute",
            "priority_devices": len(self._priority),
            "priority_loss": self._global_loss,
            "priority_accuracy": pri[1],
            "nonpriority_asked": len(self._candidates),
            "nonpriority_loss": non[0],
            "nonpriority_accuracy": non[1],
            # Which non-priority devices went into the model, and their share of eq. 15's weights.
            "included": included,
            "excluded": sorted(set(self._candidates) - set(self._included)),
            "declined": sorted(self._declined),
        }
        self._sums = None
        return sums.result(ctx.round, self._refused, extra={k: json_ready(v) for k, v in extra.items()})
