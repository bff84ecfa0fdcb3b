"""A run's settings (model, strategy, seed, config), which ``--resume`` and ``edgetrain export`` check."""

from __future__ import annotations

import json

from orchestrator.store.database import Database, dumps

__all__ = ["Meta"]


class Meta:
    """``store.meta``: a key -> JSON value table."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, key: str, value: object) -> None:
        """Remember a run setting (model, strategy, config) so ``--resume`` can check it."""
        with self.db.write() as db:
            db.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                       (key, dumps(value)))

    def get(self, key: str, default: object = None) -> object:
        row = self.db.one("SELECT value FROM meta WHERE key = ?", (key,))
        return default if row is None else json.loads(row["value"])
