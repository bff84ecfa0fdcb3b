"""Production devices in the test's own event loop, beside a server started there.

A device that fails in such a test must fail the test at once, with its own error: a server waiting
for ``min_devices`` would otherwise wait for the dead device until the test's timeout, and the
device's exception would stay inside its task. :func:`serve` waits for the server and every device,
and raises the first device error it sees (devices retry a lost connection, as a device in the field
does: a connection lost on a loaded machine is not what these tests are about).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

from edge_sdk.client import DeviceClient

__all__ = ["serve"]


async def serve(server: Awaitable[Any], clients: Sequence[DeviceClient], timeout: float) -> Any:
    """The server's result once it and every client finished; a client's exception (or the
    server's, or a timeout) as soon as it happens, the other tasks cancelled."""
    main = asyncio.ensure_future(server)
    devices = [asyncio.create_task(c.run(), name=c.config.device_id) for c in clients]
    try:
        async with asyncio.timeout(timeout):
            pending: set[asyncio.Future[Any]] = {main, *devices}
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    if task.exception() is not None:
                        name = task.get_name() if task in devices else "the server"
                        raise AssertionError(f"{name} failed: {task.exception()!r}") from task.exception()
        return main.result()
    finally:
        for task in (main, *devices):
            task.cancel()
        await asyncio.gather(main, *devices, return_exceptions=True)
