"""The shape a maintainer can hold in mind: the server module stays small and no function grows past a
screen, in the two packages that most change (orchestrator/ and edge_sdk/)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 80
MAX_SERVER_LINES = 400


def long_functions(package: str) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_function_is_longer_than_a_screen() -> None:
    assert long_functions("orchestrator") + long_functions("edge_sdk") == []


def test_the_server_module_keeps_the_io_only() -> None:
    lines = len((ROOT / "orchestrator" / "server.py").read_text().splitlines())
    assert lines < MAX_SERVER_LINES, f"orchestrator/server.py has {lines} lines"
