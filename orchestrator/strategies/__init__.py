"""Aggregation strategies: one class per algorithm behind one small interface.

``make_strategy("embracingfl", weighting="uniform")`` builds one by name. A new algorithm is one
module with a :class:`Strategy` subclass plus one line in ``_STRATEGIES`` below; the interface and
a worked example are in docs/architecture.md, "Strategies".
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from edge_sdk.references import is_reference, load_reference
from orchestrator.strategies.base import (
    WEIGHTINGS,
    AveragingStrategy,
    Broadcast,
    Combines,
    DeviceInfo,
    DeviceReport,
    Instruction,
    Refused,
    RoundContext,
    RoundResult,
    Strategy,
    WeightedSums,
)
from orchestrator.strategies.embracing import ROLES, EmbracingFL
from orchestrator.strategies.fedalign import FedALIGN
from orchestrator.strategies.fedavg import FedAvg
from orchestrator.strategies.varsel import VaRSeL
from orchestrator.strategies.fedsubavg import FedSubAvg
from orchestrator.strategies.options import StrategyOptionError, convert_options
from orchestrator.strategies.width import WidthReduction

_STRATEGIES = MappingProxyType(
    {
        cls.name: cls
        for cls in (
            FedAvg,
            EmbracingFL,
            FedSubAvg,
            FedALIGN,
            VaRSeL,
            WidthReduction,
        )
    }
)
STRATEGY_NAMES: tuple[str, ...] = tuple(_STRATEGIES)


def strategy_class(name: str) -> type[Strategy]:
    """The class registered as ``name``, or ``package.module:Class`` for a strategy of your own."""
    if is_reference(name):
        cls = load_reference(name, "strategy")
        if not (isinstance(cls, type) and issubclass(cls, Strategy)):
            raise ValueError(f"{name!r} is not a Strategy subclass")
        return cls
    try:
        return _STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGY_NAMES)}, "
                         "or package.module:Class") from None


def make_strategy(name: str, **options: object) -> Strategy:
    """Build the strategy registered as ``name`` (or ``package.module:Class``) with its keyword options,
    each converted to its constructor annotation (text from the command line included; see
    :mod:`orchestrator.strategies.options`)."""
    cls = strategy_class(name)
    typed = convert_options(name, cls, options)
    try:
        return cls(**typed)
    except StrategyOptionError:
        raise
    except ValueError as exc:  # a check of the constructor's own (one option against another)
        raise ValueError(f"strategy {name!r}: {exc}") from None


def strategy_options(name: str, options: Mapping[str, object]) -> dict[str, object]:
    """``options`` of strategy ``name`` typed and checked from its constructor's signature, without
    building it (a fleet file's [strategy] table); the constructor's own checks run when it is built."""
    return convert_options(name, strategy_class(name), options)


__all__ = [
    "ROLES",
    "STRATEGY_NAMES",
    "WEIGHTINGS",
    "AveragingStrategy",
    "Broadcast",
    "Combines",
    "DeviceInfo",
    "DeviceReport",
    "EmbracingFL",
    "FedALIGN",
    "FedAvg",
    "Instruction",
    "Refused",
    "RoundContext",
    "RoundResult",
    "Strategy",
    "VaRSeL",
    "WeightedSums",
    "WidthReduction",
    "make_strategy",
    "strategy_class",
    "strategy_options",
]
