"""Each device's measured pace (orchestrator/server/pace.py): kept so a restarted server paces a slow
device from its first round after the restart, as it did before, instead of cutting it again."""

from __future__ import annotations

import time

from orchestrator.store.database import Database

__all__ = ["Paces"]


class Paces:
    """``store.paces``: device -> its round time as ``overhead_s + steps * step_s`` (seconds), the last
    estimate the server made of it."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, device_id: str, overhead_s: float, step_s: float) -> None:
        """Keep a device's new estimate (replacing the one it had)."""
        with self.db.write() as db:
            db.execute("INSERT OR REPLACE INTO paces(device_id, overhead_s, step_s, updated) VALUES (?, ?, ?, ?)",
                       (device_id, float(overhead_s), float(step_s), time.time()))

    def all(self) -> dict[str, tuple[float, float]]:
        """Every device's estimate: device -> (overhead_s, step_s)."""
        if "paces" not in self.db.tables():  # a read-only view of a store older than the table
            return {}
        rows = self.db.read("SELECT device_id, overhead_s, step_s FROM paces ORDER BY device_id")
        return {r["device_id"]: (r["overhead_s"], r["step_s"]) for r in rows}
