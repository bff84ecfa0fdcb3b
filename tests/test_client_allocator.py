"""Where a device's freed large buffers go (edge_sdk.memory, DeviceSettings.trim_memory).

A device process starts by giving every large buffer its own mapping, so a freed tensor goes back to
the OS at once, at the price of page faults on each large tensor of every step. Once its plan is
known, a device whose budget has room over the planned footprint keeps freed buffers in the heap for
the next step and trims after every phase; one planned close to its budget keeps the mappings. An
emulator's worker runs many devices and keeps its heap throughout.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_sdk.memory import KEEP_HEADROOM, _libc, may_keep_freed_buffers
from emulator.localfleet import DeviceLaunch, role_budgets, run_local_fleet
from orchestrator.config import ServerConfig
from tests.factories import server_config

needs_glibc = pytest.mark.skipif(_libc() is None, reason="no glibc-style allocator controls on this C library")

_CODE = """
import numpy as np
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.memory import keep_freed_buffers, release_memory, rss_bytes
config = DeviceSettings(server="ws://127.0.0.1:9", device_id="d", budget_bytes=1 << 30, trim_memory={trim})
DeviceClient(config, np.zeros((4, 3), dtype=np.float32), np.zeros(4, dtype=np.int64))
if {keep} is not None:
    keep_freed_buffers({keep})
released = []
for _ in range(6):  # a 4 MiB tensor allocated, written and freed, as every training step does
    a = np.ones(1 << 19)
    held = rss_bytes()
    del a
    released.append(held - rss_bytes())
before = rss_bytes()
release_memory()
print(min(released[2:]), before - rss_bytes())
"""


def _released(trim: bool, keep: bool | None = None) -> tuple[int, int]:
    """Bytes a freed 4 MiB buffer gives back to the OS at once (after two warm-up rounds), and bytes
    the trim after the phase gives back."""
    out = subprocess.run([sys.executable, "-c", _CODE.format(trim=trim, keep=keep)], capture_output=True, text=True,
                         check=True)
    freed, trimmed = out.stdout.split()[-2:]
    return int(freed), int(trimmed)


@needs_glibc
def test_a_device_maps_large_buffers_and_a_worker_reuses_them() -> None:
    # Read as resident memory, not page faults: with transparent huge pages a fresh 4 MiB mapping
    # faults in as two pages, so a fault count says little about which policy ran.
    assert _released(True)[0] >= 3 << 20  # its own mapping: unmapped when freed, out of the budget at once
    assert _released(False)[0] < 1 << 20  # from the heap: stays resident, reused by the next step


@needs_glibc
def test_kept_buffers_stay_for_the_next_step_and_go_at_the_trim() -> None:
    freed, trimmed = _released(True, keep=True)
    assert freed < 1 << 20 and trimmed >= 3 << 20  # reused while training, handed back after the phase
    freed, _ = _released(True, keep=False)
    assert freed >= 3 << 20


_WORKER_CODE = """
import numpy as np
from edge_sdk.memory import rss_bytes
if {keep}:
    from emulator.lightweight import keep_heap
    assert keep_heap()
for _ in range(3):  # 20 MB of 1 MB buffers (a device round's larger tensors), allocated then freed
    parts = [np.ones(125_000) for _ in range(20)]
    held = rss_bytes()
    del parts
    print(held - rss_bytes())
"""


@needs_glibc
def test_a_lightweight_worker_keeps_its_freed_buffers_where_glibc_would_unmap_them() -> None:
    # glibc's own policy gives each buffer over its mapping threshold a mapping of its own, unmapped
    # at the free, and the next device's round faults those pages in again; a worker keeps them in the
    # heap (emulator.lightweight.keep_heap), and never trims it on a free either. Both processes start
    # from glibc's documented 128 KiB threshold, pinned: left dynamic, glibc raises it to the largest
    # mapping freed so far, which depends on what the imports happened to free. What the heap's own
    # trim on a free gives back is not compared: it depends on whether the freed buffers lie at the top
    # of the heap, that is on the order of every allocation before them (on one machine nothing lay
    # there and nothing was trimmed, with or without keep).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 << 10)}

    def released(keep: bool) -> int:
        out = subprocess.run([sys.executable, "-c", _WORKER_CODE.format(keep=keep)], capture_output=True, text=True,
                             check=True, cwd=Path(__file__).resolve().parents[1], env=env)
        return min(int(x) for x in out.stdout.split())

    assert released(False) >= 18 << 20
    assert released(True) < 2 << 20


_SERVER_CODE = """
import threading
import numpy as np
from edge_sdk.memory import KeptHeap, rss_bytes, tune_allocator
tune_allocator()  # the server's setting: a mapping per large buffer
kept = KeptHeap()
def burst(out):
    for _ in range(6):  # an evaluation's activations: 4 MiB allocated, written, freed
        a = np.ones(1 << 19)
        held = rss_bytes()
        del a
        out.append(held - rss_bytes())
inside, outside, still = [], [], []
def work():  # as the server runs it: in a worker thread, whose malloc arena is not the main one
    with kept:
        with kept:  # bursts nest: the heap is kept until the last ends
            burst(inside)
        still.append(rss_bytes())
t = threading.Thread(target=work)
t.start(); t.join()
after = rss_bytes()
burst(outside)
print(min(inside[2:]), still[0] - after, min(outside[2:]))
"""


@needs_glibc
def test_a_server_keeps_freed_buffers_only_while_it_computes() -> None:
    """A process that maps every large buffer apart (a server, so its memory stays flat over a long
    run) keeps them for reuse while bursts of work run (KeptHeap: the server's own model work, its
    back-to-back rounds) and hands them back when the last ends."""
    out = subprocess.run([sys.executable, "-c", _SERVER_CODE], capture_output=True, text=True, check=True)
    inside, trimmed, outside = (int(v) for v in out.stdout.split()[-3:])
    assert inside < 1 << 20  # reused by the next batch's tensors
    assert trimmed >= 3 << 20  # handed back when the last burst ended
    assert outside >= 3 << 20  # then each buffer is unmapped when freed, as before


_IDLE_CODE = """
import asyncio
import numpy as np
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.memory import keep_freed_buffers, rss_bytes
config = DeviceSettings(server="ws://127.0.0.1:9", device_id="d", budget_bytes=1 << 30, idle_trim_s=0.3)
client = DeviceClient(config, np.zeros((4, 3), dtype=np.float32), np.zeros(4, dtype=np.int64))
client.memory.keeps_freed_buffers = keep_freed_buffers(True)  # what a plan with room decides
async def main():
    a = np.ones(1 << 19)  # a round's 4 MiB tensor, freed into the kept heap
    del a
    held = rss_bytes()
    client.memory.released_after_report()
    await asyncio.sleep(0.1)
    soon = rss_bytes()  # right after the report: kept for the next round
    client.memory.busy()  # the next round's phase starts within the grace: no trim under it
    await asyncio.sleep(0.5)
    busy = rss_bytes()
    client.memory.released_after_report()
    await asyncio.sleep(0.6)
    print(held - soon, held - busy, held - rss_bytes())
asyncio.run(main())
"""


@needs_glibc
def test_a_device_keeping_its_buffers_trims_once_idle() -> None:
    """Back-to-back rounds reuse a device's kept buffers; once idle for ``idle_trim_s`` after its
    report the device hands them back."""
    out = subprocess.run([sys.executable, "-c", _IDLE_CODE], capture_output=True, text=True, check=True)
    soon, busy, idle = (int(v) for v in out.stdout.split()[-3:])
    assert soon < 1 << 20 and busy < 1 << 20
    assert idle >= 3 << 20


def test_a_server_keeps_its_buffers_from_round_to_round_and_hands_them_back_when_it_waits(tmp_path: Path) -> None:
    """The rounds of a run follow each other with buffers of the same sizes (its devices upload
    together, so a round's receive buffers are live at once): kept from one round to the next they
    are not faulted in anew each round. Waiting for devices, and once the run is over, the server
    holds none (RoundHeap.keep)."""
    import numpy as np

    from edge_sdk.cli import load_shard
    from edge_sdk.client import DeviceClient, DeviceSettings
    from emulator.localfleet import start_orchestrator

    held: dict[tuple[str, int], bool] = {}

    async def main() -> tuple[bool, bool]:
        orch = None

        def on_event(kind: str, data: dict) -> None:
            if kind in ("round_start", "round_end"):
                held[(kind, data["round"])] = orch.loop.heap.held

        orch, server = await start_orchestrator(server_config(tmp_path / "s", rounds=3, min_devices=2, local_steps=1,
                                                              wait_devices_s=60, deadline_s=120), on_event)
        await asyncio.sleep(0.3)
        waiting = orch.loop.heap.held  # no device yet: the first round waits for two
        devices = []
        for i in range(2):
            x, y = load_shard("synthetic", client=i, num_clients=2)
            config = DeviceSettings(f"ws://127.0.0.1:{orch.port}", f"dev-{i}", 2 << 30, reconnect=False)
            devices.append(DeviceClient(config, np.asarray(x), np.asarray(y)).run())
        await asyncio.gather(server, *devices)
        return waiting, orch.loop.heap.held

    waiting, after = asyncio.run(main())
    assert not waiting and not after
    assert held == {(kind, r): True for r in (1, 2, 3) for kind in ("round_start", "round_end")}


def test_only_a_budget_with_room_over_the_footprint_keeps_freed_buffers() -> None:
    footprint = 400 << 20
    assert may_keep_freed_buffers(int(footprint * (1 + KEEP_HEADROOM)), footprint)
    assert not may_keep_freed_buffers(int(footprint * (1 + KEEP_HEADROOM)) - 1, footprint)
    assert not may_keep_freed_buffers(footprint, footprint) and not may_keep_freed_buffers(1 << 40, 0)


@pytest.mark.slow
@needs_glibc
def test_the_plan_decides_per_device(tmp_path: Path) -> None:
    """Two real device processes: one planned far under its budget keeps freed buffers, the weak one
    planned at the smallest budget that holds its split returns them at once."""
    budgets = role_budgets("digits_mlp")
    launches = [DeviceLaunch("roomy-0", 4 << 30, client=0, num_clients=2),
                DeviceLaunch("tight-1", budgets["weak"], client=1, num_clients=2)]
    config = ServerConfig(model="digits_mlp", rounds=1, min_devices=2, local_steps=2, store_dir=tmp_path / "store",
                          deadline_s=120)
    run = asyncio.run(run_local_fleet(config, launches))
    welcomes = {d: [e for e in events if e.get("event") == "welcome"] for d, events in run.device_events.items()}
    assert [w["keeps_freed_buffers"] for w in welcomes["roomy-0"]] == [True]
    assert [w["keeps_freed_buffers"] for w in welcomes["tight-1"]] == [False]
    assert [h["reported"] for h in run.history] == [2]
