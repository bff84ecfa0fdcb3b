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
"""

from __future__ import annotations

from orchestrator.strategies.base import AveragingStrategy


class EmbracingFL(AveragingStrategy):
    """Per-entry averaging over the devices that trained each entry (partial model training).

    :class:`~orchestrator.strategies.base.WeightedSums` keeps, per entry, sum_{i in C_k} w_i delta_i
    and sum_{i in C_k} w_i: the numerators and denominators of the Section 3.1 rules for y and z.
    """

    name = "embracingfl"
