"""A device's update cut by a dropped connection: the server keeps what it received and asks for the
rest (docs/protocol.md, "Resume"). A scripted device on a real orchestrator, so that every byte
and message is under the test's control."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from websockets.asyncio.client import connect

from edge_sdk import protocol as p
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from tests.factories import server_config

FRAME = 64  # many frames for the tiny model's update


def _config(tmp_path: Path) -> ServerConfig:
    return server_config(tmp_path / "store", deadline_s=60, upload_resume_s=30)


def _hello(resume_round: int = -1) -> p.Hello:
    return p.Hello(device_id="dev-1", token="", budget_bytes=512 << 20, cores=1, runtimes=["torch"], num_samples=100,
                   resume_round=resume_round)


async def _start_update(url: str, orch, events: list[tuple[str, dict]]) -> tuple[dict[str, np.ndarray], bytes, int]:
    """Connect, take the round's instruction, send the report and the first half of its update's
    frames, then lose the connection. Returns the deltas, their payload and the bytes sent."""
    async with connect(url, **ws_options()) as ws:
        await send_msg(ws, _hello())
        welcome = await recv_msg(ws)
        task = await recv_msg(ws)
        assert isinstance(welcome, p.Welcome) and welcome.split == 0 and isinstance(task, p.Instruction)
        assert task.phase == "train" and task.selection == "tail"
        rng = np.random.default_rng(7)
        deltas = {name: rng.standard_normal(orch.global_state[name].shape).astype(np.float32) / 10
                  for name in orch.model.state_names(welcome.split)}
        payload = p.encode_tensors(deltas)
        await send_msg(ws, p.Report(task.round, "train", 100, (welcome.split, welcome.num_blocks), "upd-1",
                                    {"loss_before": 1.0, "loss_after": 0.5}))
        messages = list(p.frames(payload, transfer_id="upd-1", kind="update", meta={}, frame_size=FRAME))
        half = messages[: len(messages) // 2]
        for msg in half:
            await send_msg(ws, msg)
        sent = half[-1].offset + len(half[-1].data)
        assert 0 < sent < len(payload)
    for _ in range(200):  # until the server has noticed the closed connection
        if any(kind == "upload_cut" for kind, _ in events):
            break
        await asyncio.sleep(0.05)
    return deltas, payload, sent


def test_the_server_resumes_an_update_from_the_bytes_it_holds(tmp_path: Path) -> None:
    events: list[tuple[str, dict]] = []

    async def main():
        orch, server = await start_orchestrator(_config(tmp_path), lambda kind, data: events.append((kind, data)))
        before = {k: v.copy() for k, v in orch.global_state.items()}
        url = f"ws://127.0.0.1:{orch.port}"
        deltas, payload, sent = await _start_update(url, orch, events)
        async with connect(url, **ws_options()) as ws:
            await send_msg(ws, _hello(resume_round=1))
            assert isinstance(await recv_msg(ws), p.Welcome)
            resume = await recv_msg(ws)
            assert resume == p.Resume("upd-1", sent)  # not the round's task: only the rest is wanted
            for msg in p.frames(payload, transfer_id="upd-1", kind="update", meta={}, frame_size=FRAME,
                                offset=resume.offset):
                await send_msg(ws, msg)
            ack = await recv_msg(ws)
            assert ack == p.Ack(1, True, "", "train")
            assert isinstance(await recv_msg(ws), p.Bye)  # one round: training is over
        await server
        return before, deltas, orch.global_state

    before, deltas, after = asyncio.run(main())
    # One device trained everything: the new model is the old one plus its whole, reassembled update.
    for name, delta in deltas.items():
        np.testing.assert_allclose(after[name], before[name] + delta, rtol=0, atol=1e-6, err_msg=name)
    kinds = [kind for kind, _ in events]
    assert kinds.index("upload_cut") < kinds.index("upload_resumed") < kinds.index("update")


def test_a_resume_answered_with_anything_else_is_refused(tmp_path: Path) -> None:
    events: list[tuple[str, dict]] = []

    async def main():
        orch, server = await start_orchestrator(_config(tmp_path), lambda kind, data: events.append((kind, data)))
        url = f"ws://127.0.0.1:{orch.port}"
        before = {k: v.copy() for k, v in orch.global_state.items()}
        _, _, sent = await _start_update(url, orch, events)
        async with connect(url, **ws_options()) as ws:
            await send_msg(ws, _hello(resume_round=1))
            await recv_msg(ws)
            assert await recv_msg(ws) == p.Resume("upd-1", sent)
            # Another transfer than the one the server holds part of.
            await send_msg(ws, p.TransferBegin("upd-2", "update", sent + 10, "", FRAME, sent, {}))
            error = await recv_msg(ws)
            assert isinstance(error, p.Error) and error.code == "unexpected" and "upd-1" in error.message
        history = await server  # the server goes on: the round closes without the device
        return before, orch.global_state, history

    before, after, history = asyncio.run(main())
    assert history[0]["reported"] == 0 and history[0]["stragglers"] == ["dev-1"]
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value)  # nothing of the half update reached the model
