"""Which run a store holds, and where a server starting on it begins.

A store belongs to one run: its model, strategy and seed are kept in the store's metadata. A fresh
server refuses a store that already holds completed rounds; with ``resume`` it checks that the
store is a run of the same model, strategy and seed and continues after its last completed round,
from that round's checkpoint, so that no completed round is lost (docs/architecture.md,
"Qualities and how they are kept").
"""

from __future__ import annotations

import logging

import numpy as np

from edge_sdk.models import LayeredModel
from orchestrator.config import ServerConfig
from orchestrator.parts import RunStart
from orchestrator.store import Store

__all__ = ["start_run"]

log = logging.getLogger("edgetrain.server")


def start_run(config: ServerConfig, store: Store, strategy: str, template: LayeredModel) -> RunStart:
    """Claim ``store`` for this run (model, strategy, seed) and say where it starts: round 1 from
    ``template``'s state, or with ``resume`` after the store's last completed round, from its checkpoint."""
    identity = {"model": config.model, "strategy": strategy, "seed": str(config.seed)}
    initial = {k: v.detach().numpy().copy() for k, v in template.state_dict().items()}
    start = RunStart(1, initial)
    if config.resume:
        for key, value in identity.items():
            stored = store.meta.get(key)
            if stored is not None and stored != value:
                raise ValueError(f"--resume: the store at {config.store_dir} was a run with {key}={stored}, not {value}")
        last = store.checkpoints.last()
        if last is not None:
            done, state = last
            missing = set(initial) - set(state)
            if missing:
                raise ValueError(f"checkpoint of round {done} lacks {sorted(missing)[:3]}")
            history = [r.get("metrics", {}) for r in store.rounds.all() if r.get("metrics")]
            start = RunStart(done + 1, {k: np.asarray(state[k]).copy() for k in initial}, history)
            log.info("resuming after round %d", done)
    elif any(r["complete"] for r in store.rounds.all()):
        raise ValueError(f"{config.store_dir} already holds a run; pass --resume to continue it or choose a fresh --store")
    for key, value in identity.items():
        store.meta.record(key, value)
    return start
