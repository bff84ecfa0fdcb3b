"""Device reports of each round (one per device and phase, accepted or refused with its reason),
and the payload movements of each round (what was sent, what a device already held)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping

from orchestrator.store.database import Database, dumps, round_number
from orchestrator.store.rounds import require_open

__all__ = ["Reports", "Transfers"]


class Reports:
    """``store.reports``: every report a round received, as the server judged it."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, round: int, device_id: str, info: Mapping[str, object], phase: str = "train") -> None:
        """Journal one device's report of one phase (a round may hold several per device): role,
        trained range, samples, metrics, accepted/reason. The round must be begun and not complete."""
        round = round_number(round)
        accepted = info.get("accepted")
        with self.db.write() as db:
            require_open(db, round, late=f"; late update from {device_id!r}")
            db.execute("""INSERT INTO reports(round, device_id, phase, received, accepted, info) VALUES (?, ?, ?, ?, ?, ?)
                          ON CONFLICT(round, device_id, phase) DO UPDATE SET
                              received = excluded.received, accepted = excluded.accepted, info = excluded.info""",
                       (round, device_id, phase, time.time(), None if accepted is None else int(bool(accepted)),
                        dumps(info)))

    def mark_weight_capped(self, round: int, kept: Mapping[str, float]) -> None:
        """Mark the accepted reports of round ``round`` whose weight the strategy's cap reduced:
        ``kept`` is device -> the fraction of its weight it kept (``bounded.weight_kept``)."""
        round = round_number(round)
        with self.db.write() as db:
            rows = db.execute("SELECT device_id, phase, info FROM reports WHERE round = ? AND accepted = 1",
                              (round,)).fetchall()
            for row in rows:
                if row["device_id"] not in kept:
                    continue
                info = json.loads(row["info"])
                info["bounded"] = {**(info.get("bounded") or {}), "weight_kept": kept[row["device_id"]]}
                db.execute("UPDATE reports SET info = ? WHERE round = ? AND device_id = ? AND phase = ?",
                           (dumps(info), round, row["device_id"], row["phase"]))

    def all(self, round: int | None = None) -> list[dict]:
        """Journaled device reports, of one round or all, in arrival order: round, device_id, phase,
        received, and what the server journaled of it (accepted, reason, samples, metrics, ...)."""
        query, args = "SELECT * FROM reports", ()
        if round is not None:
            query, args = query + " WHERE round = ?", (round_number(round),)
        rows = self.db.read(query + " ORDER BY round, received, device_id", args)
        return [{"round": r["round"], "device_id": r["device_id"], "phase": r["phase"], "received": r["received"],
                 **json.loads(r["info"])} for r in rows]


class Transfers:
    """``store.transfers``: the payloads each round moved, down to devices and up from them."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, round: int, rows: Iterable[tuple[str, str, str, str, int, int]]) -> None:
        """Journal a round's payload movements: (device, payload id, kind, ``down``/``up``, bytes
        sent, bytes the device held and was not sent). A payload with ``held`` > 0 and no byte sent
        came from the device's own store (or its bundle). Replaces what an earlier try of the round
        journaled."""
        round = round_number(round)
        with self.db.write() as db:
            db.execute("DELETE FROM transfers WHERE round = ?", (round,))
            db.executemany("INSERT INTO transfers(round, device_id, payload_id, kind, direction, bytes, held) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?)",
                           [(round, d, pid, kind, direction, int(n), int(held))
                            for d, pid, kind, direction, n, held in rows])

    def all(self, round: int | None = None) -> list[dict]:
        """The journaled payload movements, of one round or all, in the order they happened."""
        sql, args = "SELECT round, device_id, payload_id, kind, direction, bytes, held FROM transfers", ()
        if round is not None:
            sql, args = sql + " WHERE round = ?", (round_number(round),)
        rows = self.db.read(sql + " ORDER BY rowid", args)
        return [{**dict(r), "from_device_store": bool(r["held"]) and r["bytes"] == 0} for r in rows]
