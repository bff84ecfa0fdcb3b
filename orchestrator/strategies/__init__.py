"""Aggregation strategies: one class per algorithm behind one small interface.

``make_strategy("embracingfl", weighting="uniform")`` builds one by name. A new algorithm is one
module with a :class:`Strategy` subclass plus one line in ``_STRATEGIES`` below.
"""

from __future__ import annotations

import inspect
from types import MappingProxyType

from orchestrator.strategies.base import (
    ROLES,
    WEIGHTINGS,
    AveragingStrategy,
    DeviceUpdate,
    RoundResult,
    Strategy,
    UpdateRejected,
    WeightedSums,
)
from orchestrator.strategies.embracing import EmbracingFL
from orchestrator.strategies.fedavg import FedAvg

_STRATEGIES = MappingProxyType(
    {
        cls.name: cls
        for cls in (
            FedAvg,
            EmbracingFL,
        )
    }
)
STRATEGY_NAMES: tuple[str, ...] = tuple(_STRATEGIES)


def make_strategy(name: str, **options: object) -> Strategy:
    """Build the strategy registered as ``name`` with its keyword options."""
    try:
        cls = _STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGY_NAMES)}") from None
    try:
        inspect.signature(cls).bind(**options)
    except TypeError as exc:
        raise ValueError(f"strategy {name!r}: bad options {sorted(options)}: {exc}") from None
    return cls(**options)


__all__ = [
    "ROLES",
    "STRATEGY_NAMES",
    "WEIGHTINGS",
    "AveragingStrategy",
    "DeviceUpdate",
    "EmbracingFL",
    "FedAvg",
    "RoundResult",
    "Strategy",
    "UpdateRejected",
    "WeightedSums",
    "make_strategy",
]
