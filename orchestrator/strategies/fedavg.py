"""FedAvg (McMahan et al., 2017): every device trains the whole model; the server averages.

x_{t+1} = x_t + sum_i w_i (x_t^i - x_t) / sum_i w_i, with w_i the device's sample count
(``weighting="samples"``, the paper's n_k / n) or 1 (``weighting="uniform"``).
"""

from __future__ import annotations

from orchestrator.strategies.base import AveragingStrategy, DeviceUpdate


class FedAvg(AveragingStrategy):
    """Weighted mean of full-model deltas. A partial update is refused: FedAvg has no rule for it."""

    name = "fedavg"

    def _check(self, update: DeviceUpdate) -> str | None:
        missing = [k for k in self.global_state if k not in update.deltas]
        if missing:
            return (
                f"FedAvg needs the whole model, but the update (role {update.role}, trained blocks "
                f"{tuple(update.trained)}) lacks {len(missing)} of {len(self.global_state)} entries, "
                f"e.g. {missing[0]!r}; use a partial-training strategy such as embracingfl"
            )
        return None
