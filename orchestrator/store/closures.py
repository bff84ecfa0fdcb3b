"""Connections the server refused or ended for cause (unauthorized, revoked, fetch_limit, hello_refused)."""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.store.database import Database

__all__ = ["MAX_CLOSURES", "Closures"]

MAX_CLOSURES = 100_000  # closures journaled (the newest kept)


class Closures:
    """``store.closures``: a bounded journal, the newest ``limit`` kept (a flood of refused hellos
    must not fill the disk)."""

    def __init__(self, db: Database, *, limit: int = MAX_CLOSURES) -> None:
        self.db, self.limit = db, limit

    def record(self, closures: Iterable[tuple[float, str, str, int | None, str]]) -> None:
        """Journal closures ``(at, device_id, kind, round, reason)`` in one commit."""
        rows = list(closures)
        if not rows:
            return
        with self.db.write() as db:
            db.executemany("INSERT INTO closures(at, device_id, kind, round, reason) VALUES (?, ?, ?, ?, ?)", rows)
            db.execute("DELETE FROM closures WHERE rowid <= (SELECT MAX(rowid) FROM closures) - ?", (self.limit,))

    def all(self, kind: str | None = None) -> list[dict]:
        """Journaled closures (of one kind, or all), oldest first."""
        query, args = "SELECT * FROM closures", ()
        if kind is not None:
            query, args = query + " WHERE kind = ?", (kind,)
        return [dict(r) for r in self.db.read(query + " ORDER BY at", args)]
