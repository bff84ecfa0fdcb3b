"""The docs' registry tables stay true: every registered strategy is in docs/architecture.md's table
of strategies and every runtime of the planner's registry in docs/protocol.md's table of runtimes
(the zoo's table in docs/models.md has its own test, tests/test_models_doc.py)."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.strategies import STRATEGY_NAMES, strategy_class
from profiles.runtime import RUNTIMES

DOCS = Path(__file__).resolve().parent.parent / "docs"


def table_names(page: str, section: str) -> set[str]:
    """The first column's `names` of the tables in ``section`` (a ``## `` heading) of ``page``."""
    text = (DOCS / page).read_text()
    start = text.index(f"## {section}")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end > 0 else None]
    return set(re.findall(r"^\| `([^`]+)` \|", body, flags=re.M))


def test_every_registered_strategy_is_in_the_architecture_table() -> None:
    names = table_names("architecture.md", "3. Strategies")
    assert set(STRATEGY_NAMES) <= names, sorted(set(STRATEGY_NAMES) - names)
    text = (DOCS / "architecture.md").read_text()
    for name in STRATEGY_NAMES:  # the row names the class that is registered
        assert f"| `{name}` | `{strategy_class(name).__name__}` |" in text


def test_every_runtime_of_the_registry_is_in_the_protocol_table() -> None:
    names = table_names("protocol.md", "Runtimes")
    assert set(RUNTIMES) <= names, sorted(set(RUNTIMES) - names)


def test_every_server_part_is_in_the_server_table() -> None:
    """docs/architecture.md, "The server": one row per part, and no row for a module that is gone."""
    from tests.test_ownership import SERVER_PARTS

    text = (DOCS / "architecture.md").read_text()
    start = text.index("### The server")
    body = text[start:text.index("#### Report intake", start)]
    rows = set(re.findall(r"^\| `([^`]+)` \|", body, flags=re.M))
    orchestrator = DOCS.parent / "orchestrator"
    assert rows == {name.replace(".", "/") + ".py" for name in SERVER_PARTS
                    if name not in ("server.orchestrator", "server.plancache")}
    assert all((orchestrator / row).is_file() for row in rows)
    assert "`orchestrator/parts.py`" in body and (orchestrator / "parts.py").is_file()
