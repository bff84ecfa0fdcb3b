"""The devices a run has seen: each one's latest profile and plan, and when it was first and last seen."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping

from orchestrator.store.database import Database, dumps

__all__ = ["Devices"]


class Devices:
    """``store.devices``: one row per device id."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, device_id: str, profile: Mapping[str, object], plan: Mapping[str, object]) -> None:
        """Insert or refresh a device: its latest profile and plan, and when it was last seen."""
        self.record_many([(device_id, profile, plan)])

    def record_many(self, devices: Iterable[tuple[str, Mapping[str, object] | str, Mapping[str, object] | str]]
                    ) -> int:
        """:meth:`record` for many devices in one transaction (a fleet's hellos arrive in bursts:
        one commit per hello would be most of the server's work per hello). A profile or plan may be
        given as its JSON text already (plans are shared by many devices). Returns the number of
        devices written."""
        now = time.time()
        rows = [(device_id, profile if isinstance(profile, str) else dumps(profile),
                 plan if isinstance(plan, str) else dumps(plan), now, now) for device_id, profile, plan in devices]
        if not rows:
            return 0
        with self.db.write() as db:
            db.executemany("""INSERT INTO devices(device_id, profile, plan, first_seen, last_seen) VALUES (?, ?, ?, ?, ?)
                              ON CONFLICT(device_id) DO UPDATE SET
                                  profile = excluded.profile, plan = excluded.plan, last_seen = excluded.last_seen""",
                           rows)
        return len(rows)

    def all(self) -> list[dict]:
        """Every device seen, in the order first seen: device_id, profile, plan, first_seen, last_seen."""
        rows = self.db.read("SELECT * FROM devices ORDER BY first_seen, device_id")
        return [{"device_id": r["device_id"], "profile": json.loads(r["profile"]), "plan": json.loads(r["plan"]),
                 "first_seen": r["first_seen"], "last_seen": r["last_seen"]} for r in rows]
