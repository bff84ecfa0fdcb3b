"""Upgrade tickets: how a browser page proves itself on the websocket upgrade without a header.

A page cannot set the upgrade request's ``Authorization`` header, so it asks first, over an
authenticated https request (``/ticket.json`` with a credential proof made for ``ticket``, or the
shared token), for a ticket, and carries it on the upgrade as ``?ticket=<ticket>``. A ticket is 128
random bits held only here, bound to one device id, good for :data:`TICKET_LIFETIME_S` seconds and
for one upgrade: an upgrade that redeems one is proven as the header would prove it (exempt from the
pending-hello caps, its hello must name the ticket's device). Tickets are issued only to requests
that proved themselves, at most :data:`MAX_TICKETS` are outstanding, so outsiders cannot fill this
table, and at most :data:`TICKETS_PER_DEVICE` for one device (a new one retires that device's
oldest), so one credential cannot fill it for the others either. A restart forgets them: a page fetches a new one for each connection. Sans-I/O: the
caller passes the clock.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

__all__ = ["MAX_TICKETS", "TICKETS_PER_DEVICE", "TICKET_LIFETIME_S", "TicketError", "Tickets"]

#: How long a ticket is good for: a page fetches one just before it opens the websocket.
TICKET_LIFETIME_S = 30.0
#: Tickets outstanding at once (a fleet's pages reconnecting together stay far below).
MAX_TICKETS = 10_000
#: Tickets outstanding for one device: a page reconnecting holds one, a few more while it backs off.
TICKETS_PER_DEVICE = 4


class TicketError(ValueError):
    """A ticket that does not open the door: unknown, spent or expired; or no room for a new one."""


class Tickets:
    """Outstanding tickets, oldest first: ticket -> (device id, expiry); and each device's, oldest first."""

    def __init__(self, lifetime_s: float = TICKET_LIFETIME_S, max_tickets: int = MAX_TICKETS,
                 per_device: int = TICKETS_PER_DEVICE) -> None:
        self.lifetime_s = lifetime_s
        self.max_tickets = max_tickets
        self.per_device = per_device
        self._open: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._of: dict[str, list[str]] = {}

    def __len__(self) -> int:
        return len(self._open)

    def _drop(self, ticket: str) -> str | None:
        """Forget ``ticket``; the device it was for (None: not outstanding)."""
        found = self._open.pop(ticket, None)
        if found is None:
            return None
        device_id = found[0]
        mine = self._of[device_id]
        mine.remove(ticket)
        if not mine:
            del self._of[device_id]
        return device_id

    def _expire(self, now: float) -> None:
        while self._open and (oldest := next(iter(self._open.items())))[1][1] <= now:
            self._drop(oldest[0])

    def issue(self, device_id: str, now: float) -> str:
        """A fresh ticket for one upgrade of ``device_id``, good until ``now + lifetime_s``; the
        device's oldest outstanding ticket is retired when it holds ``per_device`` already."""
        self._expire(now)
        mine = self._of.get(device_id, [])
        if len(mine) >= self.per_device:
            self._drop(mine[0])
        if len(self._open) >= self.max_tickets:
            raise TicketError(f"{self.max_tickets} tickets are outstanding; retry later")
        ticket = secrets.token_urlsafe(16)
        self._open[ticket] = (device_id, now + self.lifetime_s)
        self._of.setdefault(device_id, []).append(ticket)
        return ticket

    def redeem(self, ticket: str, now: float) -> str:
        """Spend ``ticket``: the device id it was issued for. Unknown, spent or expired: :class:`TicketError`."""
        self._expire(now)
        device_id = self._drop(ticket)
        if device_id is None:
            raise TicketError("the upgrade ticket is unknown, spent or expired (fetch a new one from /ticket.json)")
        return device_id
