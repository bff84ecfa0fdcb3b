"""A hello flood for tests: ``python tests/flood.py URL CONNECTIONS`` keeps CONNECTIONS connections
saying hellos at once (each a made-up budget and a forged credential proof), reconnecting as soon
as one is answered, until it is killed. It prints the number of hellos answered every second."""

from __future__ import annotations

import asyncio
import random
import sys

from websockets.asyncio.client import connect

from edge_sdk import protocol as p
from edge_sdk.credentials import make_proof
from edge_sdk.transport import recv_msg, send_msg, ws_options


async def _one(url: str, n: int, answered: list[int]) -> None:
    rng = random.Random(n)
    while True:
        device_id = f"bogus-{n}-{rng.randrange(1 << 30)}"
        hello = p.Hello(device_id=device_id, token=make_proof(device_id, "forged"),
                        budget_bytes=(256 << 20) + rng.randrange(1 << 30), cores=1, runtimes=["torch"],
                        num_samples=1 + rng.randrange(10_000))
        try:
            async with connect(url, **ws_options(), open_timeout=30) as ws:
                await send_msg(ws, hello)
                await recv_msg(ws)
                answered[0] += 1
        except Exception:  # refused, closed, 503: try again
            await asyncio.sleep(0.05)


async def main(url: str, connections: int) -> None:
    answered = [0]
    tasks = [asyncio.create_task(_one(url, n, answered)) for n in range(connections)]
    while True:
        await asyncio.sleep(1.0)
        print(answered[0], flush=True)
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
