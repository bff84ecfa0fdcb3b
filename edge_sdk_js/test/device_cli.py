"""Run the Python device's command (``edge_sdk.cli.main``, as ``python -m edge_sdk`` runs it) on
each command line read from standard input (a JSON list of argument lists), and print what each
printed and its exit status as one JSON list: one process for many runs, so that the JavaScript
tests compare the two devices' command lines without a Python start per case."""

from __future__ import annotations

import contextlib
import io
import json
import sys

from edge_sdk.cli import main


def run(argv: list[str]) -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
    return {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}


if __name__ == "__main__":
    print(json.dumps([run(argv) for argv in json.load(sys.stdin)]))
