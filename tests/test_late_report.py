"""An update that lands while its round aggregates: late, acknowledged as such, never folded.

The round stops waiting for its straggler (grace policy), then aggregates and checks the new state
over several awaits; the straggler's upload completes in between. Two scripted devices on a real
orchestrator; the state check is held until the late update has been answered, so the update
lands inside that window on every run.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
from websockets.asyncio.client import connect

from edge_sdk import protocol as p
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from tests.factories import server_config


def _config(tmp_path: Path) -> ServerConfig:
    return server_config(tmp_path / "store", min_devices=2, deadline_s=60, straggler_policy="grace",
                         straggler_grace_s=0.0)


async def _device(url: str, orch, device_id: str, ready: asyncio.Event, seed: int) -> list[p.Message]:
    """Say hello, take the round's task, wait for ``ready``, send a report and its whole update;
    return every message the server sends from then on."""
    async with connect(url, **ws_options()) as ws:
        await send_msg(ws, p.Hello(device_id=device_id, token="", budget_bytes=512 << 20, cores=1, runtimes=["torch"],
                                   num_samples=100))
        welcome, task = await recv_msg(ws), await recv_msg(ws)
        assert isinstance(welcome, p.Welcome) and isinstance(task, p.Instruction) and task.phase == "train"
        rng = np.random.default_rng(seed)
        payload = p.encode_tensors({name: rng.standard_normal(orch.global_state[name].shape).astype(np.float32) / 10
                                    for name in orch.model.state_names(welcome.split)})
        await ready.wait()
        await send_msg(ws, p.Report(task.round, "train", 100, (welcome.split, welcome.num_blocks), f"upd-{device_id}",
                                    {"loss_before": 1.0, "loss_after": 0.5}))
        for msg in p.frames(payload, transfer_id=f"upd-{device_id}", kind="update", meta={}, frame_size=4096):
            await send_msg(ws, msg)
        answers = []
        while not answers or not isinstance(answers[-1], (p.Bye, p.Error)):
            answers.append(await recv_msg(ws))
        return answers


def test_an_update_landing_while_the_round_aggregates_is_late(tmp_path: Path) -> None:
    events: list[tuple[str, dict]] = []

    async def main():
        orch, server = await start_orchestrator(_config(tmp_path), lambda kind, data: events.append((kind, data)))
        loop = asyncio.get_running_loop()
        closing, release = asyncio.Event(), threading.Event()
        check_state = orch.loop.checks.check_state

        def held(state):  # runs in a worker thread once the round has stopped waiting and aggregated
            loop.call_soon_threadsafe(closing.set)
            release.wait(30)
            return check_state(state)

        orch.loop.checks.check_state = held
        url = f"ws://127.0.0.1:{orch.port}"
        now = asyncio.Event()
        now.set()
        prompt = asyncio.create_task(_device(url, orch, "prompt", now, 1))
        slow = asyncio.create_task(_device(url, orch, "slow", closing, 2))
        # The slow device's update is answered while the round is held in its state check.
        while not any(kind == "late" for kind, _ in events) and not slow.done():
            await asyncio.sleep(0.05)
        release.set()
        answers = {"prompt": await prompt, "slow": await slow}
        return answers, await server

    answers, history = asyncio.run(main())
    assert answers["prompt"] == [p.Ack(1, True, "", "train"), p.Bye(answers["prompt"][-1].reason)]
    assert [type(m) for m in answers["slow"]] == [p.Ack, p.Bye], answers["slow"]  # not an internal error
    assert answers["slow"][0] == p.Ack(1, False, "late: the round is closed", "train")
    assert history[0]["reported"] == 1 and history[0]["stragglers"] == ["slow"]
    assert ("late", {"device": "slow", "round": 1, "phase": "train"}) in events
