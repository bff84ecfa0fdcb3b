"""The server settings a strategy needs other than the server's defaults (``Strategy.server_settings``),
applied where a run's settings are made (``edgetrain serve``, ``edgetrain emulate``) and said in one
line each, so a user sees which defaults a strategy turns off and why.

A setting the user gave (on the command line, in a fleet's ``[training]`` table, or a value other than
the server's default) is kept: the line then says what the strategy would need instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from orchestrator.config import ServerConfig
from orchestrator.strategies import strategy_class

__all__ = ["apply_server_settings"]


def _default(name: str) -> object:
    f = ServerConfig.__dataclass_fields__[name]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]


def apply_server_settings(config: ServerConfig, given: Collection[str] = (),
                          spell=lambda name: name) -> tuple[ServerConfig, list[str]]:
    """``config`` with its strategy's ``server_settings`` applied where the user left the server's
    default (``given``: settings the user named, kept even at their default value), and one line per
    setting saying what was done and why. ``spell`` names a setting as the user spells it
    (``--norm-bound``, ``training.norm_bound``)."""
    cls = strategy_class(config.strategy)
    changes: dict[str, object] = {}
    lines = []
    for name, need in cls.server_settings.items():
        value, default = getattr(config, name), _default(name)
        if value == need.value:
            continue
        if name in given or value != default:
            lines.append(f"{cls.name}: keeping {spell(name)} {value} as given, though {cls.name} needs "
                         f"{need.value}: {need.why}")
            continue
        changes[name] = need.value
        lines.append(f"{cls.name} sets {spell(name)} {need.value} (the server's default: {default}): {need.why}")
    return (dataclasses.replace(config, **changes) if changes else config), lines
