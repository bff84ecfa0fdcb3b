"""A device that keeps running: one run after another, as a service on a board does.

A run ends when the server says goodbye (training over, or a server stopping for an upgrade). A
service then looks for the next run: it builds a fresh client (so the app's data is read again)
and connects, with the client's own backoff while no server answers. A server that ends runs
at once (one already finished) is asked again less and less often, up to ``max_delay_s``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge_sdk.client import DeviceClient, RoundReport

__all__ = ["run_service"]


async def run_service(make_client: Callable[[], DeviceClient], *, once: bool = False, max_delay_s: float = 30.0,
                      on_event: Callable[[str, dict], None] | None = None) -> list[RoundReport]:
    """Run clients from ``make_client`` one run after another (just one with ``once``); returns the
    reports of the last run. A refusal or any error other than a lost connection ends the service."""
    from edge_sdk.client import backoff_delay

    idle_runs = 0
    while True:
        reports = await make_client().run()
        if once:
            return reports
        idle_runs = 0 if reports else idle_runs + 1
        delay = backoff_delay(idle_runs + 2, max_delay_s)  # a restarting server needs a moment
        if on_event is not None:
            on_event("run_over", {"rounds": len({r.round for r in reports}), "next_check_s": round(delay, 2)})
        await asyncio.sleep(delay)
