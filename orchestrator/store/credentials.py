"""Device credentials with their identity keys, and the replay cache of accepted credential proofs.

Enrolling a device issues a secret, shown once: the journal keeps only what the server checks with
(``derive_key(secret)``, edge_sdk.credentials) and the device's identity key, the Ed25519 public
key derived from the same secret that signs its secure rounds' key advertisements
(edge_sdk.secagg.binding). Both are written in one commit, so a device the store admits always has
the identity key a secure round verifies it by. docs/security.md says what that binding holds
against and what it does not (whoever can rewrite the journal can substitute keys).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from edge_sdk.credentials import derive_key, new_secret
from orchestrator.store.database import Database

__all__ = ["Credentials", "Proofs"]


class Credentials:
    """``store.credentials``: one credential per device id, enrolled, replaced or revoked."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def enroll(self, device_id: str, *, samples: int | None = None) -> str:
        """Issue a credential for ``device_id`` and return its secret (shown once, stored only as
        ``derive_key(secret)`` and its identity public key). ``samples`` fixes the sample count its
        reports may weigh. Enrolling an enrolled device replaces its credential and identity key
        (the old secret stops working)."""
        from edge_sdk.secagg import identity_public_key  # the secure extra, as every enrolment needs it

        if not device_id or len(device_id) > 128:
            raise ValueError("device_id must be 1-128 characters")
        if samples is not None and samples < 1:
            raise ValueError(f"samples must be positive, got {samples}")
        secret = new_secret()
        identity = identity_public_key(secret, device_id)
        with self.db.write() as db:
            db.execute("""INSERT INTO credentials(device_id, key, samples, enrolled, revoked, identity)
                          VALUES (?, ?, ?, ?, NULL, ?)
                          ON CONFLICT(device_id) DO UPDATE SET key = excluded.key, samples = excluded.samples,
                              enrolled = excluded.enrolled, revoked = NULL, identity = excluded.identity""",
                       (device_id, derive_key(secret), samples, time.time(), identity))
        return secret

    def revoke(self, device_id: str) -> bool:
        """Revoke a device's credential; False if it had none (or it was revoked already)."""
        with self.db.write() as db:
            cur = db.execute("UPDATE credentials SET revoked = ? WHERE device_id = ? AND revoked IS NULL",
                             (time.time(), device_id))
        return cur.rowcount > 0

    def get(self, device_id: str) -> dict | None:
        """A device's credential (key, samples, enrolled, revoked), or None if never enrolled."""
        row = self.db.one("SELECT device_id, key, samples, enrolled, revoked FROM credentials WHERE device_id = ?",
                          (device_id,))
        return None if row is None else dict(row)

    def all(self) -> list[dict]:
        """Every enrolled device, without its keys."""
        return [dict(r) for r in self.db.read("SELECT device_id, samples, enrolled, revoked FROM credentials "
                                              "ORDER BY device_id")]

    def revoked_since(self, since: float) -> list[tuple[str, float]]:
        """Devices revoked at or after ``since`` (unix time), with when: what a running server
        polls for, as ``edgetrain device revoke`` writes from another process."""
        rows = self.db.read("SELECT device_id, revoked FROM credentials WHERE revoked >= ? ORDER BY revoked", (since,))
        return [(r["device_id"], r["revoked"]) for r in rows]

    def identities(self) -> dict[str, bytes]:
        """Device id -> its identity public key (32 bytes), for every enrolled device that has one:
        the roster a secure round verifies key advertisements against (read as each round begins,
        so a device enrolled while the server runs joins the next round)."""
        rows = self.db.read("SELECT device_id, identity FROM credentials WHERE identity IS NOT NULL "
                            "ORDER BY device_id")
        return {r["device_id"]: bytes(r["identity"]) for r in rows}


class Proofs:
    """``store.proofs``: the nonces of accepted credential proofs, so a hello replayed after a
    restart is refused (docs/security.md)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def record(self, proofs: Iterable[tuple[str, str, float]], *, forget_before: float) -> None:
        """Remember accepted credential proofs ``(device_id, nonce, seen)`` in one commit, and forget
        those seen before ``forget_before`` (a proof that old is refused for its timestamp anyway)."""
        rows = list(proofs)
        with self.db.write() as db:
            db.executemany("INSERT OR IGNORE INTO proofs(device_id, nonce, seen) VALUES (?, ?, ?)", rows)
            db.execute("DELETE FROM proofs WHERE seen < ?", (forget_before,))

    def since(self, since: float) -> list[tuple[str, str, float]]:
        """Proofs accepted at or after ``since``, oldest first: the replay cache a restarted server reloads."""
        rows = self.db.read("SELECT device_id, nonce, seen FROM proofs WHERE seen >= ? ORDER BY seen", (since,))
        return [(r["device_id"], r["nonce"], r["seen"]) for r in rows]
