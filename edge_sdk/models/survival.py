"""Survival analysis: a linear Cox proportional-hazards model (FLamby's Fed-TCGA-BRCA baseline, a
linear layer from 39 clinical features to a log-risk score) trained with the Cox partial likelihood.

Targets are (n, 2) float arrays: column 0 the event indicator E (1: death observed, 0: censored),
column 1 the time T. The loss of a batch is the negative partial log-likelihood per event, with
each risk set's sum replaced by its mean:

    loss = (1 / #events) sum_{i: E_i = 1} [ log mean_{j: T_j >= T_i} exp(r_j) - r_i ]

The mean differs from the sum (Cox's form) by log |R_i|, a constant of the data, so the gradient is
the same; it makes the loss 0 for a model that ranks no one above anyone (r constant) on any number
of patients, so the losses of devices with different numbers of patients can be compared (FedALIGN
compares them, Section 3.1). A batch without an event has loss 0.
"""

from __future__ import annotations

import torch
from torch import nn

from edge_sdk.models.layered import LayeredModel

__all__ = ["CoxModel", "cox_linear", "cox_loss"]


def cox_loss(risk: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The partial likelihood loss above for log-risk scores ``risk`` (n,) or (n, 1) and ``target`` (n, 2)."""
    r = risk.reshape(-1)
    event, time = target[:, 0].to(r.dtype), target[:, 1].to(r.dtype)
    at_risk = time[None, :] >= time[:, None]  # row i: the risk set of patient i
    masked = torch.where(at_risk, r[None, :], torch.full_like(r[None, :].expand_as(at_risk), -torch.inf))
    log_mean = torch.logsumexp(masked, dim=1) - torch.log(at_risk.sum(dim=1).to(r.dtype))
    events = event.sum()
    if float(events) == 0.0:
        return (r * 0.0).sum()
    return ((log_mean - r) * event).sum() / events


class CoxModel(LayeredModel):
    """A layered model whose loss is :func:`cox_loss` (task ``survival``: no accuracy)."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cox_loss(output, target)


def cox_linear(features: int = 39) -> LayeredModel:
    """1 block: linear, ``features`` -> 1 log-risk score."""
    return CoxModel("cox_linear", [("linear", nn.Linear(features, 1))], input_shape=(features,), task="survival",
                    num_outputs=1)
