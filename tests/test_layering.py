"""The packages stay in layers: edge_sdk < profiles < exporters < orchestrator < emulator < edgetrain,
and no import cycles.

A device ships ``edge_sdk`` alone, the planner adds ``profiles``, the exporters add torch and ONNX,
the orchestrator sits on them, the emulator (fleets of emulated devices) drives the orchestrator, and
the command line (``edgetrain``) sits on top: a lower layer that imports a higher one drags the higher
one (and its dependencies) onto every device. Cycles between modules make import order matter and a module
impossible to read alone. Imports are read from the source with ``ast``: relative imports resolved,
imports inside functions and under ``TYPE_CHECKING`` included (each is a dependency all the same).
A package ``__init__`` importing its own children (re-exports) is not a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Each may import itself and those before it.
LAYERS = ("edge_sdk", "profiles", "exporters", "orchestrator", "emulator", "edgetrain")
#: The orchestrator's top level holds the shared modules only; the rest lives in its rooms (server/,
#: aggregation/, strategies/, views/).
MAX_ORCHESTRATOR_TOP_MODULES = 12


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package __init__), for every module of the layered packages."""
    found = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = (path, is_package)
    return found


def _imported_names(module: str, path: Path, is_package: bool) -> set[str]:
    """Every dotted name ``module`` imports (``from a import b`` gives ``a`` and ``a.b``)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = len(package) - (node.level - 1)
                if up <= 0:
                    raise AssertionError(f"{path}: relative import beyond the top-level package")
                base = ".".join(package[:up] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name resolves to the longest module it starts with)."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        targets = {resolve(name) for name in _imported_names(module, path, is_package)}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def _layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _without_reexports(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without the edges from a package ``__init__`` to its own children."""
    modules = _modules()
    return {m: {t for t in targets if not (modules[m][1] and t.startswith(m + "."))} for m, targets in graph.items()}


def test_no_layer_imports_a_higher_one() -> None:
    upward = sorted(f"{m} -> {t}" for m, targets in _graph().items() for t in targets if _layer(t) > _layer(m))
    assert not upward, "imports of a higher layer (" + " < ".join(LAYERS) + "):\n" + "\n".join(upward)


def test_no_import_cycles_between_modules() -> None:
    cycles = _cycles(_without_reexports(_graph()))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_orchestrator_never_imports_the_emulator_or_the_command_line() -> None:
    """The emulator and the command line sit on top of the orchestrator, not inside it: a server
    loads neither, and the emulator's device processes never load the command line."""
    graph = _graph()
    offending = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                       if (m.split(".")[0] == "orchestrator" and t.split(".")[0] in ("emulator", "edgetrain"))
                       or (m.split(".")[0] == "emulator" and t.split(".")[0] == "edgetrain"))
    assert not offending, "\n".join(offending)


def test_the_orchestrator_top_level_holds_few_modules() -> None:
    """Everything but the shared modules (config, values, records, the store) lives in a room."""
    top = sorted(path.name for path in (ROOT / "orchestrator").glob("*.py"))
    assert len(top) <= MAX_ORCHESTRATOR_TOP_MODULES, top


# -- the checker itself, on small trees ------------------------------------------------------------
def test_the_graph_reads_relative_and_nested_imports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    files = {
        "edge_sdk/__init__.py": "from .a import f\n",
        "edge_sdk/a.py": "def f():\n    from . import b\n",
        "edge_sdk/b.py": "from edge_sdk.sub.c import g\n",
        "edge_sdk/sub/__init__.py": "",
        "edge_sdk/sub/c.py": "from ..a import f\ndef g():\n    import profiles.x\n",
        "profiles/__init__.py": "",
        "profiles/x.py": "",
        "exporters/__init__.py": "",
        "orchestrator/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    graph = _graph()
    assert graph["edge_sdk"] == {"edge_sdk.a"}
    assert graph["edge_sdk.a"] == {"edge_sdk"} | {"edge_sdk.b"}  # "from . import b": the package and b
    assert graph["edge_sdk.sub.c"] == {"edge_sdk.a", "profiles.x"}
    assert [m for m, ts in graph.items() for t in ts if _layer(t) > _layer(m)] == ["edge_sdk.sub.c"]
    # a -> b -> sub.c -> a is a cycle; edge_sdk -> a -> edge_sdk is the package re-exporting its child.
    assert _cycles(_without_reexports(graph)) == [["edge_sdk.a", "edge_sdk.b", "edge_sdk.sub.c"]]
