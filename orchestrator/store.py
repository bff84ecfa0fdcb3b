"""The server's memory across restarts: a SQLite journal of devices, rounds and updates, plus
model checkpoints, so a killed server resumes from its last completed round.

Layout of a run directory::

    journal.sqlite3            WAL-mode SQLite: meta, devices, rounds, reports (one per device and phase),
                               credentials, proofs (the replay cache), closures (connections ended for cause)
    checkpoints/round-000012.npz

A round is complete when its journal row says so; that row is committed only after its
checkpoint is durably on disk (temp file, fsync, ``os.replace``, fsync of the directory), and it
records the checkpoint's sha256. A crash at any point therefore leaves either the new round
complete with an intact checkpoint, or the previous round as the last complete one.

A checkpoint whose bytes no longer match the journal (truncated, edited, deleted) cannot come from
a crash under this protocol; it means the disk or a person changed it. :meth:`Store.last_completed`
then raises :class:`CheckpointCorrupted` naming the file and the intact rounds, instead of silently
resuming from an older model.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import threading
import time
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from edge_sdk.credentials import derive_key, new_secret
from edge_sdk.fileio import atomic_write, remove_leftovers

JOURNAL = "journal.sqlite3"
CHECKPOINTS = "checkpoints"
MAX_CLOSURES = 100_000  # closures journaled (the newest kept)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS devices (
    device_id TEXT PRIMARY KEY,
    profile TEXT NOT NULL,
    plan TEXT NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY,
    started REAL NOT NULL,
    finished REAL,
    selected TEXT NOT NULL,
    metrics TEXT,
    checkpoint TEXT,
    sha256 TEXT
);
CREATE TABLE IF NOT EXISTS credentials (
    device_id TEXT PRIMARY KEY,
    key BLOB NOT NULL,
    samples INTEGER,
    enrolled REAL NOT NULL,
    revoked REAL
);
CREATE TABLE IF NOT EXISTS proofs (
    device_id TEXT NOT NULL,
    nonce TEXT NOT NULL,
    seen REAL NOT NULL,
    PRIMARY KEY (device_id, nonce)
);
CREATE INDEX IF NOT EXISTS proofs_seen ON proofs(seen);
CREATE TABLE IF NOT EXISTS closures (
    at REAL NOT NULL,
    device_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    round INTEGER,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS reports (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    phase TEXT NOT NULL,
    received REAL NOT NULL,
    accepted INTEGER,
    info TEXT NOT NULL,
    PRIMARY KEY (round, device_id, phase)
);
CREATE TABLE IF NOT EXISTS transfers (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    payload_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    direction TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    held INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS transfers_round ON transfers(round);
"""

#: Per-block update norms of committed rounds (orchestrator/aggregation/normbound.py); created on first use.
_NORM_SCHEMA = """
CREATE TABLE IF NOT EXISTS norm_history (
    round INTEGER NOT NULL,
    device_id TEXT NOT NULL,
    block INTEGER NOT NULL,
    split INTEGER NOT NULL,
    norm REAL NOT NULL,
    PRIMARY KEY (round, device_id, block)
)"""

#: The privacy ledger after each round's release (orchestrator/aggregation/privacy/intake.py); created on first use.
_PRIVACY_SCHEMA = """
CREATE TABLE IF NOT EXISTS privacy (
    round INTEGER PRIMARY KEY,
    state TEXT NOT NULL
)"""


class StoreError(RuntimeError):
    """The journal and the caller disagree (e.g. completing a round that was never begun)."""


class CheckpointCorrupted(StoreError):
    """A completed round's checkpoint is missing or does not match its recorded sha256."""


def checkpoint_name(round: int) -> str:
    return f"round-{round:06d}.npz"


class Store:
    """Journal plus checkpoints in one directory. Safe to call from several threads."""

    def __init__(self, directory: Path | str, *, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.directory = Path(directory)
        self.checkpoints = self.directory / CHECKPOINTS
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            self.directory / JOURNAL, isolation_level=None, check_same_thread=False, timeout=30.0
        )
        self._db.row_factory = sqlite3.Row
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise StoreError(f"could not put {self.directory / JOURNAL} in WAL mode (got {mode!r})")
        # NORMAL survives a killed process; complete_round switches to FULL for its own commit.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        with self._transaction():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
        remove_leftovers(self.checkpoints)  # writes a crash interrupted

    # -- plumbing ----------------------------------------------------------------------------
    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- meta --------------------------------------------------------------------------------
    def set_meta(self, key: str, value: object) -> None:
        """Remember a run setting (model, strategy, config) so ``--resume`` can check it."""
        with self._lock, self._transaction():
            self._db.execute(
                "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, _dumps(value)),
            )

    def get_meta(self, key: str, default: object = None) -> object:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row["value"])

    # -- credentials -------------------------------------------------------------------------
    def enroll(self, device_id: str, *, samples: int | None = None) -> str:
        """Issue a credential for ``device_id`` and return its secret (shown once, stored only as
        ``derive_key(secret)``). ``samples`` fixes the sample count its reports may weigh.
        Enrolling an enrolled device replaces its credential (the old secret stops working)."""
        if not device_id or len(device_id) > 128:
            raise ValueError("device_id must be 1-128 characters")
        if samples is not None and samples < 1:
            raise ValueError(f"samples must be positive, got {samples}")
        secret = new_secret()
        with self._lock, self._transaction():
            self._db.execute(
                """INSERT INTO credentials(device_id, key, samples, enrolled, revoked) VALUES (?, ?, ?, ?, NULL)
                   ON CONFLICT(device_id) DO UPDATE SET key = excluded.key, samples = excluded.samples,
                       enrolled = excluded.enrolled, revoked = NULL""",
                (device_id, derive_key(secret), samples, time.time()),
            )
        return secret

    def revoke(self, device_id: str) -> bool:
        """Revoke a device's credential; False if it had none (or it was revoked already)."""
        with self._lock, self._transaction():
            cur = self._db.execute("UPDATE credentials SET revoked = ? WHERE device_id = ? AND revoked IS NULL",
                                   (time.time(), device_id))
        return cur.rowcount > 0

    def credential(self, device_id: str) -> dict | None:
        """A device's credential (key, samples, enrolled, revoked), or None if never enrolled."""
        with self._lock:
            row = self._db.execute("SELECT * FROM credentials WHERE device_id = ?", (device_id,)).fetchone()
        return None if row is None else {k: row[k] for k in row.keys()}

    def credentials(self) -> list[dict]:
        """Every enrolled device, without its key."""
        with self._lock:
            rows = self._db.execute("SELECT device_id, samples, enrolled, revoked FROM credentials "
                                    "ORDER BY device_id").fetchall()
        return [{k: r[k] for k in r.keys()} for r in rows]

    def revoked_since(self, since: float) -> list[tuple[str, float]]:
        """Devices revoked at or after ``since`` (unix time), with when: what a running server
        polls for, as ``edgetrain device revoke`` writes from another process."""
        with self._lock:
            rows = self._db.execute("SELECT device_id, revoked FROM credentials WHERE revoked >= ? ORDER BY revoked",
                                    (since,)).fetchall()
        return [(r["device_id"], r["revoked"]) for r in rows]

    # -- replay cache ------------------------------------------------------------------------
    def record_proofs(self, proofs: Iterable[tuple[str, str, float]], *, forget_before: float) -> None:
        """Remember accepted credential proofs ``(device_id, nonce, seen)`` in one commit, and forget
        those seen before ``forget_before`` (a proof that old is refused for its timestamp anyway)."""
        rows = list(proofs)
        with self._lock, self._transaction():
            self._db.executemany("INSERT OR IGNORE INTO proofs(device_id, nonce, seen) VALUES (?, ?, ?)", rows)
            self._db.execute("DELETE FROM proofs WHERE seen < ?", (forget_before,))

    def proofs_since(self, since: float) -> list[tuple[str, str, float]]:
        """Proofs accepted at or after ``since``, oldest first: the replay cache a restarted server reloads."""
        with self._lock:
            rows = self._db.execute("SELECT device_id, nonce, seen FROM proofs WHERE seen >= ? ORDER BY seen",
                                    (since,)).fetchall()
        return [(r["device_id"], r["nonce"], r["seen"]) for r in rows]

    # -- closures ----------------------------------------------------------------------------
    def record_closures(self, closures: Iterable[tuple[float, str, str, int | None, str]]) -> None:
        """Journal connections the server refused or ended for cause, ``(at, device_id, kind, round,
        reason)`` (kind: unauthorized, revoked, fetch_limit, ...), in one commit. The newest
        ``MAX_CLOSURES`` are kept: a flood of refused hellos must not fill the disk."""
        rows = list(closures)
        if rows:
            with self._lock, self._transaction():
                self._db.executemany("INSERT INTO closures(at, device_id, kind, round, reason) VALUES (?, ?, ?, ?, ?)",
                                     rows)
                self._db.execute("DELETE FROM closures WHERE rowid <= (SELECT MAX(rowid) FROM closures) - ?",
                                 (MAX_CLOSURES,))

    def closures(self, kind: str | None = None) -> list[dict]:
        """Journaled closures (of one kind, or all), oldest first."""
        query, args = "SELECT * FROM closures", ()
        if kind is not None:
            query, args = query + " WHERE kind = ?", (kind,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY at", args).fetchall()
        return [{k: r[k] for k in r.keys()} for r in rows]

    # -- devices -----------------------------------------------------------------------------
    def record_device(self, device_id: str, profile: Mapping[str, object], plan: Mapping[str, object]) -> None:
        """Insert or refresh a device: its latest profile and plan, and when it was last seen."""
        self.record_devices([(device_id, profile, plan)])

    def record_devices(self, devices: Iterable[tuple[str, Mapping[str, object] | str, Mapping[str, object] | str]]
                       ) -> int:
        """:meth:`record_device` for many devices in one transaction (a fleet's hellos arrive in
        bursts: one commit per hello would be most of the server's work per hello). A profile or
        plan may be given as its JSON text already (plans are shared by many devices). Returns the
        number of devices written."""
        now = time.time()
        rows = [(device_id, profile if isinstance(profile, str) else _dumps(profile),
                 plan if isinstance(plan, str) else _dumps(plan), now, now) for device_id, profile, plan in devices]
        if not rows:
            return 0
        with self._lock, self._transaction():
            self._db.executemany(
                """INSERT INTO devices(device_id, profile, plan, first_seen, last_seen) VALUES (?, ?, ?, ?, ?)
                   ON CONFLICT(device_id) DO UPDATE SET
                       profile = excluded.profile, plan = excluded.plan, last_seen = excluded.last_seen""",
                rows,
            )
        return len(rows)

    def devices(self) -> list[dict]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM devices ORDER BY first_seen, device_id").fetchall()
        return [
            {
                "device_id": r["device_id"],
                "profile": json.loads(r["profile"]),
                "plan": json.loads(r["plan"]),
                "first_seen": r["first_seen"],
                "last_seen": r["last_seen"],
            }
            for r in rows
        ]

    # -- rounds ------------------------------------------------------------------------------
    def begin_round(self, round: int, selected: list[str]) -> None:
        """Journal the start of a round. Re-beginning an incomplete round (after a crash) resets it."""
        round = _round_number(round)
        with self._lock, self._transaction():
            row = self._db.execute("SELECT finished FROM rounds WHERE round = ?", (round,)).fetchone()
            if row is not None and row["finished"] is not None:
                raise StoreError(f"round {round} is already complete; cannot begin it again")
            last = self._db.execute("SELECT MAX(round) AS r FROM rounds WHERE finished IS NOT NULL").fetchone()["r"]
            if last is not None and round <= last:
                raise StoreError(f"round {round} is not after the last completed round {last}")
            self._db.execute("DELETE FROM reports WHERE round = ?", (round,))
            self._db.execute(
                """INSERT INTO rounds(round, started, selected) VALUES (?, ?, ?)
                   ON CONFLICT(round) DO UPDATE SET started = excluded.started, selected = excluded.selected""",
                (round, time.time(), _dumps(list(selected))),
            )

    def record_update(self, round: int, device_id: str, info: Mapping[str, object], phase: str = "train") -> None:
        """Journal one device's report of one phase (a round may hold several per device): role,
        trained range, samples, metrics, accepted/reason."""
        round = _round_number(round)
        accepted = info.get("accepted")
        with self._lock, self._transaction():
            row = self._db.execute("SELECT finished FROM rounds WHERE round = ?", (round,)).fetchone()
            if row is None:
                raise StoreError(f"round {round} was not begun; call begin_round first")
            if row["finished"] is not None:
                raise StoreError(f"round {round} is already complete; late update from {device_id!r}")
            self._db.execute(
                """INSERT INTO reports(round, device_id, phase, received, accepted, info) VALUES (?, ?, ?, ?, ?, ?)
                   ON CONFLICT(round, device_id, phase) DO UPDATE SET
                       received = excluded.received, accepted = excluded.accepted, info = excluded.info""",
                (round, device_id, phase, time.time(), None if accepted is None else int(bool(accepted)),
                 _dumps(info)),
            )

    def record_transfers(self, round: int, rows: Iterable[tuple[str, str, str, str, int, int]]) -> None:
        """Journal a round's payload movements: (device, payload id, kind, ``down``/``up``, bytes
        sent, bytes the device held and was not sent). A payload with ``held`` > 0 and no byte sent
        came from the device's own store (or its bundle). Replaces what an earlier try of the round
        journaled."""
        round = _round_number(round)
        with self._lock, self._transaction():
            self._db.execute("DELETE FROM transfers WHERE round = ?", (round,))
            self._db.executemany(
                "INSERT INTO transfers(round, device_id, payload_id, kind, direction, bytes, held) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(round, d, pid, kind, direction, int(n), int(held)) for d, pid, kind, direction, n, held in rows])

    def transfers(self, round: int | None = None) -> list[dict]:
        """The journaled payload movements, of one round or all, in the order they happened."""
        sql = "SELECT round, device_id, payload_id, kind, direction, bytes, held FROM transfers"
        args: tuple = ()
        if round is not None:
            sql, args = sql + " WHERE round = ?", (_round_number(round),)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY rowid", args).fetchall()
        return [{**dict(r), "from_device_store": bool(r["held"]) and r["bytes"] == 0} for r in rows]

    def mark_weight_capped(self, round: int, kept: Mapping[str, float]) -> None:
        """Mark the accepted reports of round ``round`` whose weight the strategy's cap reduced:
        ``kept`` is device -> the fraction of its weight it kept (``bounded.weight_kept``)."""
        round = _round_number(round)
        with self._lock, self._transaction():
            rows = self._db.execute("SELECT device_id, phase, info FROM reports WHERE round = ? AND accepted = 1",
                                    (round,)).fetchall()
            for row in rows:
                if row["device_id"] not in kept:
                    continue
                info = json.loads(row["info"])
                info["bounded"] = {**(info.get("bounded") or {}), "weight_kept": kept[row["device_id"]]}
                self._db.execute("UPDATE reports SET info = ? WHERE round = ? AND device_id = ? AND phase = ?",
                                 (_dumps(info), round, row["device_id"], row["phase"]))

    def complete_round(self, round: int, state: Mapping[str, np.ndarray], metrics: Mapping[str, object]) -> None:
        """Write the round's checkpoint durably, then mark the round complete in the journal."""
        round = _round_number(round)
        with self._lock:
            row = self._db.execute("SELECT finished FROM rounds WHERE round = ?", (round,)).fetchone()
            if row is None:
                raise StoreError(f"round {round} was not begun; call begin_round first")
            if row["finished"] is not None:
                raise StoreError(f"round {round} is already complete")
            path = self.checkpoints / checkpoint_name(round)
            digest = _write_checkpoint(path, state)
            # The checkpoint is durable; now the single commit that makes the round complete.
            self._db.execute("PRAGMA synchronous=FULL")
            try:
                with self._transaction():
                    self._db.execute(
                        "UPDATE rounds SET finished = ?, metrics = ?, checkpoint = ?, sha256 = ? WHERE round = ?",
                        (time.time(), _dumps(metrics), path.name, digest, round),
                    )
            finally:
                self._db.execute("PRAGMA synchronous=NORMAL")
            self._prune()

    def _prune(self) -> None:
        """Delete checkpoints of completed rounds older than the last ``keep`` (journal rows stay)."""
        rows = self._db.execute(
            "SELECT checkpoint FROM rounds WHERE finished IS NOT NULL AND checkpoint IS NOT NULL ORDER BY round DESC"
        ).fetchall()
        keep = {r["checkpoint"] for r in rows[: self.keep]}
        for path in self.checkpoints.glob("round-*.npz"):
            if path.name not in keep:
                path.unlink(missing_ok=True)

    def last_completed(self) -> tuple[int, dict[str, np.ndarray]] | None:
        """The last completed round and its model, verified against the journal's sha256.

        Raises :class:`CheckpointCorrupted` if that checkpoint is missing or damaged.
        """
        with self._lock:
            rows = self._db.execute(
                "SELECT round, checkpoint, sha256 FROM rounds WHERE finished IS NOT NULL ORDER BY round DESC"
            ).fetchall()
        if not rows:
            return None
        return rows[0]["round"], self._verified(rows[0], rows)

    def checkpoint(self, round: int) -> dict[str, np.ndarray]:
        """The model of completed round ``round``, verified against the journal's sha256. A LookupError
        when the round is not complete or its checkpoint was pruned (only the last ``keep`` are kept);
        :class:`CheckpointCorrupted` when the last completed round's is missing, or any is damaged."""
        round = _round_number(round)
        with self._lock:
            rows = self._db.execute(
                "SELECT round, checkpoint, sha256 FROM rounds WHERE finished IS NOT NULL ORDER BY round DESC"
            ).fetchall()
        row = next((r for r in rows if r["round"] == round), None)
        if row is None:
            done = f"the last completed round is {rows[0]['round']}" if rows else "no round is complete"
            raise LookupError(f"round {round} is not a completed round of {self.directory} ({done})")
        if row is not rows[0] and not (self.checkpoints / row["checkpoint"]).is_file():
            kept = sorted(r["round"] for r in rows if (self.checkpoints / r["checkpoint"]).is_file())
            raise LookupError(f"the checkpoint of round {round} is no longer in {self.checkpoints} (a store keeps "
                              f"the last few; rounds with one: {', '.join(map(str, kept)) or 'none'})")
        return self._verified(row, rows)

    def _verified(self, row: sqlite3.Row, rows: list[sqlite3.Row]) -> dict[str, np.ndarray]:
        """The checkpoint of journal row ``row``, read and checked against its sha256."""
        path = self.checkpoints / row["checkpoint"]
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointCorrupted(self._corruption(row["round"], path, "is missing", rows)) from None
        actual = hashlib.sha256(data).hexdigest()
        if actual != row["sha256"]:
            raise CheckpointCorrupted(
                self._corruption(
                    row["round"], path, f"has sha256 {actual[:12]}..., the journal recorded {row['sha256'][:12]}...", rows
                )
            )
        return _read_checkpoint(data, path)

    def _corruption(self, round: int, path: Path, what: str, rows: list[sqlite3.Row]) -> str:
        intact = [
            r["round"]
            for r in rows
            if r["round"] != round and (self.checkpoints / r["checkpoint"]).is_file()
            and _sha256_file(self.checkpoints / r["checkpoint"]) == r["sha256"]
        ]
        hint = (
            f"intact checkpoints remain for rounds {sorted(intact)}"
            if intact
            else "no other intact checkpoint remains"
        )
        return (
            f"checkpoint of completed round {round} ({path}) {what}; it was changed or removed after it was written, "
            f"so the run cannot resume from it ({hint})"
        )

    def rounds(self) -> list[dict]:
        """Every journaled round: started/finished times, selected devices, updates reported, metrics."""
        with self._lock:
            rows = self._db.execute(
                """SELECT r.*, (SELECT COUNT(*) FROM reports u WHERE u.round = r.round) AS reported
                   FROM rounds r ORDER BY r.round"""
            ).fetchall()
        return [
            {
                "round": r["round"],
                "started": r["started"],
                "finished": r["finished"],
                "complete": r["finished"] is not None,
                "selected": json.loads(r["selected"]),
                "reported": r["reported"],
                "metrics": None if r["metrics"] is None else json.loads(r["metrics"]),
                "checkpoint": r["checkpoint"],
                "sha256": r["sha256"],
            }
            for r in rows
        ]

    def updates(self, round: int | None = None) -> list[dict]:
        """Journaled device reports, of one round or all, in arrival order."""
        query = "SELECT * FROM reports"
        args: tuple[object, ...] = ()
        if round is not None:
            query += " WHERE round = ?"
            args = (_round_number(round),)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY round, received, device_id", args).fetchall()
        return [
            {"round": r["round"], "device_id": r["device_id"], "phase": r["phase"], "received": r["received"],
             **json.loads(r["info"])}
            for r in rows
        ]

    # -- norm history (orchestrator/aggregation/normbound.py) ---------------------------------------------
    def _norm_table(self) -> None:
        self._db.execute(_NORM_SCHEMA)

    def record_norms(self, round: int, rows: Iterable[tuple[str, int, int, float]]) -> None:
        """Journal the per-block norms of a round's accepted updates: (device, block, split, norm).
        Recording a round again (after a crash before its completion) replaces its rows."""
        round = _round_number(round)
        with self._lock, self._transaction():
            self._norm_table()
            self._db.executemany(
                "INSERT OR REPLACE INTO norm_history(round, device_id, block, split, norm) VALUES (?, ?, ?, ?, ?)",
                [(round, d, int(b), int(s), float(n)) for d, b, s, n in rows])

    def norm_history(self, per_block: int) -> list[dict]:
        """The last ``per_block`` norms of every block, from completed rounds only, oldest first."""
        with self._lock, self._transaction():
            self._norm_table()
            rows = self._db.execute(
                """SELECT * FROM (
                       SELECT n.*, ROW_NUMBER() OVER (PARTITION BY block ORDER BY n.round DESC, device_id) AS k
                       FROM norm_history n JOIN rounds r ON r.round = n.round WHERE r.finished IS NOT NULL)
                   WHERE k <= ? ORDER BY round, device_id, block""", (per_block,)).fetchall()
        return [{"round": r["round"], "device_id": r["device_id"], "block": r["block"], "split": r["split"],
                 "norm": r["norm"]} for r in rows]

    # -- privacy ledger (orchestrator/aggregation/privacy/intake.py) ----------------------------------------
    def _privacy_table(self) -> None:
        self._db.execute(_PRIVACY_SCHEMA)

    def record_privacy(self, round: int, state: Mapping[str, object]) -> None:
        """Journal the privacy ledger (and clips) as they stand after round ``round``'s release.
        Recording a round again (a retried attempt, or a crash before its completion) replaces it."""
        round = _round_number(round)
        with self._lock, self._transaction():
            self._privacy_table()
            self._db.execute("INSERT OR REPLACE INTO privacy(round, state) VALUES (?, ?)", (round, _dumps(state)))

    def privacy_state(self) -> dict | None:
        """The privacy state journaled with the last completed round (None: none yet), which a
        resumed run continues: a round cut before its completion is run again, and accounted again."""
        with self._lock, self._transaction():
            self._privacy_table()
            row = self._db.execute(
                """SELECT p.state FROM privacy p JOIN rounds r ON r.round = p.round
                   WHERE r.finished IS NOT NULL ORDER BY p.round DESC LIMIT 1""").fetchone()
        return None if row is None else json.loads(row["state"])

    # -- reading a run from outside (the store owns its schema: nobody else writes SQL) ---------
    @classmethod
    def open_readonly(cls, directory: Path | str) -> Store:
        """The store in ``directory``, opened to read only: nothing is created, changed or pruned, so
        it may watch a run that is still going (the journal is in WAL mode: a reader never blocks the
        writer). Its read methods (:meth:`rounds`, :meth:`updates`, :meth:`devices`, :meth:`get_meta`,
        :meth:`completed_rounds`, :meth:`last_completed`, ...) work as on a writable store; a write
        fails. Raises FileNotFoundError when ``directory`` holds no journal yet."""
        store = cls.__new__(cls)
        store.directory = Path(directory)
        store.checkpoints = store.directory / CHECKPOINTS
        store.keep = 0
        store._lock = threading.Lock()
        journal = store.directory / JOURNAL
        if not journal.is_file():
            raise FileNotFoundError(f"{store.directory} holds no journal ({JOURNAL})")
        store._db = sqlite3.connect(f"{journal.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False,
                                    timeout=30.0)
        store._db.row_factory = sqlite3.Row
        tables = {r["name"] for r in store._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"meta", "devices", "rounds", "reports"} <= tables:  # a writer is creating it this moment
            store._db.close()
            raise FileNotFoundError(f"{store.directory} holds no journal yet ({JOURNAL} has no tables)")
        return store

    def completed_rounds(self) -> int:
        """The number of the last completed round, 0 if none: a run resumed from this store starts
        at the round after it. Reads the journal only (no checkpoint is read or checked)."""
        with self._lock:
            row = self._db.execute("SELECT MAX(round) AS r FROM rounds WHERE finished IS NOT NULL").fetchone()
        return int(row["r"] or 0)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on error (the connection runs in autocommit mode)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._db.execute("ROLLBACK" if exc_type is not None else "COMMIT")


def _round_number(round: object) -> int:
    if isinstance(round, bool) or not isinstance(round, (int, np.integer)) or round < 0:
        raise ValueError(f"round must be a non-negative integer, got {round!r}")
    return int(round)


def _dumps(value: object) -> str:
    return json.dumps(value, default=_json_default, allow_nan=True)


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (Path, os.PathLike)):
        return os.fspath(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"cannot store {type(value).__name__} in the journal: {value!r}")


def _write_checkpoint(path: Path, state: Mapping[str, np.ndarray]) -> str:
    """Atomically write ``state`` as .npz; return its sha256."""
    buffer = io.BytesIO()
    arrays = {}
    for key, value in state.items():
        array = np.asarray(value)
        if array.dtype == object:
            raise TypeError(f"checkpoint entry {key!r} is not a numeric array")
        arrays[key] = array
    np.savez(buffer, **arrays)
    data = buffer.getbuffer()
    digest = hashlib.sha256(data).hexdigest()
    atomic_write(path, data)
    return digest


def _read_checkpoint(data: bytes, path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise CheckpointCorrupted(f"checkpoint {path} matches its sha256 but cannot be read: {exc}") from exc


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

