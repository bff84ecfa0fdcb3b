"""Strategy options typed by the strategy's constructor: converted and checked here, and only here.

Options arrive as text from ``edgetrain serve -O key=value``, as TOML values (or text) from a fleet
file's ``[strategy]`` table, or as Python values; each is converted to its constructor parameter's
annotation by :func:`orchestrator.values.convert` (bool, int, float, str, ``Literal``, ``Enum``, tuples,
``Optional``; a range as ``Annotated[float, Range(...)]``). A parameter without an annotation takes its
value as given. Errors name the strategy, the option and what it accepts.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, get_type_hints

from orchestrator.values import accepted, convert

__all__ = ["OptionSpec", "StrategyOptionError", "convert_options", "option_specs", "typed_init"]


class StrategyOptionError(ValueError):
    """An option strategy ``strategy`` cannot take: ``option`` names it, ``problem`` says what is wrong."""

    def __init__(self, strategy: str, option: str, problem: str) -> None:
        self.strategy, self.option, self.problem = strategy, option, problem
        super().__init__(f"strategy {strategy!r}: option {option} {problem}")


@dataclass(frozen=True)
class OptionSpec:
    """One keyword option of a strategy: its name, type (with constraint) and default."""

    name: str
    hint: Any
    default: Any  # inspect.Parameter.empty: required

    @property
    def accepted(self) -> str:
        return accepted(self.hint)


@functools.cache
def option_specs(cls: type) -> dict[str, OptionSpec]:
    """The keyword options of strategy class ``cls``, read from its constructor's signature."""
    return _specs(cls.__init__)


@functools.cache
def _specs(init: Callable[..., None]) -> dict[str, OptionSpec]:
    try:
        hints = get_type_hints(init, include_extras=True)
    except (NameError, TypeError):  # annotations naming what the module does not import: take values as given
        hints = {}
    params = list(inspect.signature(init).parameters.values())[1:]  # after self
    return {p.name: OptionSpec(p.name, hints.get(p.name, Any), p.default) for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def typed_init(init: Callable[..., None]) -> Callable[..., None]:
    """``init`` (a strategy's ``__init__``) receiving each argument converted to its annotation, so a
    strategy built in Python is checked as one built from the command line."""

    @functools.wraps(init)
    def __init__(self: object, *args: object, **kwargs: object) -> None:
        bound = inspect.signature(init).bind(self, *args, **kwargs)
        specs = _specs(init)
        name = getattr(type(self), "name", type(self).__name__)
        for key, value in list(bound.arguments.items())[1:]:
            if key in specs:
                try:
                    bound.arguments[key] = convert(value, specs[key].hint)
                except ValueError as exc:
                    raise StrategyOptionError(name, key, str(exc)) from None
        init(*bound.args, **bound.kwargs)

    return __init__


def convert_options(name: str, cls: type, options: Mapping[str, object]) -> dict[str, object]:
    """``options`` typed for ``cls`` (registered as ``name``); ValueError names the strategy and option."""
    specs = option_specs(cls)
    typed: dict[str, object] = {}
    for key, value in options.items():
        spec = specs.get(key)
        if spec is None:
            raise StrategyOptionError(name, key, f"is not one of its options: {', '.join(specs) or 'none'}")
        try:
            typed[key] = convert(value, spec.hint)
        except ValueError as exc:
            raise StrategyOptionError(name, key, str(exc)) from None
    missing = [s.name for s in specs.values() if s.default is inspect.Parameter.empty and s.name not in typed]
    if missing:
        raise ValueError(f"strategy {name!r} needs the option(s) {', '.join(missing)}")
    return typed
