"""The ``edgetrain`` command line: one typer app, one module per command group.

Each command module imports its heavy dependencies (torch, onnx) inside the command, so that
``edgetrain --help`` and the device commands start fast and stay lean.
"""

from __future__ import annotations

import sys

import typer

app = typer.Typer(
    name="edgetrain",
    help="On-device federated training: profile devices, export chunks, serve rounds, run devices.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,  # main() shows user errors as one line; --debug the plain traceback
)


def console():
    """A rich console for command output; piped or captured, 132 columns wide, so that summary
    tables (device names, splits, memory against budget) print whole instead of folding at 80."""
    from rich.console import Console

    out = Console()
    return out if out.is_terminal else Console(width=132)


def _register() -> None:
    # Each module adds its commands to `app` when imported.
    from edgetrain.cli import commands  # noqa: F401


#: Errors a person causes and can fix (a port in use, a missing file, an unknown model, a store that
#: already holds a run, devices that never came): shown as one line and exit status 1, not as a
#: traceback. ``--debug`` (any command but ``device``, which has its own) shows the traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, TimeoutError, LookupError)


def one_line(exc: BaseException) -> str:
    """The error's message on one line, as a person reads it."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:400]


def main(argv: list[str] | None = None) -> None:
    """The ``edgetrain`` entry point: the typer app, with user errors as one line."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = bool(args) and args[0] != "device" and "--debug" in args
    if debug:
        args.remove("--debug")
    _register()
    command = f"edgetrain {args[0]}" if args and not args[0].startswith("-") else "edgetrain"
    try:
        # Not standalone: a wrong option is one line here, not a framed panel of a screen's height.
        status = app(args=args, prog_name="edgetrain", standalone_mode=False)
    except typer.Abort:
        raise SystemExit(130) from None
    except typer.TyperException as exc:  # a usage error: a missing or bad option, an unknown command
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        known = command != "edgetrain" and args[0] in typer.main.get_command(app).commands  # type: ignore[attr-defined]
        sys.stderr.write(f"{command}: {one_line(message)}\n(see {command if known else 'edgetrain'} --help)\n")
        raise SystemExit(2) from None
    except USER_ERRORS as exc:
        if debug:
            raise
        sys.stderr.write(f"{command}: {one_line(exc)}\n(run it again with --debug for the traceback)\n")
        raise SystemExit(1) from None
    if isinstance(status, int) and status:
        raise SystemExit(status)
