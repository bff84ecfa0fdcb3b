"""Each part changes only its own state, through its own methods; the server's parts share records
through one module.

A part that writes another's attribute (``self.admission.open[1] -= 1``, ``self.loop.bytes[0] += n``,
``self.reports.partial.clear()``) makes that state two parts' job: neither can be read alone, and a
replacement of one (report intake in secure-aggregation mode, say) must know what the other writes
behind its back. The check reads the source with ``ast``: for every ``self.<part>.<attr>`` that is
assigned, augmented, deleted, item-assigned or changed in place (``clear``, ``pop``, ``append``,
``set``, ...), it finds the class of ``self.<part>`` from where it is assigned (a constructor call,
or a parameter's annotation) and fails when that class is the project's own and lives in another
module than the class that holds the attribute. A record or helper class of the same module is
the holder's own state; a library object (a socket, a database connection) is not a part.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("edge_sdk", "profiles", "exporters", "orchestrator", "emulator", "edgetrain")
SCANNED = ("orchestrator", "emulator", "edgetrain", "edge_sdk")
#: Methods that change a container or an object in place.
MUTATORS = frozenset({"append", "appendleft", "add", "clear", "discard", "extend", "insert", "pop", "popitem",
                      "remove", "reverse", "set", "setdefault", "sort", "update"})
#: Writes across parts the check knows of, in code outside the server (each with its reason). The
#: test fails when one of them is gone too, so that this list stays true.
KNOWN: dict[str, str] = {}
#: The server's parts (docs/architecture.md, "The server"): they share records through orchestrator.parts.
#: Module paths under orchestrator/: the server's I/O and its parts in server/, report intake in aggregation/.
SERVER_PARTS = ("server.admission", "server.heap", "aggregation.intake", "aggregation.normbound", "server.payloads",
                "server.plancache", "server.planning", "aggregation.reference", "server.resume", "server.revocation",
                "server.roundloop", "server.orchestrator", "aggregation.trust", "server.uploads", "server.validation")


# -- the checker --------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Class:
    module: str
    node: ast.ClassDef
    imports: dict[str, str]  # local name -> the module it is imported from


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module) -> dict[str, str]:
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                out[alias.asname or alias.name] = node.module
    return out


def _classes(root: Path, packages: tuple[str, ...]) -> dict[str, list[_Class]]:
    """Every class of the packages, by name."""
    found: dict[str, list[_Class]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            imports, module = _imports(tree), _module_name(path, root)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append(_Class(module, node, imports))
    return found


def _type_name(node: ast.expr | None) -> str | None:
    """The class an annotation or a constructor call names (``X | None`` and ``Optional[X]`` are X)."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _type_name(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _type_name(node.left), _type_name(node.right)
        return right if left == "None" else left
    if isinstance(node, ast.Subscript) and _type_name(node.value) == "Optional":
        return _type_name(node.slice)
    if isinstance(node, ast.Call):
        return _type_name(node.func)
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant) and node.value is None:
        return "None"
    return None


def _self_chain(node: ast.expr) -> list[str] | None:
    """``self.a.b[...]`` -> ["a", "b"] (subscripts looked through), else None."""
    names = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
        node = node.value
    return names[::-1] if isinstance(node, ast.Name) and node.id == "self" else None


def _attribute_types(cls: ast.ClassDef) -> dict[str, ast.expr | None]:
    """``self.<attr>`` -> the annotation or value it is assigned (the first that names a class)."""
    out: dict[str, ast.expr | None] = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            out[stmt.target.id] = stmt.annotation
    for fn in (n for n in ast.walk(cls) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        params = {a.arg: a.annotation for a in (*fn.args.args, *fn.args.kwonlyargs)}
        for node in ast.walk(fn):
            pairs: list[tuple[ast.expr, ast.expr | None]] = []
            if isinstance(node, ast.AnnAssign):
                pairs = [(node.target, node.annotation)]
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                        pairs += list(zip(target.elts, node.value.elts))
                    else:
                        pairs.append((target, node.value))
            for target, value in pairs:
                if not (isinstance(target, ast.Attribute) and _self_chain(target) == [target.attr]):
                    continue
                if isinstance(value, ast.Name) and value.id in params:
                    value = params[value.id]
                elif isinstance(value, ast.IfExp):
                    value = value.body
                if out.get(target.attr) is None:
                    out[target.attr] = value
    return out


def _holder(classes: dict[str, list[_Class]], cls: _Class, attr: str) -> tuple[_Class, ast.expr | None] | None:
    """The class (``cls`` or a base) that assigns ``self.<attr>``, and what it assigns."""
    seen = [cls]
    while seen:
        c = seen.pop(0)
        types = _attribute_types(c.node)
        if attr in types:
            return c, types[attr]
        for base in c.node.bases:
            name = _type_name(base)
            seen += [b for b in classes.get(name or "", ()) if b.module in (c.imports.get(name or ""), c.module)]
    return None


def _project_module(classes: dict[str, list[_Class]], holder: _Class, type_name: str | None) -> str | None:
    """The module of the project class ``type_name`` as ``holder``'s module sees it; None for
    anything else (a library class, a builtin)."""
    if type_name is None:
        return None
    candidates = classes.get(type_name, ())
    if any(c.module == holder.module for c in candidates):
        return holder.module
    imported = holder.imports.get(type_name)
    return imported if any(c.module == imported for c in candidates) else None


def _writes(fn: ast.AST) -> list[tuple[ast.AST, list[str]]]:
    """Every write through ``self.<a>.<b>...`` in ``fn``: (the node, the attribute chain)."""
    found = []
    for node in ast.walk(fn):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value]
        for target in targets:
            for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                chain = _self_chain(t)
                if chain is not None and len(chain) >= 2:
                    found.append((node, chain))
    return found


def cross_part_writes(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES,
                      scanned: tuple[str, ...] = SCANNED) -> list[str]:
    """Writes to another part's attributes, as ``path: Class.method writes self.part.attr``."""
    classes = _classes(root, packages)
    out = []
    for group in classes.values():
        for cls in group:
            if not cls.module.startswith(scanned):
                continue
            for fn in (n for n in cls.node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
                for _node, chain in _writes(fn):
                    held = _holder(classes, cls, chain[0])
                    if held is None:
                        continue  # not an attribute this class or its bases assign (a property, say)
                    holder, assigned = held
                    module = _project_module(classes, holder, _type_name(assigned))
                    if module is not None and module != holder.module:
                        path = cls.module.replace(".", "/") + ".py"
                        out.append(f"{path}: {cls.node.name}.{fn.name} writes self.{'.'.join(chain[:2])}")
    return sorted(set(out))


def type_only_record_imports(root: Path = ROOT) -> list[str]:
    """Records (dataclasses and type aliases) a server part imports from another server part but
    uses only in annotations: shared records belong in orchestrator.parts."""
    parts = {f"orchestrator.{name}" for name in SERVER_PARTS}
    trees = {m: ast.parse((root / (m.replace(".", "/") + ".py")).read_text(encoding="utf-8")) for m in parts}
    records = {m: _records(tree) for m, tree in trees.items()}
    out = []
    for module, tree in trees.items():
        used = _names_outside_annotations(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in parts and node.module != module:
                for alias in node.names:
                    if alias.name in records[node.module] and (alias.asname or alias.name) not in used:
                        out.append(f"{module} imports {alias.name} from {node.module} for a type only")
    return sorted(out)


def _records(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(_type_name(d) == "dataclass" for d in node.decorator_list):
            names.add(node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _names_outside_annotations(tree: ast.Module) -> set[str]:
    annotations: set[int] = set()
    for node in ast.walk(tree):
        found = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            found = [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
                     if a is not None] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            found = [node.annotation]
        for annotation in found:
            if annotation is not None:
                annotations.update(id(n) for n in ast.walk(annotation))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in annotations}


# -- the project ----------------------------------------------------------------------------------
def test_no_part_writes_another_parts_state() -> None:
    found = cross_part_writes()
    new = [w for w in found if w not in KNOWN]
    gone = [w for w in KNOWN if w not in found]
    assert not new, "writes to another part's state (add a method to the part that owns it):\n" + "\n".join(new)
    assert not gone, "no longer written across parts (drop them from KNOWN):\n" + "\n".join(gone)


def test_server_parts_take_shared_records_from_one_module() -> None:
    found = type_only_record_imports()
    assert not found, "\n".join(found)


# -- the checker itself, on small trees ------------------------------------------------------------
FILES = {
    "pkg/__init__.py": "",
    "pkg/admission.py": """
from dataclasses import dataclass

@dataclass
class Session:
    device_id: str

class Admission:
    def __init__(self):
        self.open = [0, 0]
""",
    "pkg/loop.py": """
import asyncio
from pkg.admission import Admission

class Loop:
    def __init__(self, admission: Admission):
        self.admission = admission
        self.changed = asyncio.Event()
        self.counts = _Counts()

    def own(self):
        self.changed.set()           # its own attribute (a library object)
        self.counts.n += 1           # a record of its own module

class _Counts:
    n = 0
""",
    "pkg/server.py": """
import types
from pkg.admission import Admission, Session
from pkg.loop import Loop

class Server:
    def __init__(self):
        self.admission = Admission()
        self.loop = Loop(self.admission) if True else None
        self.db = types.SimpleNamespace()

    def handler(self, session: Session):
        self.admission.open[1] -= 1
        self.loop.changed.set()
        self.db.value = None         # a library object: not a part
        del self.loop.counts

class Sub(Server):
    def more(self):
        self.admission.open = []
""",
}


def test_the_checker_finds_each_kind_of_write(tmp_path: Path) -> None:
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cross_part_writes(tmp_path, ("pkg",), ("pkg",)) == [
        "pkg/server.py: Server.handler writes self.admission.open",
        "pkg/server.py: Server.handler writes self.loop.changed",
        "pkg/server.py: Server.handler writes self.loop.counts",
        "pkg/server.py: Sub.more writes self.admission.open",
    ]


def test_the_record_check_finds_a_record_imported_for_its_type_only(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    server = tmp_path / "orchestrator" / "server"
    server.mkdir(parents=True)
    (server / "admission.py").write_text(FILES["pkg/admission.py"])
    (server / "payloads.py").write_text(
        "from orchestrator.server.admission import Admission, Session\n"
        "def prepare(session: Session) -> None:\n    Admission()\n")
    (server / "orchestrator.py").write_text(
        "from orchestrator.server.admission import Session\nSESSIONS = [Session('a')]\n")
    monkeypatch.setitem(globals(), "SERVER_PARTS", ("server.admission", "server.payloads", "server.orchestrator"))
    assert type_only_record_imports(tmp_path) == [
        "orchestrator.server.payloads imports Session from orchestrator.server.admission for a type only"]
