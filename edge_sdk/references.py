"""``package.module:name`` references: how a user names code of their own (a model factory, a data
source) where a built-in name would go.

Lean (no torch): a device may resolve references too.
"""

from __future__ import annotations

import importlib
import os
import sys

__all__ = ["is_reference", "load_reference"]


def is_reference(text: str) -> bool:
    """True for ``package.module:name`` (a built-in name never holds a colon)."""
    return ":" in text


def load_reference(reference: str, what: str) -> object:
    """The object ``package.module:name`` names (``name`` may be dotted: ``module:Class.method``).

    The current directory is searched after ``sys.path``, as ``python -m`` would: a command
    installed as a script (``edgetrain``) does not put it there. Raises ValueError naming
    ``what`` was being loaded and why it failed."""
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr or not all(part.isidentifier() for part in (*module_name.split("."),
                                                                                 *attr.split("."))):
        raise ValueError(f"{what} {reference!r}: expected package.module:name")
    try:
        module = _import(module_name)
    except ImportError as exc:
        raise ValueError(f"{what} {reference!r}: cannot import {module_name!r} ({exc})") from None
    target: object = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"{what} {reference!r}: {module_name!r} has no {attr!r}") from None
    return target


def _import(module_name: str) -> object:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.split(".")[0]
        cwd = os.getcwd()
        if exc.name != top or cwd in sys.path or "" in sys.path:
            raise
        if not (os.path.isdir(os.path.join(cwd, top)) or os.path.isfile(os.path.join(cwd, top + ".py"))):
            raise
        sys.path.append(cwd)
        return importlib.import_module(module_name)
