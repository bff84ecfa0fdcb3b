"""Identity, lifecycle and fair share against a live server: a proof captured before a restart is
refused after it, a device revoked while connected is cut off and its report not folded, a device
fetching in a loop is cut off, and a stalled or silent device costs a round its straggler grace,
not its deadline. Every refusal is in the journal."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from edge_sdk import protocol as p
from edge_sdk.cli import load_shard
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.credentials import make_proof
from edge_sdk.transport import recv_msg, recv_payload, send_msg, send_payload, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from orchestrator.store import Store
from tests.flood import flooded_fleet


def _config(store_dir: Path, **kw) -> ServerConfig:
    base = dict(model="tiny", eval_data="synthetic", store_dir=store_dir, local_steps=2, wait_devices_s=60,
                deadline_s=300)
    return ServerConfig(**{**base, **kw})


def _hello(device_id: str, token: str = "") -> p.Hello:
    return p.Hello(device_id=device_id, token=token, budget_bytes=2 << 30, cores=1, runtimes=["torch"], num_samples=10)


async def _answer(ws, orch, msg: p.Instruction, device_id: str, welcome: p.Welcome,
                  rng: np.random.Generator | None = None) -> None:
    """Send a report of zero deltas for ``msg`` (an honest no-op update), or of small noise."""
    state = orch.global_state
    deltas = {n: np.zeros_like(state[n]) if rng is None or state[n].dtype.kind != "f"
              else rng.normal(0, 1e-3, state[n].shape).astype(state[n].dtype)
              for n in orch.model.state_names(msg.split)}
    tid = f"{device_id}-{msg.round}"
    await send_msg(ws, p.Report(msg.round, msg.phase, 10, (msg.split, welcome.num_blocks), tid,
                                {"loss_before": 1.0, "loss_after": 0.9}))
    await send_payload(ws, p.encode_tensors(deltas), transfer_id=tid, kind="update", meta={})


async def _honest(url: str, orch, device_id: str, token: str = "", *, noise: int | None = None,
                  budget: int = 2 << 30) -> list[p.Message]:
    """A scripted honest device: answers every instruction with zero deltas (or, with a ``noise``
    seed, small random ones) until goodbye."""
    seen: list[p.Message] = []
    rng = None if noise is None else np.random.default_rng(noise)
    async with connect(url, **ws_options()) as ws:
        await send_msg(ws, replace(_hello(device_id, token), budget_bytes=budget))
        welcome = await recv_msg(ws)
        assert isinstance(welcome, p.Welcome), welcome
        while True:
            msg = await recv_msg(ws)
            seen.append(msg)
            if isinstance(msg, (p.Bye, p.Error)):
                return seen
            if isinstance(msg, p.Instruction):
                for payload_id in (*msg.chunk_ids, msg.model_id):  # downloads what it is sent, as devices do
                    await send_msg(ws, p.Fetch(msg.round, payload_id, 0))
                    await recv_payload(ws, await recv_msg(ws))
                await _answer(ws, orch, msg, device_id, welcome, rng)


def test_a_proof_captured_before_a_restart_is_refused_after_it(tmp_path: Path) -> None:
    """A real device's hello, captured on the wire, replayed to the same store's server after a
    restart with --resume: refused as replayed, and journaled."""
    store_dir = tmp_path / "s"
    with Store(store_dir) as store:
        secret = store.credentials.enroll("dev-0")
    captured: list[bytes] = []

    async def proxy(upstream: str):
        async def relay(client):  # records what the device sends first: its hello
            async with connect(upstream, **ws_options()) as server:
                async def up():
                    async for frame in client:
                        if not captured:
                            captured.append(frame)
                        await server.send(frame)
                    await server.close()

                async def down():
                    async for frame in server:
                        await client.send(frame)
                    await client.close()

                await asyncio.gather(up(), down(), return_exceptions=True)
        return await serve(relay, "127.0.0.1", 0, **ws_options())

    async def first_run():
        orch, server = await start_orchestrator(_config(store_dir, rounds=1, min_devices=1,
                                                        require_credentials=True), lambda k, d: None)
        relay = await proxy(f"ws://127.0.0.1:{orch.port}")
        x, y = load_shard("synthetic", client=0, num_clients=2)
        cfg = DeviceSettings(f"ws://127.0.0.1:{relay.sockets[0].getsockname()[1]}", "dev-0", 2 << 30, secret=secret,
                           reconnect=False)
        await asyncio.gather(DeviceClient(cfg, x, y).run(), server, return_exceptions=True)
        relay.close()
        return server.result()

    async def replay_after_restart():
        orch, server = await start_orchestrator(_config(store_dir, rounds=2, min_devices=1, require_credentials=True,
                                                        resume=True), lambda k, d: None)
        async with connect(f"ws://127.0.0.1:{orch.port}", **ws_options()) as ws:
            await ws.send(captured[0])
            replayed = await recv_msg(ws)
        async with connect(f"ws://127.0.0.1:{orch.port}", **ws_options()) as ws:  # a fresh proof still holds
            await send_msg(ws, _hello("dev-0", make_proof("dev-0", secret)))
            fresh = await recv_msg(ws)
        server.cancel()
        return replayed, fresh

    history = asyncio.run(first_run())
    assert history[0]["reported"] == 1 and captured
    assert isinstance(p.decode(captured[0]), p.Hello)
    replayed, fresh = asyncio.run(replay_after_restart())
    assert isinstance(replayed, p.Error) and replayed.code == "unauthorized" and "replayed" in replayed.message
    assert isinstance(fresh, p.Welcome)
    with Store(store_dir) as store:
        refused = store.closures.all("unauthorized")
    assert [(c["device_id"], "replayed" in c["reason"]) for c in refused] == [("dev-0", True)]


def test_a_device_revoked_while_connected_is_cut_off_and_its_report_not_folded(tmp_path: Path) -> None:
    """``edgetrain device revoke`` from another process (a second store connection): the idle
    device's connection is closed with an error frame, and the report another was about to send
    when it was revoked is refused and not folded; the honest device's round goes on."""
    store_dir = tmp_path / "s"
    with Store(store_dir) as store:
        secrets = {d: store.credentials.enroll(d) for d in ("good", "idle", "bad")}

    async def main():
        orch, server = await start_orchestrator(
            _config(store_dir, rounds=1, min_devices=3, require_credentials=True, straggler_policy="deadline"),
            lambda k, d: None)
        url = f"ws://127.0.0.1:{orch.port}"
        out: dict[str, object] = {}
        conns = {}
        for d in ("idle", "bad"):
            ws = await connect(url, **ws_options())
            await send_msg(ws, _hello(d, make_proof(d, secrets[d])))
            conns[d] = (ws, await recv_msg(ws))
        good = asyncio.create_task(_honest(url, orch, "good", make_proof("good", secrets["good"])))
        ins = {d: await recv_msg(ws) for d, (ws, _) in conns.items()}  # round 1's instructions
        assert all(isinstance(m, p.Instruction) for m in ins.values()), ins
        with Store(store_dir) as other:
            other.credentials.revoke("idle")
        out["idle"] = await asyncio.wait_for(recv_msg(conns["idle"][0]), timeout=60)
        ws, welcome = conns["bad"]
        with Store(store_dir) as other:
            other.credentials.revoke("bad")
        try:
            await _answer(ws, orch, ins["bad"], "bad", welcome)
        except ConnectionClosed:
            pass  # closed by the server's poll first: the error frame is still there to read
        out["bad"] = await asyncio.wait_for(recv_msg(ws), timeout=60)
        out["good"] = await good
        out["history"] = await server
        return out

    out = asyncio.run(main())
    for d in ("idle", "bad"):
        assert isinstance(out[d], p.Error) and out[d].code == "unauthorized" and "revoked" in out[d].message, out[d]
    assert isinstance(out["good"][-1], p.Bye)
    assert out["history"][0]["reported"] == 1 and out["history"][0]["closed_by"] == "all"
    with Store(store_dir) as store:
        accepted = [u["device_id"] for u in store.reports.all(1) if u.get("accepted")]
        revoked = {c["device_id"] for c in store.closures.all("revoked")}
    assert accepted == ["good"] and revoked == {"idle", "bad"}


async def _fetch_loop(url: str, device_id: str) -> tuple[int, p.Message]:
    """A device that fetches its model over and over; returns how many it got and what ended it."""
    got = 0
    async with connect(url, **ws_options()) as ws:
        await send_msg(ws, _hello(device_id))
        assert isinstance(await recv_msg(ws), p.Welcome)
        ins = await recv_msg(ws)
        assert isinstance(ins, p.Instruction), ins
        while True:
            await send_msg(ws, p.Fetch(ins.round, ins.model_id, 0))
            begin = await recv_msg(ws)
            if not isinstance(begin, p.TransferBegin):
                return got, begin
            await recv_payload(ws, begin)
            got += 1


def test_a_device_fetching_its_model_in_a_loop_is_cut_off_and_honest_devices_train_on(tmp_path: Path) -> None:
    store_dir = tmp_path / "s"

    async def main():
        orch, server = await start_orchestrator(_config(store_dir, rounds=2, min_devices=2, fetch_repeats=3,
                                                        straggler_grace_s=1.0), lambda k, d: None)
        url = f"ws://127.0.0.1:{orch.port}"
        x, y = load_shard("synthetic", client=0, num_clients=2)
        honest = DeviceClient(DeviceSettings(url, "honest", 2 << 30, reconnect=False), x, y)
        return await asyncio.gather(_fetch_loop(url, "looper"), honest.run(), server)

    (got, ended), _, history = asyncio.run(main())
    assert isinstance(ended, p.Error) and ended.code == "refused" and "fetch limit" in ended.message
    assert got == 3  # fetch_repeats times its one named payload (tiny at its split needs no chunks)
    assert [h["reported"] for h in history] == [1, 1]
    with Store(store_dir) as store:
        assert [c["device_id"] for c in store.closures.all("fetch_limit")] == ["looper"]


async def _staller(url: str, orch, device_id: str, *, upload: bool) -> None:
    """Takes its instruction and then stalls: says nothing (``upload`` False), or starts its
    update's transfer and never sends a frame of it. Holds its connection until the server ends it."""
    async with connect(url, **ws_options()) as ws:
        await send_msg(ws, _hello(device_id))
        welcome = await recv_msg(ws)
        ins = await recv_msg(ws)
        assert isinstance(ins, p.Instruction), ins
        if upload:
            tid = f"{device_id}-stalled"
            await send_msg(ws, p.Report(ins.round, ins.phase, 10, (ins.split, welcome.num_blocks), tid, {}))
            await send_msg(ws, p.TransferBegin(tid, "update", 256, p.sha256_hex(b"\0" * 256), 64, 0, {}))
        try:
            while True:
                await recv_msg(ws)
        except (ConnectionClosed, p.ProtocolError):
            return


def test_a_stalled_or_silent_device_costs_a_round_its_grace_not_its_deadline(tmp_path: Path) -> None:
    store_dir = tmp_path / "s"

    async def main():
        orch, server = await start_orchestrator(_config(store_dir, rounds=1, min_devices=4, straggler_grace_s=2.0,
                                                        transfer_stall_s=600, deadline_s=600), lambda k, d: None)
        url = f"ws://127.0.0.1:{orch.port}"
        devices = [_honest(url, orch, "h0"), _honest(url, orch, "h1"), _staller(url, orch, "silent", upload=False),
                   _staller(url, orch, "stuck", upload=True)]
        *_, history = await asyncio.gather(*devices, server)
        return history

    history = asyncio.run(main())
    (r1,) = history
    assert r1["closed_by"] == "grace" and r1["reported"] == 2 and r1["stragglers"] == ["silent", "stuck"]
    assert r1["round_wall_s"] < 120  # the deadline is 600 s and the stalled transfer's limit 600 s
    with Store(store_dir) as store:
        (journaled,) = store.rounds.all()
    assert journaled["metrics"]["closed_by"] == "grace"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_hello_flood_leaves_every_round_to_the_honest_fleet(tmp_path: Path) -> None:
    """Three enrolled device processes train digits_mlp while, through rounds 2-3, 100 connections
    keep saying hellos with forged proofs and made-up budgets: every round closes with all three
    (none cut by the straggler grace, none by a deadline) and each refusal is journaled. What the
    flood costs in wall time is measured by ``bench/hello_flood.py``, not held here: on a shared
    machine a wall-time bound measures the neighbours."""
    run = asyncio.run(flooded_fleet(tmp_path, rounds=4, flood_from=2, flood_to=3, connections=100))
    assert run.exit_codes == [0, 0, 0], run.errors
    assert [h["reported"] for h in run.history] == [3] * 4
    assert not any(h.get("stragglers") for h in run.history), run.history
    assert run.refused >= 100


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_server_memory_stays_flat_over_many_rounds(tmp_path: Path) -> None:
    """30 rounds of digits_mlp with three devices on different splits (scripted: they download what
    they are sent and answer with small random deltas, so every round is a new model version with
    new chunks to export, check and serve): the server's RSS at the end is within 10% of round 2's.
    With chunks of past versions kept in memory it went from 632 MiB at round 2 to 800 at round 30.
    bench/memory_flat.py runs 200 rounds of real device processes."""
    from edge_sdk.memory import rss_bytes
    from emulator.localfleet import role_budgets

    rss: dict[int, int] = {}
    budgets = role_budgets("digits_mlp")

    async def main():
        def on_event(kind: str, data: dict) -> None:
            if kind == "round_end":
                rss[data["round"]] = rss_bytes()

        config = _config(tmp_path / "s", model="digits_mlp", eval_data="digits", rounds=30, min_devices=3,
                         eval_every=10)
        orch, server = await start_orchestrator(config, on_event)
        url = f"ws://127.0.0.1:{orch.port}"
        devices = [_honest(url, orch, f"d-{role}", noise=i, budget=budgets[role])
                   for i, role in enumerate(("strong", "moderate", "weak"))]
        *_, history = await asyncio.gather(*devices, server)
        return history

    history = asyncio.run(main())
    assert all(h["reported"] == 3 for h in history)
    assert rss[30] <= 1.10 * rss[2], {r: round(v / 2**20) for r, v in rss.items() if r % 5 == 0 or r < 3}


def test_the_store_keeps_recent_proofs_and_a_bounded_journal_of_closures(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as store:
        store.closures.limit = 5
        store.proofs.record([("a", "n1", 100.0), ("a", "n2", 200.0)], forget_before=0.0)
        store.proofs.record([("b", "n3", 300.0), ("a", "n2", 200.0)], forget_before=150.0)  # n1 is too old now
        assert store.proofs.since(0.0) == [("a", "n2", 200.0), ("b", "n3", 300.0)]
        for i in range(3):
            store.closures.record([(float(i), f"d{i}-{j}", "unauthorized", None, "forged") for j in range(4)])
        assert [c["device_id"] for c in store.closures.all()] == ["d1-3", "d2-0", "d2-1", "d2-2", "d2-3"]
