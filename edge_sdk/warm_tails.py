"""Built tail models kept for the next round, so a device does not build its model every round.

Building a zoo model, even on torch's ``meta`` device with only the trained blocks materialised
(:func:`edge_sdk.trainer.build_tail`), costs a few milliseconds of Python per round; on an emulator
worker that runs hundreds of devices it is a fixed cost per device and round, beside a training step
of a similar size. A :class:`WarmTails` keeps the tails that finished a round and hands one out
again for the same model, split, table rows and build options.

Nothing of a previous round survives in a tail that is handed out again: the caller loads the
round's state into it (:func:`edge_sdk.trainer.load_tail_state` overwrites every entry of blocks
[split, L) and refuses a state that is not exactly those entries, at those shapes), builds a new
optimiser for the round and drops the gradients when training ends. A tail is keyed by the model's
factory (a factory registered again under the same name is another model), the split, the rows of
each cut embedding table and the build options (a channel slice's width), so a new split or a new
slice always gets a freshly built tail. At most ``keep`` idle tails are held per key: a device that
is not training holds none (the emulator shares one pool between all the devices of a worker).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_sdk.models import LayeredModel

__all__ = ["WarmTails"]


class WarmTails:
    """A pool of built tails, shared by the devices of one process; thread-safe."""

    def __init__(self, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.keep = keep
        self._idle: dict[Hashable, list[LayeredModel]] = {}
        self._lock = threading.Lock()
        self.built = 0  # tails built (a miss)
        self.reused = 0  # tails handed out again (a hit)

    @staticmethod
    def key(model_name: str, split: int, table_rows: Mapping[str, int] | None = None,
            options: Mapping[str, Any] | None = None) -> Hashable:
        """What a tail's structure depends on: the model's factory, split, cut tables and build options."""
        from edge_sdk.models.zoo import model_spec

        return (model_name, model_spec(model_name).factory, int(split),
                tuple(sorted((table_rows or {}).items())), tuple(sorted((options or {}).items())))

    def take(self, model_name: str, split: int, table_rows: Mapping[str, int] | None = None,
             **options: Any) -> LayeredModel:
        """A tail for this model and split: an idle one if the pool holds one, else a new one. Its
        values are whatever the last round left: load the round's state before using it."""
        from edge_sdk.trainer import build_tail

        key = self.key(model_name, split, table_rows, options)
        with self._lock:
            idle = self._idle.get(key)
            if idle:
                self.reused += 1
                return idle.pop()
            self.built += 1
        model = build_tail(model_name, split, table_rows, **options)
        model._warm_key = key  # type: ignore[attr-defined]  # where give_back files it
        return model

    def give_back(self, model: LayeredModel) -> None:
        """Keep a tail for a later round (beyond ``keep`` idle ones per key it is dropped)."""
        key = getattr(model, "_warm_key", None)
        if key is None:
            return
        for param in model.parameters():
            param.grad = None
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.keep and all(m is not model for m in idle):
                idle.append(model)

    def clear(self) -> None:
        """Drop every idle tail."""
        with self._lock:
            self._idle.clear()

    def idle(self) -> int:
        """Idle tails held, over all keys."""
        with self._lock:
            return sum(len(v) for v in self._idle.values())
