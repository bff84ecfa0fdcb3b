"""Each part changes only its own state, through its own methods; the server's parts share records
through one module.

A part that writes another's attribute (``self.admission.open[1] -= 1``, ``self.loop.bytes[0] += n``,
``self.reports.partial.clear()``) makes that state two parts' job: neither can be read alone, and a
replacement of one (report intake in secure-aggregation mode, say) must know what the other writes
behind its back. The check reads the source with ``ast``: for every ``self.<part>.<attr>`` that is
assigned, augmented, deleted, item-assigned or changed in place (``clear``, ``pop``, ``append``,
``set``, ...), it finds the class of ``self.<part>`` from where it is assigned (a constructor call,
or a parameter's annotation) and fails when that class is the project's own and lives in another
module than the class that holds the attribute. The same holds for a write through a name bound to
another part in a function or method (``secure = self.secure; secure.stage = ...``, a parameter
``server: Served`` whose ``server.process_request`` is replaced, ``orchestrator = Orchestrator(...)``
whose ``orchestrator.web.conditions`` is set): the name's class comes from the parameter's annotation,
a constructor call, an annotation, or the ``self.<attr>`` it was bound to. A record or helper class of
the same module is the holder's own state; a library object (a socket, a database connection) is not
a part.
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
KNOWN = {
    "edge_sdk/algorithms/fedalign.py: check_after_evaluate writes ctx.notes": (
        "PhaseContext.notes is the map a phase leaves notes in for a later phase of the same instruction; "
        "a PhaseContext method for it belongs to edge_sdk/phases.py"),
    "edge_sdk/client.py: DeviceClient._upload writes prog.acked": (
        "the connection records an acknowledged upload in the round's progress (edge_sdk/roundwork.py); a "
        "RoundProgress method for it belongs to the device's round work"),
    "edge_sdk/client.py: DeviceClient._upload writes prog.reports": (
        "the same upload drops the acknowledged report from the round's progress"),
    "edge_sdk/client.py: DeviceClient._upload writes prog.timings": (
        "the same upload adds its seconds to the round's progress"),
    "edge_sdk/models/zoo.py: _with_width writes model.width": (
        "a zoo factory's helper stamps the width ratio on the model the factory just built and hands it"),
}
#: The server's parts (docs/architecture.md, "The server"): they share records through orchestrator.parts.
#: Module paths under orchestrator/: the server's I/O and its parts in server/, report intake in aggregation/.
SERVER_PARTS = ("server.admission", "server.buffered", "server.dispatch", "server.heap", "aggregation.intake", "aggregation.normbound",
                "server.pace", "server.payloads",
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


def _assigned(node: ast.AST) -> list[tuple[ast.expr, ast.expr | None]]:
    """(target, what it is bound to) of an assignment: an annotation, a value, or each of a tuple's."""
    if isinstance(node, ast.AnnAssign):
        return [(node.target, node.annotation)]
    if isinstance(node, ast.NamedExpr):
        return [(node.target, node.value)]
    pairs: list[tuple[ast.expr, ast.expr | None]] = []
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs += list(zip(target.elts, node.value.elts))
            else:
                pairs.append((target, node.value))
    return pairs


def _attribute_types(cls: ast.ClassDef) -> dict[str, ast.expr | None]:
    """``self.<attr>`` -> the annotation or value it is assigned (the first that names a class)."""
    out: dict[str, ast.expr | None] = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            out[stmt.target.id] = stmt.annotation
    for fn in (n for n in ast.walk(cls) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        params = {a.arg: a.annotation for a in (*fn.args.args, *fn.args.kwonlyargs)}
        for node in ast.walk(fn):
            for target, value in _assigned(node):
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


def _written(fn: ast.AST) -> list[tuple[ast.AST, ast.expr]]:
    """Every expression ``fn`` writes: assigned, augmented, deleted (each of a tuple's), or changed in
    place by a mutating method; with the node that writes it."""
    found = []
    for node in ast.walk(fn):
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value]
        found += [(node, t) for target in targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
    return found


def _writes(fn: ast.AST) -> list[tuple[ast.AST, list[str]]]:
    """Every write through ``self.<a>.<b>...`` in ``fn``: (the node, the attribute chain)."""
    return [(node, chain) for node, t in _written(fn) if (chain := _self_chain(t)) is not None and len(chain) >= 2]


def _name_chain(node: ast.expr) -> tuple[str, list[str]] | None:
    """``x.a.b[...]`` -> ("x", ["a", "b"]) for a name other than ``self`` (subscripts looked through)."""
    names = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
        node = node.value
    return (node.id, names[::-1]) if isinstance(node, ast.Name) and node.id not in ("self", "cls") else None


def _bound_names(fn: ast.AST, cls: _Class | None,
                 classes: dict[str, list[_Class]]) -> dict[str, tuple[ast.expr | None, bool]]:
    """The names of ``fn`` whose class can be told: parameters by their annotation, locals by the
    constructor call, annotation or ``self.<attr>`` they are first bound to; with whether the function
    built the object itself (a constructor call: setting up what it just made is not a write into
    another part, but writing into one of that object's parts is)."""
    out: dict[str, tuple[ast.expr | None, bool]] = {}
    args = fn.args  # type: ignore[attr-defined]
    for a in (*args.posonlyargs, *args.args, *args.kwonlyargs):
        if a.arg not in ("self", "cls") and a.annotation is not None:
            out[a.arg] = (a.annotation, False)
    for node in ast.walk(fn):
        for target, value in _assigned(node):
            if not isinstance(target, ast.Name) or target.id in out:
                continue
            built = isinstance(node, (ast.Assign, ast.NamedExpr)) and isinstance(value, ast.Call)
            if cls is not None and isinstance(value, ast.Attribute) and _self_chain(value) == [value.attr]:
                held = _holder(classes, cls, value.attr)
                value = held[1] if held is not None else None
                built = False
            out[target.id] = (value, built)
    return out


def _name_writes(fn: ast.AST) -> list[tuple[str, list[str]]]:
    """Every write through ``<name>.<a>...`` in ``fn`` (an attribute of what the name is bound to)."""
    return [chain for _node, t in _written(fn) if (chain := _name_chain(t)) is not None and chain[1]]


def _functions(root: Path, packages: tuple[str, ...], scanned: tuple[str, ...],
               classes: dict[str, list[_Class]]) -> list[tuple[_Class, _Class | None, ast.AST, str]]:
    """Every function of the scanned packages: (its module as a class-less holder, its class or None,
    the function, its qualified name)."""
    out = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            module = _module_name(path, root)
            if not module.startswith(scanned):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            where = _Class(module, ast.ClassDef(name="", bases=[], keywords=[], body=[], decorator_list=[]),
                           _imports(tree))
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.append((where, None, node, node.name))
            for cls in (c for group in classes.values() for c in group if c.module == module):
                for fn in (n for n in cls.node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
                    out.append((where, cls, fn, f"{cls.node.name}.{fn.name}"))
    return out


def cross_part_writes(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES,
                      scanned: tuple[str, ...] = SCANNED) -> list[str]:
    """Writes to another part's attributes, as ``path: Class.method writes self.part.attr`` (or
    ``writes name.attr`` through a name bound to another part)."""
    classes = _classes(root, packages)
    out = []
    for where, cls, fn, qualname in _functions(root, packages, scanned, classes):
        names = _bound_names(fn, cls, classes)
        for name, chain in _name_writes(fn):
            bound, built = names.get(name, (None, False))
            module = _project_module(classes, where, _type_name(bound))
            if module is not None and module != where.module and len(chain) >= 1 + built:
                out.append(f"{where.module.replace('.', '/')}.py: {qualname} writes {name}.{chain[0]}")
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
    "pkg/site.py": """
from pkg.admission import Admission
from pkg.loop import Loop

class Site:
    def __init__(self, admission: Admission):
        self.admission = admission

    def hook(self, loop: Loop):
        loop.counts = None           # through a parameter bound to another part
        admission = self.admission
        admission.open.append(1)     # through a local bound to self.<part>
        mine = _Own()
        mine.n = 1                   # a record of its own module

class _Own:
    n = 0

def main():
    loop = Loop(Admission())
    loop.changed = None              # setting up what it just built: its own
    loop.admission.open = []         # writing into a part of what it built
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
        "pkg/site.py: Site.hook writes admission.open",
        "pkg/site.py: Site.hook writes loop.counts",
        "pkg/site.py: main writes loop.admission",
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
