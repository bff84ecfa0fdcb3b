"""Whether a round's model may be committed: its values are finite, the frozen chunks the connected
devices will need export and verify (:meth:`CommitCheck.check_state`), and its loss on the server's
held-out data did not jump (:meth:`CommitCheck.validate`).

The bound: the candidate's validation loss may be at most ``L + max_loss_rise x |L| + SLACK``,
L the validation loss of the model it would replace (the last committed one); for a loss >= 0, as a
classifier's, that is ``(1 + max_loss_rise) x L + SLACK``, and a loss that may be negative (the Cox
partial likelihood's mean over risk sets) is bounded by the same margin above it. Honest rounds lower
the loss or raise it a little (a noisy round of partial training); a poisoned one, whose update
was scaled, flipped or shifted past every other bound, multiplies it (from 0.5 to 10 and more
for a classifier). A refused round is not committed, so it never reaches a checkpoint and
``--resume`` never starts from it: the round loop runs it again from the last good state and,
after ``round_retries`` tries, journals it as failed with the model unchanged.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np

from edge_sdk.models import LayeredModel
from orchestrator.config import ServerConfig
from orchestrator.parts import Session
from orchestrator.server.evaluate import Evaluator
from orchestrator.server.payloads import Payloads, model_at
from orchestrator.strategies import Strategy

__all__ = ["SLACK", "CommitCheck", "RoundValidation"]

log = logging.getLogger("edgetrain.server")

#: Absolute rise (nats) always allowed, so that a model near zero loss may still move.
SLACK = 0.1


@dataclass
class RoundValidation:
    """The committed model's validation loss and the bound a candidate's must keep."""

    max_rise: float
    loss: float | None = None  # of the committed model; None: not scored yet

    @property
    def enabled(self) -> bool:
        return self.max_rise > 0

    def limit(self) -> float:
        return math.inf if self.loss is None else self.loss + self.max_rise * abs(self.loss) + SLACK

    def judge(self, metrics: Mapping[str, float]) -> str | None:
        """None if a candidate scored ``metrics`` (with ``test_loss``) may be committed, else why not."""
        loss = metrics.get("test_loss")
        if loss is None or self.loss is None:
            return None
        if not math.isfinite(loss):
            return f"validation loss is {loss}"
        if loss > self.limit():
            return (f"validation loss rose from {self.loss:.4g} to {loss:.4g}, over the bound "
                    f"{self.loss:.4g} + {self.max_rise:g} x |{self.loss:.4g}| + {SLACK:g} = {self.limit():.4g}")
        return None

    def disable(self) -> None:
        """No validation from now on (held-out data the model cannot take)."""
        self.max_rise = 0.0

    def committed(self, metrics: Mapping[str, float]) -> None:
        """The candidate scored ``metrics`` became the global model."""
        loss = metrics.get("test_loss")
        if loss is not None and math.isfinite(loss):
            self.loss = float(loss)


class CommitCheck:
    """The checks a round's candidate model passes before it is committed, and the scores of the
    committed one. Blocking: the round loop runs each in a worker thread."""

    def __init__(self, config: ServerConfig, template: LayeredModel, strategy: Strategy, payloads: Payloads,
                 sessions: Mapping[str, Session], evaluator: Evaluator, heap: AbstractContextManager) -> None:
        self.template, self.strategy, self.payloads, self.sessions = template, strategy, payloads, sessions
        self.evaluator, self.heap = evaluator, heap
        self.validator = evaluator.subset(config.validation_samples, config.seed)
        self.validation = RoundValidation(config.max_loss_rise)

    def score(self, evaluator: Evaluator, state: Mapping[str, np.ndarray]) -> dict[str, float]:
        """``evaluator``'s scores of the model at ``state``."""
        with self.heap:
            return evaluator.evaluate(model_at(self.template, state))

    def evaluation(self, state: Mapping[str, np.ndarray], scored: Mapping[str, float]) -> dict[str, float]:
        """The evaluation of the committed ``state``: its validation scores ``scored`` when they
        covered the whole held-out set, else the evaluator's."""
        reuse = dict(scored) if self.validator is self.evaluator else {}
        return reuse or self.score(self.evaluator, state)

    def check_state(self, state: Mapping[str, np.ndarray]) -> str | None:
        """None if ``state`` may become the global model, else why not: every value finite, and
        the frozen chunks the connected devices will need export and verify against torch (they
        are then cached for the next round). Checked before the checkpoint is written, so a
        resumed server never starts from a state that cannot be served."""
        for name, value in state.items():
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                return f"non-finite values in {name}"
        ranges = sorted({(int(a), int(b)) for s in list(self.sessions.values()) for a, b in s.plan.chunks})
        if not ranges or not self.strategy.sends_chunks:  # width reduction sends none
            return None
        with self.heap:  # torch exports and runs the chunks
            return self.payloads.check_chunks(state, ranges)

    def validate(self, state: Mapping[str, np.ndarray],
                 committed: Mapping[str, np.ndarray]) -> tuple[str | None, dict[str, float]]:
        """Score ``state`` on the validation samples: (why it may not be committed, or None; its
        scores). The ``committed`` model is scored first if it has not been (round 1, --resume)."""
        if not self.validation.enabled:
            return None, {}
        try:
            if self.validation.loss is None:
                self.validation.committed(self.score(self.validator, committed))
            scored = self.score(self.validator, state)
        except (RuntimeError, ValueError) as exc:  # held-out data the model cannot take: no validation
            log.warning("round validation is off: the model cannot be scored on --data (%s)", exc)
            self.validation.disable()
            return None, {}
        return self.validation.judge(scored), scored

    def committed(self, scored: Mapping[str, float]) -> None:
        """The candidate scored ``scored`` became the global model."""
        self.validation.committed(scored)
