"""FedAvg (McMahan et al., 2017): every device trains the whole model; the server averages.

x_{t+1} = x_t + sum_i w_i (x_t^i - x_t) / sum_i w_i, with w_i the device's sample count
(``weighting="samples"``, the paper's n_k / n) or 1 (``weighting="uniform"``).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.strategies.base import AveragingStrategy, DeviceReport, Instruction, RoundContext
from orchestrator.strategies.selection import Selection


class FedAvg(AveragingStrategy):
    """Weighted mean of full-model deltas: every sampled device is asked for the whole model (split 0).

    The server sends that instruction only to devices whose budget holds the whole model, so weak
    devices drop out as they do in plain FedAvg (the baseline EmbracingFL improves on); a report
    that covers less than the whole model is refused, since FedAvg has no rule for it.
    """

    name = "fedavg"

    def configure(self, ctx: RoundContext) -> Sequence[Instruction]:
        planned = super().configure(ctx)
        return [Instruction(i.device_id, "train", Selection.tail(0)) for i in planned]

    def admit(self, report: DeviceReport, ctx: RoundContext) -> str | None:
        missing = [k for k in ctx.global_state if k not in report.tensors]
        if missing:
            return (
                f"FedAvg needs the whole model, but the report (role {report.role}, trained blocks "
                f"{tuple(report.trained)}) lacks {len(missing)} of {len(ctx.global_state)} entries, "
                f"e.g. {missing[0]!r}; use a partial-training strategy such as embracingfl"
            )
        return None
