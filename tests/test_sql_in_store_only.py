"""The store owns the journal's schema: no Python file of the repository outside orchestrator/store/
imports sqlite3 or holds an SQL statement. Everything else (the server's parts, the emulator's resume,
the benchmarks, the tests, the JavaScript SDK's test helpers) reads and writes a run through the
store's repositories (``Store.open_readonly``, ``store.rounds.all()``, ``store.reports.all()``,
``store.devices.all()``, ``store.rounds.completed()``, ...), so the schema can change in one place."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OWNER = "orchestrator/store/"
#: An sqlite3 import, or the start of an SQL statement (keywords in capitals, as the store writes them).
SQL = re.compile(
    r"^\s*(import\s+sqlite3|from\s+sqlite3\s+import)\b"
    r"|\bSELECT\s+[\w*(].*?\bFROM\b|\bINSERT\s+(OR\s+\w+\s+)?INTO\b|\bUPDATE\s+\w+\s+SET\b"
    r"|\bCREATE\s+(TABLE|INDEX|UNIQUE|VIEW|TRIGGER)\b|\bDELETE\s+FROM\b|\bPRAGMA\s+\w+",
    re.MULTILINE)


def python_files() -> list[str]:
    """The repository's Python files: tracked, and new ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=REPO,
                         check=True, capture_output=True, text=True).stdout.split()
    return sorted(set(out))


def test_only_the_store_speaks_sql() -> None:
    files = python_files()
    assert f"{OWNER}database.py" in files and "bench/embracing.py" in files and "edge_sdk_js/test/journal.py" in files
    me = str(Path(__file__).relative_to(REPO))
    found = []
    for name in files:
        if name.startswith(OWNER) or name == me or not (REPO / name).is_file():
            continue
        for match in SQL.finditer((REPO / name).read_text(encoding="utf-8")):
            found.append(f"{name}: {match.group(0).strip()[:60]!r}")
    assert not found, "SQL outside orchestrator/store/ (add a repository method instead):\n" + "\n".join(found)


def test_the_guard_sees_what_it_looks_for() -> None:
    store = "\n".join(p.read_text(encoding="utf-8") for p in sorted((REPO / OWNER).glob("*.py")))
    kinds = {m.group(0).split()[0] for m in SQL.finditer(store)}
    assert {"import", "SELECT", "INSERT", "UPDATE", "CREATE", "DELETE", "PRAGMA"} <= kinds, kinds
    assert not SQL.search("rows selected from the journal; update the table's settings; create an index")
