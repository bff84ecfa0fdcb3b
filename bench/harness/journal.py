"""What the benchmarks read from a finished (or running) run's journal: the server's store.

The store is the server's own (orchestrator/store/) and its interface is the server's to change;
the benchmarks read it here only, read-only, so that such a change is mended in one place. The
rest of a run the benchmarks get from the public entry points: ``Orchestrator``'s history and
events, the emulator's run functions, ``edgetrain emulate``'s metrics.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["final_correct", "round_metrics", "updates"]


def _open(store: Path | str):
    from orchestrator.store import Store

    return Store.open_readonly(store)


def updates(store: Path | str) -> list[dict[str, Any]]:
    """Every update the server journaled (device, round, phase, whether a bound changed it ...)."""
    with _open(store) as journal:
        return journal.reports.all()


def round_metrics(store: Path | str) -> list[dict[str, Any]] | None:
    """The metrics of every completed round, in order (None: no store there yet)."""
    try:
        journal = _open(store)
    except FileNotFoundError:
        return None
    with journal:
        rounds = journal.rounds.all()
    return [r["metrics"] for r in rounds if r["complete"] and r["metrics"]]


def final_correct(config: Any, store: Path | str) -> str:
    """Per held-out example the server scores, whether the run's last model gets it right ("0"/"1"),
    scored by the server's own evaluator on the same examples ("": no round completed)."""
    from edge_sdk.models import build_model
    from orchestrator.server.evaluate import Evaluator
    from orchestrator.server.payloads import model_at

    with _open(store) as journal:
        last = journal.checkpoints.last()
    if last is None:
        return ""
    template = build_model(config.model, seed=config.seed)
    return "".join("1" if c else "0" for c in Evaluator(config, template).correct(model_at(template, last[1])))
