"""Plans by device profile: a hello whose profile the server has planned before is not planned again.

A fleet is a few device classes many times over: ten thousand phones declare a handful of distinct
(budget, cores, runtimes, data size) profiles. Planning a hello walks every split of the model
(footprints, chunk grouping) and, for a device on the ONNX Runtime backend, checks the split's
training graph in a worker thread; with this cache that happens once per distinct profile, and every
other hello of the profile takes the same :class:`~profiles.planner.Plan` object (plans are
immutable), so a registry of N devices holds N references to a few plans.

The key is everything the plan depends on (:meth:`Orchestrator.plan_key`): the model, the planner's
batch, budget, cores, training backend, local sample count, the rows a row-selecting strategy plans
for, and a forced split where the server honours one. What depends on the server's state rather than
the hello (the splits whose training graph ships) clears the cache when it changes. Refusals (no
split fits) are cached too, so a stream of hellos that cannot fit costs one planning.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from profiles.planner import Plan

__all__ = ["PlanCache"]


class PlanCache:
    """A bounded LRU map from a profile key to its plan, or to the refusal planning gave it."""

    def __init__(self, max_entries: int = 4096) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, Plan | str] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: Hashable) -> Plan | str | None:
        """The cached plan (or refusal message) for ``key``, or None if it was never planned."""
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return found

    def peek(self, key: Hashable) -> Plan | str | None:
        """As :meth:`get`, without counting: for a lookup repeated while waiting to plan."""
        return self._entries.get(key)

    def put(self, key: Hashable, plan: Plan | str) -> None:
        self._entries[key] = plan
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._entries), "hits": self.hits, "misses": self.misses}
