"""Round validation: the aggregated model is scored on the server's held-out data before it is
committed, and a round whose loss jumps is not committed.

The bound: the candidate's validation loss may be at most ``(1 + max_loss_rise) x L + SLACK``,
L the validation loss of the model it would replace (the last committed one). Honest rounds lower
the loss or raise it a little (a noisy round of partial training); a poisoned one, whose update
was scaled, flipped or shifted past every other bound, multiplies it (from 0.5 to 10 and more
for a classifier). A refused round is not committed, so it never reaches a checkpoint and
``--resume`` never starts from it: the round loop runs it again from the last good state and,
after ``round_retries`` tries, journals it as failed with the model unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["SLACK", "RoundValidation"]

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
        return math.inf if self.loss is None else (1 + self.max_rise) * self.loss + SLACK

    def judge(self, metrics: Mapping[str, float]) -> str | None:
        """None if a candidate scored ``metrics`` (with ``test_loss``) may be committed, else why not."""
        loss = metrics.get("test_loss")
        if loss is None or self.loss is None:
            return None
        if not math.isfinite(loss):
            return f"validation loss is {loss}"
        if loss > self.limit():
            return (f"validation loss rose from {self.loss:.4g} to {loss:.4g}, over the bound "
                    f"(1 + {self.max_rise:g}) x {self.loss:.4g} + {SLACK:g} = {self.limit():.4g}")
        return None

    def committed(self, metrics: Mapping[str, float]) -> None:
        """The candidate scored ``metrics`` became the global model."""
        loss = metrics.get("test_loss")
        if loss is not None and math.isfinite(loss):
            self.loss = float(loss)
