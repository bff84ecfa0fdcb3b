"""The ``edgetrain`` command line: one typer app, one module per command group.

Each command module imports its heavy dependencies (torch, onnx) inside the command, so that
``edgetrain --help`` and the device commands start fast and stay lean.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="edgetrain",
    help="On-device federated training: profile devices, export chunks, serve rounds, run devices.",
    no_args_is_help=True,
    add_completion=False,
)


def console():
    """A rich console for command output; piped or captured, 132 columns wide, so that summary
    tables (device names, splits, memory against budget) print whole instead of folding at 80."""
    from rich.console import Console

    out = Console()
    return out if out.is_terminal else Console(width=132)


def _register() -> None:
    # Each module adds its commands to `app` when imported.
    from orchestrator.cli import commands  # noqa: F401


def main() -> None:
    _register()
    app()
