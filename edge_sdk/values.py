"""Typed values from command-line text or TOML, checked against the constraint their type declares.

One converter serves every front end, on both sides of the wire: the device's settings (``python -m
edge_sdk`` options, its config file, the emulator's launch records: :mod:`edge_sdk.settings`),
``edgetrain serve`` options and a fleet file's ``[training]`` table (both against
:class:`orchestrator.config.ServerConfig`'s field types), and strategy options (``-O key=value``, a
fleet's ``[strategy]`` table, Python keywords) against each strategy's constructor annotations. It
lives in the device SDK (standard library only) so that the device and the server refuse a bad value
with the same words and the same :class:`SettingError`. Supported: ``bool`` (true/false, 1/0, yes/no, on/off in text), ``int``, ``float``, ``str``,
``Path``, ``Literal[...]``, ``Enum``, ``tuple``/``Sequence`` (comma-separated in text), ``Optional``
(``none`` in text) and unions of these; a constraint rides along as ``Annotated[float, Range(0, 1)]``.

Errors are :class:`ValueError` saying what is accepted (``must be a number in (0, 1], got 3.0``); the
caller prefixes its own spelling of the name (``--lr-decay``, ``training.lr_decay``) in a
:class:`SettingError`.
"""

from __future__ import annotations

import enum
import inspect
import math
import os
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

__all__ = ["ByteSize", "Count", "Fraction", "NonNegative", "NonNegativeInt", "Positive", "Range", "SettingError", "Unit",
           "accepted", "convert", "split_annotated"]

TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off")
NONE_WORDS = ("none", "")


class SettingError(ValueError):
    """A setting that cannot be used: ``name`` is how the user named it (a field, ``--budget``,
    ``device.toml: budget``, ``training.lr``), ``problem`` what is wrong with its value."""

    def __init__(self, name: str, problem: str) -> None:
        self.name, self.problem = name, problem
        super().__init__(f"{name}: {problem}")


@dataclass(frozen=True)
class Range:
    """Numbers from ``low`` to ``high`` (None: unbounded), each end closed unless marked open; applied
    to every item of a tuple."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def check(self, value: object) -> None:
        for v in value if isinstance(value, tuple) else (value,):
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            low_ok = self.low is None or (v > self.low if self.low_open else v >= self.low)
            high_ok = self.high is None or (v < self.high if self.high_open else v <= self.high)
            if math.isnan(v) or not (low_ok and high_ok):
                raise ValueError(f"must be {self}, got {v!r}")


@dataclass(frozen=True)
class ByteSize:
    """An ``int`` of bytes that text may also give with a unit (``1GiB``, ``512MiB``)."""

    def parse(self, text: str) -> int:
        from edge_sdk.units import parse_size

        return parse_size(text)


Positive = Annotated[float, Range(0, low_open=True)]
NonNegative = Annotated[float, Range(0)]
Fraction = Annotated[float, Range(0, 1, low_open=True)]  # a share: (0, 1]
Unit = Annotated[float, Range(0, 1)]  # [0, 1]
Count = Annotated[int, Range(1)]
NonNegativeInt = Annotated[int, Range(0)]


def convert(value: object, hint: Any, *, text: bool = True) -> Any:
    """``value`` as the type ``hint`` names, its constraints checked. Strings are parsed when ``text``
    (command lines); otherwise (TOML, Python) a value must already have the type, ints standing for floats."""
    base, extras = split_annotated(hint)
    parser = next((e for e in extras if isinstance(e, ByteSize)), None)
    if parser is not None and isinstance(value, str) and text:
        try:
            out: Any = parser.parse(value)
        except ValueError as exc:
            raise ValueError(f"must be {accepted(hint)}, got {value!r} ({exc})") from None
    else:
        try:
            out = _convert(value, base, text)
        except ValueError:
            raise _refused(value, hint) from None
    for extra in extras:
        if isinstance(extra, Range):
            extra.check(out)
    return out


def accepted(hint: Any) -> str:
    """What ``hint`` accepts, in words: ``a number in (0, 1]``, ``one of clip, reject``."""
    base, extras = split_annotated(hint)
    words = _describe(base)
    if any(isinstance(e, ByteSize) for e in extras):
        words = "a size (bytes, or with a unit: 512MiB, 1GiB)"
    ranges = [str(e) for e in extras if isinstance(e, Range)]
    return " ".join([words, *ranges])


def split_annotated(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    """``Annotated[T, extras...]`` as ``(T, extras)``; any other hint as ``(hint, ())``."""
    if get_origin(hint) is Annotated:
        base, *extras = get_args(hint)
        return base, tuple(extras)
    return hint, ()


def _members(hint: Any) -> tuple[Any, ...] | None:
    """The members of a union (``X | None`` included), else None."""
    return get_args(hint) if get_origin(hint) in (Union, types.UnionType) else None


def _item_hint(hint: Any) -> Any | None:
    """The item type of a tuple/list/Sequence hint, else None."""
    origin = get_origin(hint) or hint
    if origin not in (tuple, list, Sequence):
        return None
    args = [a for a in get_args(hint) if a is not Ellipsis]
    return args[0] if args else Any


def _convert(value: object, hint: Any, text: bool) -> Any:
    if hint in (Any, object, inspect.Parameter.empty):
        return value
    members = _members(hint)
    if members is not None:
        return _convert_union(value, hint, members, text)
    if get_origin(hint) is Literal:
        for choice in get_args(hint):
            if value == choice or (text and isinstance(value, str) and value.strip() == str(choice)):
                return choice
        raise _refused(value, hint)
    item = _item_hint(hint)
    if item is not None:
        return _convert_items(value, hint, item, text)
    if get_origin(hint) in (Callable, dict, Mapping) or hint in (dict, Mapping):
        return _convert_other(value, hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _convert_enum(value, hint, text)
    if isinstance(hint, type):
        return _convert_scalar(value, hint, text)
    raise _refused(value, hint)


def _convert_scalar(value: object, hint: type, text: bool) -> Any:
    parse = text and isinstance(value, str)
    s = value.strip() if isinstance(value, str) else ""
    if hint is bool:
        if isinstance(value, bool):
            return value
        if parse and s.lower() in TRUE_WORDS + FALSE_WORDS:
            return s.lower() in TRUE_WORDS
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if parse and s.lstrip("+-").isdigit():
            return int(s)
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if parse:
            try:
                return float(s)
            except ValueError:
                pass
    elif hint is str:
        if isinstance(value, (str, os.PathLike)):
            return os.fspath(value)
    elif hint is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
    elif isinstance(value, hint):
        return value
    raise _refused(value, hint)


def _convert_union(value: object, hint: Any, members: tuple[Any, ...], text: bool) -> Any:
    if type(None) in members and (value is None or (text and isinstance(value, str)
                                                    and value.strip().lower() in NONE_WORDS)):
        return None
    for member in members:  # in the order written: float | str parses "0.5" as a number
        if member is type(None):
            continue
        try:
            return convert(value, member, text=text)
        except ValueError:
            continue
    raise _refused(value, hint)


def _convert_items(value: object, hint: Any, item: Any, text: bool) -> tuple[Any, ...]:
    if text and isinstance(value, str):
        items: list[object] = [s.strip() for s in value.split(",") if s.strip()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise _refused(value, hint)
    try:
        return tuple(convert(i, item, text=text) for i in items)
    except ValueError:
        raise _refused(value, hint) from None


def _convert_enum(value: object, hint: type[enum.Enum], text: bool) -> enum.Enum:
    if isinstance(value, hint):
        return value
    for member in hint:
        if value == member.value or (text and isinstance(value, str) and value.strip() in (member.name, str(member.value))):
            return member
    raise _refused(value, hint)


def _convert_other(value: object, hint: Any) -> Any:
    origin = get_origin(hint) or hint
    if origin is Callable and callable(value):
        return value
    if origin in (dict, Mapping) and isinstance(value, Mapping):
        return dict(value)
    raise _refused(value, hint)


def _refused(value: object, hint: Any) -> ValueError:
    return ValueError(f"must be {accepted(hint)}, got {value!r}")


_PLURAL = {bool: "true/false values", int: "integers", float: "numbers", str: "strings", Path: "paths"}


def _describe(hint: Any) -> str:
    members = _members(hint)
    if members is not None:
        words = [accepted(m) for m in members if m is not type(None) and get_origin(m) is not Callable]
        return " or ".join(words) + (", or none" if type(None) in members else "")
    if get_origin(hint) is Literal:
        return "one of " + ", ".join(str(c) for c in get_args(hint))
    item = _item_hint(hint)
    if item is not None:
        base, extras = split_annotated(item)
        ranges = "".join(f" {e}" for e in extras if isinstance(e, Range))
        return f"a list of {_PLURAL.get(base, accepted(item) + ' values')}{ranges} (comma-separated in text)"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(m.name for m in hint)
    return {bool: "true or false (also 1/0, yes/no, on/off)", int: "an integer (a whole number)",
            float: "a number", str: "a string", Path: "a path"}.get(hint, getattr(hint, "__name__", str(hint)))
