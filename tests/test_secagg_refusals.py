"""Hostile devices in a secure round against a real server: scripted devices speak the wire protocol
by hand (each byte the test's choice) next to honest ones. A replayed key advertisement, shares
naming a device that is not a neighbour, an oversized share and an unmasking answer for a peer the
device was not given each end that device's connection with an error frame, each journaled with
its reason (the oversized share, refused by the codec before any stage sees it, too); the round completes for the honest devices, the server stays up.
With two honest devices, three of the six gone leave fewer than t = 3 shares of a survivor's seed:
no block is revealed, the model keeps its value, and the round's metrics say why; with five honest
devices (t = 5 of the key cohort's 8) every block is revealed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
from websockets.asyncio.client import connect

from edge_sdk import protocol as p
from edge_sdk.backends import backend_class
from edge_sdk.cli import load_shard
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.credentials import make_proof
from edge_sdk.secagg import SEALED_BYTES, SHARE_BYTES
from edge_sdk.secagg.exchange import start
from edge_sdk.secagg.layout import block_vectors
from edge_sdk.transport import recv_msg, send_msg, send_payload, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.store import Store
from tests.factories import server_config

HOSTILE = {"c": "stranger_reveal", "d": "replay", "e": "stranger_share", "f": "oversized"}


async def _secure_device(url: str, orch, device_id: str, secret: str, hostile: str | None, seen: dict) -> list:
    """One device's round, honest unless ``hostile`` says where it cheats; returns what it received."""
    got: list[p.Message] = []
    auth = {"Authorization": f"Edgetrain {device_id} {make_proof(device_id, secret, purpose='upgrade')}"}
    async with connect(url, additional_headers=auth, **ws_options()) as ws:
        await send_msg(ws, p.Hello(device_id=device_id, token=make_proof(device_id, secret), budget_bytes=2 << 30,
                                   cores=1, runtimes=["torch"], num_samples=10))
        welcome = await recv_msg(ws)
        ins = await recv_msg(ws)
        assert isinstance(ins, p.Instruction) and ins.config.get(p.SECAGG_KEY), ins
        if hostile == "silent":  # trains forever: never advertises
            while not isinstance(msg := await recv_msg(ws), p.Bye):
                got.append(msg)
            return got
        rnd = start(device_id, secret, ins, welcome.num_blocks, 3)
        keys = rnd.advertise()
        seen[device_id] = keys
        if hostile == "replay":  # a's advertisement, under its own name
            while "a" not in seen:
                await asyncio.sleep(0.05)
            keys = seen["a"]
        await send_msg(ws, p.SecAggKeys(ins.round, *keys))
        got.append(msg := await recv_msg(ws))
        if not isinstance(msg, p.SecAggPeers):
            return got
        sealed = rnd.share(msg)
        if hostile == "stranger_share":
            sealed["zed"] = bytes(SEALED_BYTES)
        if hostile == "oversized":  # past the message checks: raw msgpack with a 95-byte share
            raw = {"v": p.PROTOCOL_VERSION, "t": "secagg_shares", "round": ins.round,
                   "sealed": {v: s + b"\0" for v, s in sealed.items()}}
            await ws.send(msgpack.packb(raw))
        else:
            await send_msg(ws, p.SecAggShares(ins.round, sealed))
        got.append(msg := await recv_msg(ws))
        if not isinstance(msg, p.SecAggInbox):
            return got
        rnd.receive(msg.sealed)
        state = {n: np.full(orch.global_state[n].shape, 0.01, np.float32) for n in orch.model.state_names(ins.split)}
        words = rnd.mask(block_vectors(state, orch.model.block_names, ins.split), 10)
        upload = p.encode_tensors({f"secagg.{b}": w.view("<i4") for b, w in enumerate(words, start=ins.split)})
        await send_msg(ws, p.Report(ins.round, "train", 10, (ins.split, welcome.num_blocks), f"{device_id}-u", {}))
        await send_payload(ws, upload, transfer_id=f"{device_id}-u", kind="update", meta={})
        got.append(await recv_msg(ws))  # the ack
        got.append(msg := await recv_msg(ws))
        if isinstance(msg, p.SecAggUnmask):  # ConsistencyCheck: sign the survivor set, then see the signatures
            await send_msg(ws, p.SecAggReveal(ins.round, {}, {}, rnd.consent(msg.survivor_set)))
            got.append(msg := await recv_msg(ws))
        if isinstance(msg, p.SecAggUnmask):
            seeds, shares = rnd.reveal(msg.survivors, msg.dropped, msg.blocks, msg.survivor_set, msg.signatures)
            if hostile == "stranger_reveal":
                seeds["zed"] = bytes(SHARE_BYTES)
            await send_msg(ws, p.SecAggReveal(ins.round, seeds, shares))
            got.append(await recv_msg(ws))  # bye, or the error frame
        return got


@pytest.mark.parametrize("honest", [("a", "b"), ("a", "b", "g", "h", "i")])
def test_hostile_devices_are_refused_and_the_secure_round_completes(tmp_path: Path, honest: tuple[str, ...]) -> None:
    DEVICES = {**dict.fromkeys(honest), **HOSTILE}
    store_dir = tmp_path / "s"
    with Store(store_dir) as store:
        secrets = {d: store.credentials.enroll(d) for d in DEVICES}
    config = server_config(store_dir, min_devices=len(DEVICES), require_credentials=True, secure_aggregation=True,
                           secure_stage_s=3.0, deadline_s=120, local_steps=1)

    async def main():
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url, seen, before = f"ws://127.0.0.1:{orch.port}", {}, {k: v.copy() for k, v in orch.global_state.items()}
        got = await asyncio.gather(*(_secure_device(url, orch, d, secrets[d], h, seen) for d, h in DEVICES.items()))
        history = await asyncio.wait_for(server, 120)
        moved = not all(np.array_equal(before[k], v) for k, v in orch.global_state.items())
        assert moved == (len(honest) == 5)  # nothing revealed, nothing moved
        return dict(zip(DEVICES, got)), history

    got, history = asyncio.run(main())
    errors = {d: msgs[-1] for d, msgs in got.items() if isinstance(msgs[-1], p.Error)}
    assert set(errors) == {"c", "d", "e", "f"}, got
    assert "not signed by its identity key" in errors["d"].message
    assert "other than its neighbours" in errors["e"].message
    assert errors["f"].code in ("malformed", "too_large")
    assert "not given" in errors["c"].message
    for d in honest:
        assert isinstance(got[d][-1], p.Bye), got[d]
    secure = history[0]["secure"]
    n = len(honest)
    assert (secure["cohort"], secure["shared"], secure["masked"]) == (n + 3, n + 1, n + 1), secure
    for block in secure["blocks"].values():
        assert block["revealed"] == (n == 5) and (n == 5 or "3 needed" in block["reason"]), block
    with Store(store_dir) as store:
        refused = {u["device_id"]: u["reason"] for u in store.reports.all(1) if not u.get("accepted")}
    assert {"c", "d", "e", "f"} <= set(refused) and all("secure round" in refused[d] for d in "cdef"), refused
    assert "a frame refused" in refused["f"], refused  # the oversized share, refused by the codec


def test_a_round_that_closes_before_its_keys_are_in_releases_the_devices_waiting(tmp_path: Path) -> None:
    """One device never advertises; the round's deadline closes it in the key stage: the devices
    waiting for their peers get a negative ack (their instruction ends), nothing is revealed."""
    store_dir = tmp_path / "s"
    devices = {"a": None, "b": None, "z": "silent"}
    with Store(store_dir) as store:
        secrets = {d: store.credentials.enroll(d) for d in devices}
    config = server_config(store_dir, min_devices=3, require_credentials=True, secure_aggregation=True,
                           secure_stage_s=60.0, deadline_s=4, local_steps=1)

    async def main():
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        got = await asyncio.gather(*(_secure_device(url, orch, d, secrets[d], h, {}) for d, h in devices.items()))
        return dict(zip(devices, got)), await asyncio.wait_for(server, 120)

    got, history = asyncio.run(main())
    for d in ("a", "b"):
        ack = got[d][-1]
        assert isinstance(ack, p.Ack) and not ack.accepted and "closed in its keys stage" in ack.reason, got[d]
    assert history[0]["closed_by"] == "deadline" and history[0]["secure"]["masked"] == 0


def _slow_once(base: type, seconds: float) -> type:
    """``base``, whose first training sleeps ``seconds`` first (a device slower than the round's deadline once)."""

    class SlowOnce(base):  # type: ignore[valid-type, misc]
        slept = False

        def train(self, tail, y, config):  # type: ignore[no-untyped-def]
            if not SlowOnce.slept:
                SlowOnce.slept = True
                time.sleep(seconds)
            return super().train(tail, y, config)

    return SlowOnce


def test_devices_a_deadline_caught_in_a_secure_stage_are_selected_again(tmp_path: Path) -> None:
    """One device trains past round 1's deadline, so the round closes in its key stage: no device
    reported, the devices waiting for their peers are released with the reason journaled, and the slow
    one's late keys are turned away. Each of them answered the secure round (keys, or keys late): none
    is silent, so round 2 selects them and completes (before, every one of them was held out as silent
    and the run waited for a selectable device for ever)."""
    store_dir, names = tmp_path / "s", ("a", "b", "c", "slow")
    with Store(store_dir) as store:
        secrets = {d: store.credentials.enroll(d) for d in names}
    config = server_config(store_dir, rounds=2, min_devices=4, require_credentials=True, secure_aggregation=True,
                           secure_stage_s=60.0, deadline_s=6, wait_devices_s=20, local_steps=1,
                           straggler_policy="deadline")

    async def main():
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        clients = []
        for i, d in enumerate(names):
            x, y = load_shard("synthetic", client=i, num_clients=len(names))
            backend = _slow_once(backend_class("auto"), 8.0) if d == "slow" else "auto"
            clients.append(DeviceClient(DeviceSettings(url, d, 2 << 30, reconnect=False, secret=secrets[d],
                                                       backend=backend), x, y))
        runs = await asyncio.wait_for(asyncio.gather(*(c.run() for c in clients), server, return_exceptions=True), 90)
        return runs[-1], runs[:-1]

    history, runs = asyncio.run(main())
    assert not isinstance(history, BaseException), history  # before: "only 0 of 1 devices were ready in time"
    assert not any(isinstance(r, BaseException) for r in runs[:3]), runs  # the slow one may be mid-round at the end
    assert [h["round"] for h in history] == [1, 2]
    assert history[0]["closed_by"] == "deadline" and history[0]["secure"]["masked"] == 0, history[0]
    assert history[1]["secure"]["masked"] >= 3 and history[1]["selected"] >= 3, history[1]
    with Store(store_dir) as store:
        released = {u["device_id"]: u["reason"] for u in store.reports.all(1) if not u.get("accepted")}
    waiting = set(released) - {"slow"}
    assert len(waiting) >= 1 and all("closed in its keys stage" in released[d] for d in waiting), released
