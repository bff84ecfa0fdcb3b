"""EmbracingFL partial averaging (Lee et al., "Embracing Federated Learning: Enabling Weak Client
Participation via Partial Model Training", Section 3.1 and Algorithm 2).

Every device trains a suffix of blocks ``[split, L)``; the model is x = (y, z) with y the input-side
layers only strong devices train and z the output-side layers all devices train. Section 3.1:

    y_{t+1} = y_t - (eta / s) sum_{i=1}^{s} sum_j grad f(y_{t,j}^i)    (averaged over the s strong devices)
    z_{t+1} = z_t - (eta / m) sum_{i=1}^{m} sum_j grad f(z_{t,j}^i)    (averaged over all m devices)

and Algorithm 2, "Model aggregation": z_{t+1} = (1/m) sum_{i=1}^{m} z_t^i. Since a device's delta
is -eta sum_j grad f(.), both rules are "old + mean of deltas over the devices that trained the
entry". With more than two roles (strong, moderate, weak) the same rule applies per entry: each
entry k is averaged over exactly its contributors C_k,

    x_{t+1}[k] = x_t[k] + sum_{i in C_k} w_i delta_i[k] / sum_{i in C_k} w_i,

with w_i = 1 (``weighting="uniform"``: the paper's 1/s and 1/m exactly) or the device's sample
count (``weighting="samples"``, the default, as FedAvg weights devices). Entries nobody trained
this round keep their old value.

Roles belong to this algorithm: a device trains the suffix its plan gives it (the default
:meth:`~orchestrator.strategies.base.Strategy.configure`), and every report must cover exactly that
suffix, ending at the last block (the server checks the names against the tail it sent).
"""

from __future__ import annotations

from orchestrator.strategies.base import AveragingStrategy, DeviceReport, RoundContext

#: The planner's roles (EmbracingFL Section 4: strong trains all, moderate ~40%, weak ~15% of memory).
ROLES: tuple[str, ...] = ("strong", "moderate", "weak")


class EmbracingFL(AveragingStrategy):
    """Per-entry averaging over the devices that trained each entry (partial model training).

    :class:`~orchestrator.strategies.base.WeightedSums` keeps, per entry, sum_{i in C_k} w_i delta_i
    and sum_{i in C_k} w_i: the numerators and denominators of the Section 3.1 rules for y and z.
    """

    name = "embracingfl"

    def admit(self, report: DeviceReport, ctx: RoundContext) -> str | None:
        if report.role not in ROLES:
            return f"unknown role {report.role!r}; roles are {', '.join(ROLES)}"
        start, stop = report.trained
        if ctx.blocks and stop != len(ctx.blocks):
            return f"trained range [{start}, {stop}) must end at the last block ({len(ctx.blocks)})"
        if start != report.selection.split:
            return f"trained range [{start}, {stop}) is not the tail [{report.selection.split}, L) it was sent"
        return None
