"""FedALIGN on the device: its own incentive check (Lamsal et al., "FedALIGN: Federated Adaptive
Learning with Inclusion of Global Needs", Section 3.1; the server side is
``orchestrator/strategies/fedalign.py``).

A non-priority device k takes part in a round only if ``|F_k(w) - F(w)| <= epsilon`` for the model w
it received, with F(w) the global (priority) loss. The server sends ``global_loss`` = F(w) and
``epsilon`` in an ``evaluate`` instruction's config; after the evaluation (F_k(w) = its ``loss``) the
device reports its verdict ``within_epsilon`` (1 or 0), and repeats it on a ``train`` report of the
same round, so a device that gets a ``train`` anyway says it declined. The server decides, and
checks again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from edge_sdk import protocol as p
from edge_sdk.phases import PhaseContext

__all__ = ["DEVICE_STEPS", "VERDICT", "incentive_check"]

#: The report metric (and round note) holding the device's verdict, 1 or 0.
VERDICT = "within_epsilon"


def incentive_check(metrics: Mapping[str, p.Scalar], config: Mapping[str, p.Scalar]) -> bool | None:
    """FedALIGN Section 3.1, the device's own check: is |F_k(w) - F(w)| <= epsilon for the received
    model w? ``metrics`` are this device's ``evaluate`` results (F_k(w) = ``loss``), ``config`` the
    instruction's (``global_loss`` = F(w), ``epsilon``). None when the server asked for no check."""
    if "global_loss" not in config or "epsilon" not in config:
        return None
    try:
        loss, g, eps = float(metrics.get("loss", math.nan)), float(config["global_loss"]), float(config["epsilon"])
    except (TypeError, ValueError):
        return False
    return math.isfinite(loss) and math.isfinite(g) and abs(loss - g) <= eps


def check_after_evaluate(ctx: PhaseContext, metrics: dict[str, p.Scalar]) -> None:
    """After ``evaluate``: make the check when the server asked for it, report and remember the verdict."""
    verdict = incentive_check(metrics, ctx.instruction.config)
    if verdict is None:
        return
    ctx.notes[VERDICT] = metrics[VERDICT] = int(verdict)
    ctx.event("incentive_check", {"device": ctx.device_id, "round": ctx.instruction.round, VERDICT: verdict})


def verdict_after_train(ctx: PhaseContext, metrics: dict[str, p.Scalar]) -> None:
    """After ``train``: a train report of a round whose check was made carries its verdict (a train
    report always carries tensors, so a device that declined says so here; the server refuses it)."""
    if VERDICT in ctx.notes:
        metrics[VERDICT] = ctx.notes[VERDICT]


#: This algorithm's entries for DeviceRegistry.extended.
DEVICE_STEPS = {"after": {"evaluate": check_after_evaluate, "train": verdict_after_train}}
