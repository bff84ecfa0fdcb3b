"""What lets one orchestrator hold ten thousand devices (bench/scale.py), each checked fast with real parts:
hellos of one profile are planned once, the descriptor limit is raised, and a few hundred lightweight
devices (the real client, run by the lightweight worker) connect, are sampled and are said goodbye to."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from edge_sdk import protocol as p
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.server.plancache import PlanCache
from tests.factories import server_config

resource = pytest.importorskip("resource")


def _hello(device_id: str, budget: int = 2 << 30, **changes) -> p.Hello:
    return p.Hello(**{"device_id": device_id, "token": "", "budget_bytes": budget, "cores": 1,
                      "runtimes": ["onnxruntime", "torch"], "num_samples": 10, **changes})


def test_hellos_of_one_profile_are_planned_once(tmp_path: Path) -> None:
    async def main():
        config = server_config(tmp_path / "s", min_devices=99, wait_devices_s=30)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        conns, replies = [], []
        hellos = [_hello(f"d{i}") for i in range(30)] + [_hello("other", 3 << 30), _hello("cores", cores=4)]
        hellos += [_hello("small-1", 1 << 10), _hello("small-2", 1 << 10)]  # too small: refused, once planned
        for hello in hellos:
            ws = await connect(url, **ws_options())
            await send_msg(ws, hello)
            replies.append(await recv_msg(ws))
            conns.append(ws)
        plans = {d: s.plan for d, s in orch.sessions.items()}
        stats = orch.plans.stats()
        for ws in conns:
            await ws.close()
        server.cancel()
        return replies, plans, stats

    replies, plans, stats = asyncio.run(main())
    assert all(isinstance(r, p.Welcome) for r in replies[:32])
    assert [type(r) for r in replies[32:]] == [p.Error, p.Error]
    assert replies[32].code == replies[33].code == "refused" and replies[32].message == replies[33].message
    # 30 equal profiles: one planning, one plan object shared by every session; the other budget,
    # the other core count and the refused budget are one planning each.
    assert stats == {"entries": 4, "hits": 30, "misses": 4}
    assert len({id(plans[f"d{i}"]) for i in range(30)}) == 1
    assert plans["other"] is not plans["d0"] and plans["cores"] is not plans["d0"]


def test_plan_cache_is_bounded_and_least_recently_used_goes_first() -> None:
    cache = PlanCache(max_entries=2)
    cache.put("a", "refused a")
    cache.put("b", "refused b")
    assert cache.get("a") == "refused a"  # a is now the most recent
    cache.put("c", "refused c")
    assert cache.get("b") is None and cache.get("a") == "refused a" and len(cache) == 2


def _lowered_soft_limit() -> int:
    """A soft limit below the hard one that still leaves room for what this process has open."""
    import os

    return max(256, len(os.listdir("/proc/self/fd")) + 64) if Path("/proc/self/fd").is_dir() else 256


@pytest.mark.parametrize("where", ["function", "orchestrator"])
def test_the_descriptor_limit_is_raised_to_the_hard_limit(tmp_path: Path, where: str) -> None:
    from orchestrator.server.limits import raise_fd_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = _lowered_soft_limit()
    if hard != resource.RLIM_INFINITY and hard <= low:
        pytest.skip(f"the hard descriptor limit here is {hard}: nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        if where == "function":
            assert raise_fd_limit() == (low, hard)
        else:  # a real orchestrator raises it when it starts serving
            async def main():
                config = server_config(tmp_path / "s", min_devices=5, wait_devices_s=30)
                _, server = await start_orchestrator(config, lambda kind, data: None)
                server.cancel()

            asyncio.run(main())
        after = resource.getrlimit(resource.RLIMIT_NOFILE)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert after[1] == hard
    assert after[0] > low and (hard == resource.RLIM_INFINITY or after[0] == hard)


def test_hundreds_of_lightweight_devices_are_held_sampled_and_sent_off(tmp_path: Path) -> None:
    """300 real clients in one lightweight worker: every hello gets a welcome from one planning, a
    round samples 10 of them, and the goodbye (said to everyone at once) ends every client."""
    from emulator.launch import DeviceLaunch
    from emulator.lightweight import WorkerDevice, WorkerSpec, run_worker

    n = 300
    events: dict[str, int] = {}
    latencies: list[float] = []

    def on_server(kind: str, data: dict) -> None:
        events[kind] = events.get(kind, 0) + 1
        if kind == "welcomed":
            latencies.append(data["latency_s"])

    lives: dict[str, int] = {}

    def on_device(kind: str, data: dict) -> None:
        if kind == "life_end":
            lives[data["ended"]] = lives.get(data["ended"], 0) + 1

    async def main():
        config = server_config(tmp_path / "s", strategy="fedavg", fraction=10 / n, min_devices=n, eval_every=0,
                               local_steps=1, batch_size=4, wait_devices_s=120, deadline_s=60)
        orch, server = await start_orchestrator(config, on_server)
        spec = WorkerSpec(0, tuple(WorkerDevice(DeviceLaunch(f"d{i:03d}", 512 << 20, client=i % 100, num_clients=100,
                                                             data="synthetic", backend="torch"))
                                   for i in range(n)), threads=1, stop_grace_s=5)
        await asyncio.wait_for(run_worker(spec, f"ws://127.0.0.1:{orch.port}", emit=on_device,
                                          stop=lambda: asyncio.sleep(3600)), timeout=240)
        return await server, orch.plans.stats()

    history, stats = asyncio.run(main())
    assert history[0]["selected"] == history[0]["reported"] == 10
    assert events["welcomed"] == n and len(latencies) == n
    assert stats["misses"] == 1 and stats["hits"] == n - 1
    assert lives == {"finished": n}  # every client heard the goodbye


def test_a_burst_of_hellos_is_journaled_in_one_commit_each_turn(tmp_path: Path) -> None:
    """Hellos arriving together are journaled together, with every device's profile and plan."""
    from orchestrator.store import Store

    async def main():
        config = server_config(tmp_path / "s", min_devices=99, wait_devices_s=30)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        conns = await asyncio.gather(*(connect(url, **ws_options()) for _ in range(40)))
        await asyncio.gather(*(send_msg(ws, _hello(f"d{i:02d}", num_samples=10 + i)) for i, ws in enumerate(conns)))
        replies = await asyncio.gather(*(recv_msg(ws) for ws in conns))
        await asyncio.sleep(0)  # the turn that took the last hello has ended: its commit is written
        journaled = orch.store.devices.all()
        for ws in conns:
            await ws.close()
        server.cancel()
        return replies, journaled

    replies, journaled = asyncio.run(main())
    assert all(isinstance(r, p.Welcome) for r in replies)
    assert sorted(d["device_id"] for d in journaled) == [f"d{i:02d}" for i in range(40)]
    assert {d["profile"]["num_samples"] for d in journaled} == set(range(10, 50))
    assert all(d["plan"]["role"] == "strong" for d in journaled)
    with Store(tmp_path / "t") as store:  # many rows, one call; a second call refreshes, keeping first_seen
        assert store.devices.record_many([(f"x{i}", {"n": i}, '{"role": "weak"}') for i in range(1000)]) == 1000
        first = {d["device_id"]: d["first_seen"] for d in store.devices.all()}
        store.devices.record_many([("x1", {"n": -1}, {"role": "strong"})])
        again = {d["device_id"]: d for d in store.devices.all()}
    assert len(again) == 1000 and again["x1"]["profile"] == {"n": -1} and again["x1"]["plan"] == {"role": "strong"}
    assert again["x1"]["first_seen"] == first["x1"] and again["x2"]["plan"] == {"role": "weak"}


def test_round_queries_after_each_report_cost_no_scan_of_the_round() -> None:
    """The server asks settled / quorum / how many reported after every report: with 20,000
    instructions out these stay O(1) (a scan each would be 4e8 steps), and agree with the statuses."""
    import random
    import time

    from orchestrator.rounds import OUTSTANDING, REPORTED, SKIPPED, RoundState

    rng = random.Random(7)
    rs = RoundState(1, deadline=0.0, quorum=0.5)
    for i in range(300):  # random transitions, checked against the statuses themselves
        d, ph = f"d{rng.randrange(60)}", rng.choice(["train", "evaluate"])
        op = rng.randrange(5)
        try:
            if op == 0:
                rs.issue(d, ph)
            elif op == 1:
                rs.on_report(d, ph, rng.random() < 0.8)
            elif op == 2:
                rs.on_gone(d)
            elif op == 3:
                rs.on_back(d)
            else:
                rs.on_skipped(d, ph)
        except (KeyError, ValueError):
            pass
        assert rs.settled() == (not any(s == OUTSTANDING for s in rs.status.values()))
        assert rs.num_reported() == len({d for (d, _), s in rs.status.items() if s == REPORTED})
        assert rs.num_selected == len({d for d, _ in rs.status})
        assert rs.outstanding == {k for k, s in rs.status.items() if s == OUTSTANDING}
        issued = sum(1 for (_, ph), s in rs.status.items() if ph == "train" and s != SKIPPED)
        done = sum(1 for (_, ph), s in rs.status.items() if ph == "train" and s == REPORTED)
        assert rs.quorum_reached("train") == (issued > 0 and done >= max(1, -(-issued // 2)))

    big = RoundState(2, deadline=0.0)
    n = 20_000
    t0 = time.process_time()
    for i in range(n):
        big.issue(f"d{i}", "train")
    for i in range(n):
        big.on_report(f"d{i}", "train", True)
        big.settled(), big.quorum_reached("train"), big.num_reported(), big.num_selected
    assert big.settled() and big.num_reported() == n
    assert time.process_time() - t0 < 10.0  # about 0.1 s; a scan per report would take minutes


def test_the_accept_queue_holds_a_burst_of_connections(tmp_path: Path) -> None:
    """The listening socket's backlog follows max_pending_hellos (asyncio's default of 100 drops the
    connections of a fleet reconnecting at once); read back from the kernel with ``ss``."""
    import shutil
    import subprocess

    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed")

    async def main():
        config = server_config(tmp_path / "s", min_devices=5, max_pending_hellos=700, wait_devices_s=30)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        out = subprocess.run(["ss", "-Hltn", f"sport = :{orch.port}"], capture_output=True, text=True, timeout=30)
        server.cancel()
        return out.stdout

    line = asyncio.run(main()).split()
    cap = Path("/proc/sys/net/core/somaxconn")
    somaxconn = int(cap.read_text()) if cap.exists() else 700
    assert line[0] == "LISTEN" and int(line[2]) == min(700, somaxconn)  # Send-Q of a listener: its backlog


def test_a_device_turned_away_for_capacity_retries_and_gets_in(tmp_path: Path) -> None:
    """Over max_pending_hellos the server answers HTTP 503 before the upgrade: the real client retries
    with backoff (an error frame would have been final) and is welcomed once there is room."""
    import numpy as np

    from edge_sdk.client import DeviceClient, DeviceSettings

    async def main():
        config = server_config(tmp_path / "s", min_devices=9, max_pending_hellos=2, hello_timeout_s=1.5,
                               wait_devices_s=30)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        silent = [await connect(url, **ws_options()) for _ in range(2)]  # room for no one until they time out
        events: list[str] = []
        welcomed = asyncio.Event()

        def on_event(kind: str, data: dict) -> None:
            events.append(kind)
            if kind == "welcome":
                welcomed.set()

        client = DeviceClient(DeviceSettings(server=url, device_id="late", budget_bytes=2 << 30, backend="torch"),
                              np.zeros((4, 4), np.float32), np.zeros(4, np.int64), on_event=on_event)
        task = asyncio.create_task(client.run())
        await asyncio.wait_for(welcomed.wait(), timeout=30)
        task.cancel()
        for ws in silent:
            await ws.close()
        server.cancel()
        return events

    events = asyncio.run(main())
    assert events.count("reconnect") >= 1 and events[-1] == "welcome"
