"""Selection remembers: a device that was selected and missed its report is not selected again until
it shows it is alive, so a silent insider costs a run one round's straggler grace, not every round's;
repeated stalls lower a device's priority (:class:`orchestrator.rounds.Attendance`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from edge_sdk import protocol as p
from edge_sdk.cli import load_shard
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.rounds import Attendance
from tests.factories import server_config


def test_a_straggler_is_held_out_until_it_is_seen_alive() -> None:
    seen = Attendance()
    seen.round_closed(stragglers={"quiet"}, reported={"a", "b"})
    assert not seen.selectable("quiet") and seen.selectable("a") and seen.silent() == {"quiet"}
    seen.round_closed(stragglers=(), reported={"a"})  # rounds pass: still silent, nothing heard
    assert not seen.selectable("quiet")
    seen.alive("quiet")  # one stall: selectable at once
    assert seen.selectable("quiet") and seen.held_out() == 0


def test_a_straggler_that_reconnected_during_the_round_is_not_silent() -> None:
    """A device that drops mid-round and comes back before the round closes (a phone that lost its
    network for a moment) missed the report, but has shown it is alive: selectable next round."""
    seen = Attendance()
    seen.round_opened({"flaky", "a"})
    seen.alive("flaky")  # it reconnected while the round was still open
    seen.round_closed(stragglers={"flaky"}, reported={"a"})
    assert seen.selectable("flaky") and seen.silent() == set()
    seen.round_opened({"flaky", "a"})
    seen.round_closed(stragglers={"flaky"}, reported={"a"})  # this time it stayed away
    assert not seen.selectable("flaky")


def test_a_task_cut_by_the_servers_restart_is_no_miss() -> None:
    """Resumed at round 5: a device back saying it was working in round 5 (for the process before
    the restart) and then missing round 5's report is not held out; one that missed round 5 of this
    process, or a later round, is; and a device asked by this process that drops and returns keeps
    its miss (it is not silent, as before)."""
    seen = Attendance(first_round=5)
    seen.returned("cut", 5)  # connected before round 5 opened, its round-5 task cut by the restart
    seen.returned("fresh", -1)
    seen.round_opened({"cut", "fresh", "a"}, 5)
    seen.round_closed(stragglers={"cut", "fresh"}, reported={"a"})
    assert seen.selectable("cut") and not seen.selectable("fresh") and seen.silent() == {"fresh"}
    seen.round_opened({"cut", "a"}, 6)
    seen.returned("cut", 6)  # it dropped out of round 6 of this process and came back: its own miss
    seen.round_closed(stragglers={"cut"}, reported={"a"})
    seen.round_opened({"a"}, 7)
    seen.round_closed(stragglers=(), reported={"a"})
    seen.returned("late", 6)  # back from round 6, which this process closed: no excuse
    seen.round_opened({"late", "a"}, 8)
    seen.round_closed(stragglers={"late"}, reported={"a"})
    assert not seen.selectable("late")


def test_repeated_stalls_lower_a_devices_priority() -> None:
    seen = Attendance()
    rests = []
    for _ in range(4):
        seen.round_closed(stragglers={"flaky"}, reported=())
        seen.alive("flaky")
        rest = 0
        while not seen.selectable("flaky"):
            seen.round_closed(stragglers=(), reported=())
            rest += 1
        rests.append(rest)
    assert rests == [0, 1, 3, 7]  # 2**(stalls-1) - 1 rounds sat out after each return
    for _ in range(4):  # accepted reports pay the stalls off
        seen.round_closed(stragglers=(), reported={"flaky"})
    seen.round_closed(stragglers={"flaky"}, reported=())
    seen.alive("flaky")
    assert seen.selectable("flaky")


def test_resting_devices_are_chosen_when_no_other_is_free() -> None:
    """A rest is a lower priority, counted down by rounds: when every free device rests (each stalled
    twice in a row: a secure round that closed at its deadline on all of them, twice), they are chosen,
    or no round would open to count their rests down; silent ones never are."""
    seen = Attendance()
    for _ in range(2):
        seen.round_opened({"a", "b", "quiet"})
        seen.alive("a"), seen.alive("b")  # they answered during the round (a secure stage), then it closed
        seen.round_closed(stragglers={"a", "b", "quiet"}, reported=())
    assert not seen.selectable("a") and not seen.selectable("b") and seen.silent() == {"quiet"}
    assert seen.choose(["a", "b", "quiet"]) == ["a", "b"]
    seen.alive("c")
    assert seen.choose(["a", "b", "c", "quiet"]) == ["c"]  # one free device not resting: the rest stand


async def _silent(url: str, device_id: str) -> list[p.Message]:
    """Says hello and takes its instructions, never reporting, until the server ends the connection."""
    got: list[p.Message] = []
    async with connect(url, **ws_options()) as ws:
        await send_msg(ws, p.Hello(device_id=device_id, token="", budget_bytes=2 << 30, cores=1, runtimes=["torch"],
                                   num_samples=10))
        try:
            while True:
                got.append(await recv_msg(ws))
        except (ConnectionClosed, p.ProtocolError):
            return got


def test_a_silent_selected_device_costs_one_grace_and_is_selected_again_once_it_reconnects(tmp_path: Path) -> None:
    selected: dict[int, int] = {}

    async def main():
        back: list[asyncio.Task] = []
        url = ""

        def on_event(kind: str, data: dict) -> None:
            if kind == "round_start":
                selected[data["round"]] = data["selected"]
                if data["round"] == 2:  # the silent device comes back: a new connection, the same id
                    back.append(asyncio.ensure_future(device("quiet", 2).run()))

        def device(device_id: str, shard: int) -> DeviceClient:
            x, y = load_shard("synthetic", client=shard, num_clients=3)
            return DeviceClient(DeviceSettings(url, device_id, 2 << 30, reconnect=False), x, y)

        config = server_config(tmp_path / "s", rounds=5, min_devices=3, local_steps=2, deadline_s=300,
                               wait_devices_s=60, straggler_policy="grace", straggler_grace_s=1.5)
        orch, server = await start_orchestrator(config, on_event)
        url = f"ws://127.0.0.1:{orch.port}"
        silent = asyncio.ensure_future(_silent(url, "quiet"))
        await asyncio.sleep(0.2)  # the silent device is in before round 1 opens with three
        results = await asyncio.gather(device("h0", 0).run(), device("h1", 1).run(), server, silent)
        await asyncio.gather(*back)
        return results[2], results[3]

    history, silent_got = asyncio.run(main())
    assert history[0]["closed_by"] == "grace" and history[0]["stragglers"] == ["quiet"]
    assert sum(h["closed_by"] == "grace" for h in history) == 1, [h["closed_by"] for h in history]
    assert selected[2] == 2  # known to be silent: not selected
    assert any(h["selected"] == 3 and h["reported"] == 3 for h in history[2:]), history  # back, and selected
    assert any(isinstance(m, p.Instruction) for m in silent_got)  # it was selected in round 1
