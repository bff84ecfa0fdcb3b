"""Command-line options generated from :class:`orchestrator.config.ServerConfig`'s fields: each takes its
name, default and help from the field, and its text goes through the converter fleet files use, so a
setting is declared once (orchestrator/config.py) and a bad value is named as the user spelled it."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import MISSING, Field, fields
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Optional, Union, get_args, get_origin

import typer
from typer.core import TyperCommand

from edge_sdk.values import ByteSize, convert, split_annotated
from orchestrator.config import ServerConfig, SettingError, setting_hints

__all__ = ["SettingsCommand", "cli_fields", "config_from_options", "config_parameters", "option_spelling"]


def cli_fields() -> list[Field]:
    """The ServerConfig fields ``edgetrain serve`` has an option for."""
    return [f for f in fields(ServerConfig) if f.metadata.get("cli")]


def option_spelling(name: str) -> str:
    """How the command line spells field ``name`` (``deadline_s`` -> ``--deadline``); the field name
    itself for a setting with no option."""
    f = next((f for f in fields(ServerConfig) if f.name == name), None)
    cli = f.metadata.get("cli") if f is not None else None
    if not cli:
        return name
    return cli if isinstance(cli, str) else "--" + name.replace("_", "-")


def _default(f: Field) -> Any:
    if f.metadata.get("cli_default") is not None:
        return f.metadata["cli_default"]
    return f.default_factory() if f.default is MISSING else f.default


def config_parameters() -> list[inspect.Parameter]:
    """One keyword parameter per option, for a typer command's ``__signature__``: booleans are flags,
    the rest text (converted by :func:`config_from_options`, which names the option in its errors)."""
    params = []
    for f in cli_fields():
        default = _default(f)
        if isinstance(default, bool):
            annotation: Any = bool
        else:
            annotation = Optional[str]
            if default is not None:
                default = ",".join(map(str, default)) if isinstance(default, tuple) else str(default)
        spelling = option_spelling(f.name)
        if default is True:  # a setting on by default needs a way to turn it off: --x/--no-x
            spelling = f"{spelling}/--no-{spelling[2:]}"
        option = typer.Option(default, spelling, help=f.metadata["help"], show_default=default != "",
                              metavar=None if annotation is bool else _metavar(setting_hints()[f.name]))
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation))
    return params


class SettingsCommand(TyperCommand):
    """A command with an option per setting: an option that names an entry of a registry
    (``setting(names=...)``: strategies, privacy mechanisms) lists the registry's names in its help,
    read only when the help is shown (a registry may import torch; every other invocation stays lean)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from edge_sdk.references import load_reference

        named = {f.name: f.metadata["names"] for f in cli_fields() if f.metadata.get("names")}
        for param in self.params:
            reference = named.pop(param.name, None)
            text = getattr(param, "help", None)
            if reference and text and "Registered:" not in text:
                param.help = f"{text} Registered: {', '.join(load_reference(reference, 'registry'))}."
        super().format_help(ctx, formatter)


def _metavar(hint: Any) -> str:
    """A short name of what an option takes: INT, FLOAT, LIST, SIZE, [clip|reject], TEXT."""
    base, extras = split_annotated(hint)
    members = [m for m in get_args(base) if m is not type(None)] if get_origin(base) in (Union, UnionType) else [base]
    base = split_annotated(members[0])[0] if len(members) == 1 else base
    if any(isinstance(e, ByteSize) for e in extras):
        return "SIZE"
    if get_origin(base) is Literal:
        return "[" + "|".join(map(str, get_args(base))) + "]"
    if get_origin(base) is tuple:
        return "LIST"
    return {int: "INT", float: "FLOAT", Path: "PATH"}.get(base, "TEXT")


def config_from_options(values: Mapping[str, Any], **settings: Any) -> ServerConfig:
    """The ServerConfig the options' values (text, or booleans) give, with ``settings`` added; a bad
    value raises SettingError naming the option (``--lr-decay``)."""
    hints = setting_hints()
    typed = dict(settings)
    for name, value in values.items():
        try:
            typed[name] = None if value is None else convert(value, hints[name])
        except ValueError as exc:
            raise SettingError(option_spelling(name), str(exc)) from None
    try:
        return ServerConfig(**typed)
    except SettingError as exc:
        raise SettingError(option_spelling(exc.name), exc.problem) from None
