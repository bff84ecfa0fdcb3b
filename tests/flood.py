"""A hello flood for tests: ``python tests/flood.py URL CONNECTIONS`` keeps CONNECTIONS connections
saying hellos at once (each a made-up budget and a forged credential proof), reconnecting as soon
as one is answered, until it is killed. It prints the number of hellos answered every second.

:func:`flooded_fleet` runs an honest fleet beside it, for the test that holds what a flood must not
change (``tests/test_lifecycle.py``) and the benchmark that measures what it costs
(``bench/hello_flood.py``)."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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


ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class FloodRun:
    history: list[dict]  # the server's rounds
    exit_codes: list[int]  # the device processes'
    errors: list[str]  # the tail of each device's stderr
    refused: int  # the refusals journaled (closures "unauthorized")


async def flooded_fleet(tmp: Path, *, rounds: int, flood_from: int, flood_to: int, connections: int = 100,
                        devices: int = 3, data_root: str | None = None, **server: object) -> FloodRun:
    """``devices`` enrolled device processes (``--once``) train digits_mlp through a real orchestrator
    with credentials required while, from the start of round ``flood_from`` to the end of round
    ``flood_to``, this module's flood keeps ``connections`` connections saying hellos. ``server``:
    further ServerConfig fields."""
    from emulator.localfleet import start_orchestrator
    from orchestrator.config import ServerConfig
    from orchestrator.store import Store

    store_dir = tmp / "store"
    with Store(store_dir) as store:
        for i in range(devices):
            (tmp / f"dev-{i}.secret").write_text(store.credentials.enroll(f"dev-{i}") + "\n")
    flood: list[asyncio.Future] = []
    url = ""

    def on_event(kind: str, data: dict) -> None:
        if kind == "round_start" and data["round"] == flood_from:
            flood.append(asyncio.ensure_future(asyncio.create_subprocess_exec(
                sys.executable, str(Path(__file__)), url, str(connections), cwd=ROOT,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        if kind == "round_end" and data["round"] == flood_to and flood:
            flood.append(asyncio.ensure_future(_stop(flood[0])))

    config = ServerConfig(**{"model": "digits_mlp", "eval_data": "digits", "data_root": data_root,
                             "store_dir": store_dir, "local_steps": 2, "rounds": rounds, "min_devices": devices,
                             "require_credentials": True, "eval_every": 0, "wait_devices_s": 120, "deadline_s": 300,
                             **server})
    orch, served = await start_orchestrator(config, on_event)
    url = f"ws://127.0.0.1:{orch.port}"
    data = ["--data-root", data_root] if data_root else []
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-m", "edge_sdk", "--server", url, "--id", f"dev-{i}", "--budget", "2GiB", "--data", "digits",
        *data, "--client", str(i), "--num-clients", str(devices), "--secret-file", str(tmp / f"dev-{i}.secret"),
        "--reconnect-retries", "0", "--once", cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for i in range(devices)]
    history = await served
    errors = [(await proc.communicate())[1].decode()[-500:] for proc in procs]
    await asyncio.gather(*flood[1:])
    with Store(store_dir) as store:
        refused = len(store.closures.all("unauthorized"))
    return FloodRun(history, [proc.returncode for proc in procs], errors, refused)


async def _stop(proc_future: asyncio.Future) -> None:
    proc = await proc_future
    proc.kill()
    await proc.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
