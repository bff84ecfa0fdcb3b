"""Revocation while connected: a device whose credential is revoked loses its live connection at
once, and nothing it sends afterwards is folded (docs/security.md, "Identity, lifecycle and fair
share").

``edgetrain device revoke`` writes the store from another process and SQLite tells no other
process of a change, so a running server polls the store (``revocation_poll_s``); every report is
checked too, so a report that arrives between two polls is refused all the same.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from edge_sdk import protocol as p
from orchestrator.config import ServerConfig
from orchestrator.parts import Emit, Session
from orchestrator.store import Store

__all__ = ["Revocations"]

log = logging.getLogger(__name__)

Close = Callable[[object, str, str], Awaitable[None]]
#: Journal a connection ended for cause: (device, kind, reason, round) (``Admission.note_closure``).
NoteClosure = Callable[[str, str, str, "int | None"], None]


class Revocations:
    """Closes revoked devices' connections and refuses their reports."""

    def __init__(self, config: ServerConfig, store: Store, sessions: Mapping[str, Session], *,
                 note_closure: NoteClosure, current_round: Callable[[], int | None], close: Close,
                 emit: Emit) -> None:
        self.config, self.store, self.sessions = config, store, sessions
        self.note_closure, self._round, self.close, self.emit = note_closure, current_round, close, emit

    async def watch(self) -> None:
        """Poll the store for credentials revoked since the server started (runs until cancelled)."""
        if not self.config.require_credentials:
            return
        since = time.time()
        while True:
            await asyncio.sleep(self.config.revocation_poll_s)
            try:
                for device_id, at in self.store.credentials.revoked_since(since):
                    since = max(since, at)
                    await self.close_revoked(device_id)
            except Exception:  # a busy journal, say: the next poll tries again
                log.exception("looking for revoked credentials failed")

    async def revoke(self, device_id: str) -> bool:
        """Revoke a device's credential and close its connection at once; False if it had none."""
        revoked = self.store.credentials.revoke(device_id)
        await self.close_revoked(device_id)
        return revoked

    async def close_revoked(self, device_id: str) -> None:
        """End a revoked device's connection with an error frame; nothing it sent or sends is folded
        (its open instructions are missing, an upload it was sending is not awaited back)."""
        session = self.sessions.get(device_id)
        if session is None or session.revoked:
            return
        session.mark_revoked()
        self.note_closure(device_id, "revoked", "credential revoked while connected", self._round())
        self.emit("revoked", {"device": device_id})
        await self.close(session.ws, "unauthorized", "this device's credential was revoked")

    def check(self, session: Session) -> None:
        """Before a report is taken: a credential revoked since the last poll still refuses it."""
        if session.revoked or (self.config.require_credentials
                               and (self.store.credentials.get(session.device_id) or {}).get("revoked") is not None):
            session.mark_revoked()
            self.note_closure(session.device_id, "revoked", "report refused: credential revoked", self._round())
            raise p.ProtocolError("unauthorized", "this device's credential was revoked")
