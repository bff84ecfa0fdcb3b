"""Nothing sent twice: a device keeps the payloads it downloads by sha256 (edge_sdk.payload_store),
and a device that reconnects or comes to its next round fetches the ones it holds with
``Fetch.held``: the server sends none of their bytes, and its journal says which payloads came
from the device's own store."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from websockets.asyncio.client import connect as ws_connect

from edge_sdk import protocol as p
from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.data import load_dataset
from edge_sdk.payload_store import PayloadStore
from emulator.localfleet import role_budgets, start_orchestrator
from orchestrator.config import ServerConfig
from orchestrator.server.wirebytes import round_bytes, run_bytes
from orchestrator.store import Store
from orchestrator.views.report import write_metrics


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_store_keeps_payloads_by_content_within_its_budget_and_across_processes(tmp_path: Path) -> None:
    a, b, c = b"a" * 400, b"b" * 400, b"c" * 400
    store = PayloadStore(tmp_path / "held", 1000)
    assert store.put(_sha(a), a) and store.put(_sha(b), b)
    assert store.get(_sha(a)) == a  # a is now the most recently used
    assert store.put(_sha(c), c)  # over 1000 bytes: b, the least recently used, goes
    assert _sha(b) not in store and store.get(_sha(a)) == a and store.get(_sha(c)) == c
    assert not store.put(_sha(b"x" * 1001), b"x" * 1001)  # larger than the whole budget: not kept
    again = PayloadStore(tmp_path / "held", 1000)  # a new process finds what the last one kept
    assert again.get(_sha(a)) == a and again.get(_sha(c)) == c and len(again) == 2
    (tmp_path / "held" / _sha(a)).write_bytes(b"damaged")
    assert again.get(_sha(a)) is None and _sha(a) not in again  # checked when read: dropped, downloaded again
    memory = PayloadStore(None, 1000)
    assert memory.put(_sha(a), memoryview(a)) and memory.get(_sha(a)) == a


def test_stores_of_one_process_write_a_payload_once_and_each_keeps_and_evicts_its_own(tmp_path: Path) -> None:
    # A lightweight worker runs many devices, each with its own store: the second store that keeps
    # the same payload links the first one's file (one inode) instead of writing the bytes again.
    a, b = b"a" * 400, b"b" * 400
    one, two = PayloadStore(tmp_path / "one", 1000), PayloadStore(tmp_path / "two", 500)
    assert one.put(_sha(a), a) and two.put(_sha(a), memoryview(a))
    first, second = (tmp_path / "one" / _sha(a)).stat(), (tmp_path / "two" / _sha(a)).stat()
    assert second.st_ino == first.st_ino and first.st_nlink == 2
    assert two.get(_sha(a)) == a and one.get(_sha(a)) == a
    assert not list((tmp_path / "two").glob(".*.tmp"))  # no temporary link left behind
    assert two.put(_sha(b), b)  # over two's 500 bytes: a leaves two, and stays in one
    assert _sha(a) not in two and not (tmp_path / "two" / _sha(a)).exists() and one.get(_sha(a)) == a
    one.drop(_sha(a))  # the file it wrote is gone: the next store that keeps a writes the bytes
    three = PayloadStore(tmp_path / "three", 1000)
    assert three.put(_sha(a), a) and three.get(_sha(a)) == a
    assert (tmp_path / "three" / _sha(a)).stat().st_nlink == 1
    (tmp_path / "three" / _sha(a)).write_bytes(b"damaged")  # a damaged shared file is caught where it is read
    four = PayloadStore(tmp_path / "four", 1000)
    assert four.put(_sha(a), a) and four.get(_sha(a)) is None and _sha(a) not in four
    five = PayloadStore(tmp_path / "five", 1000)  # the damaged file is linked no more
    assert five.put(_sha(a), a) and five.get(_sha(a)) == a


def test_which_payload_each_slot_holds_outlives_the_process_and_never_names_one_gone(tmp_path: Path) -> None:
    """Delta downloads name the version a device holds for a slot: a restarted device (a new store on
    the same folder) still names it; a slot whose payload was evicted, a damaged map, or a payload the
    store does not keep names nothing (a slot is a guess: the server sends the whole payload)."""
    chunk, tail = b"c" * 300, b"t" * 300
    store = PayloadStore(tmp_path, max_bytes=700)
    store.put(_sha(chunk), chunk)
    store.put(_sha(tail), tail)
    store.set_slot("chunk:0-2", _sha(chunk))
    store.set_slot("tail:2", _sha(tail))
    store.set_slot("tail:3", _sha(b"never kept"))
    again = PayloadStore(tmp_path, max_bytes=700)
    assert (again.slot("chunk:0-2"), again.slot("tail:2"), again.slot("tail:3")) == (_sha(chunk), _sha(tail), "")
    other = b"o" * 300
    assert again.get(_sha(tail)) == tail  # the tail is the most recently used
    again.put(_sha(other), other)  # over the budget: the least recently used (the chunk) goes
    assert again.slot("chunk:0-2") == "" and again.slot("tail:2") == _sha(tail)
    (tmp_path / "slots.json").write_text("{not json")
    assert PayloadStore(tmp_path, max_bytes=700).slot("tail:2") == ""
    memory = PayloadStore(None, max_bytes=700)
    memory.put(_sha(tail), tail)
    memory.set_slot("tail:2", _sha(tail))
    assert memory.slot("tail:2") == _sha(tail) and not list(tmp_path.glob("*.tmp*"))


def test_held_and_digests_are_optional_fields_that_round_trip() -> None:
    digest = _sha(b"chunk")
    fetch = p.Fetch(3, "chunk-x", 0, held=digest)
    assert p.decode(p.encode(fetch)) == fetch
    assert b"held" not in p.encode(p.Fetch(3, "chunk-x"))  # left out at its default: old peers read it
    with pytest.raises(p.ProtocolError):
        p.Fetch(3, "chunk-x", held="not-a-digest").check()


def test_bytes_per_device_round_reach_the_run_summary(tmp_path: Path) -> None:
    rounds = [{"round": 1, "bytes": {"a": {"down": {"chunk": 100, "model": 10}, "up": {"update": 10}, "held": {}},
                                     "b": {"down": {"model": 10}, "up": {"update": 10}, "held": {"chunk": 100}}}},
              {"round": 2, "bytes": {"a": {"down": {"chunk": 0, "model": 10}, "up": {"update": 10},
                                           "held": {"chunk": 100}}}}]
    assert round_bytes(rounds[0]) == {"down": 120, "up": 20, "held": 100, "devices": 2, "per_device": 70.0}
    assert run_bytes(rounds) == {"down": 130, "up": 30, "held": 200, "device_rounds": 3, "per_device_round": 160 / 3}
    write_metrics(tmp_path, {"rounds": rounds})
    summary = (tmp_path / "metrics.json").read_text()
    assert '"per_device_round"' in summary
    lines = (tmp_path / "rounds.csv").read_text().splitlines()
    assert lines[0] == "round,bytes_down,bytes_up,bytes_held,bytes_per_device" and lines[2] == "2,10,10,100,20.0"


class _Connections:
    """The device's websocket connections, so that a test can close one as a dropped link would."""

    def __init__(self) -> None:
        self.open: list = []

    def __call__(self, url: str, **kwargs):
        cm = ws_connect(url, **kwargs)
        conns = self.open

        class _Kept:
            async def __aenter__(self):
                ws = await cm.__aenter__()
                conns.append(ws)
                return ws

            async def __aexit__(self, *exc):
                return await cm.__aexit__(*exc)

        return _Kept()


@pytest.mark.slow
def test_a_reconnected_device_and_one_in_its_second_round_download_no_byte_they_hold(tmp_path: Path) -> None:
    """Two weak digits_mlp devices (split 2: nobody trains the frozen blocks, so the chunk's bytes
    stay the same while its id follows the model version). Round 1: both download chunk and tail.
    Device "back" loses its connection right after round 1 and reconnects; device "stays" keeps
    its own. Round 2: both fetch the chunk with Fetch.held and are sent 0 bytes of it; the tail
    changed, so it is downloaded. The round's metrics and the journal say so."""
    budget = role_budgets("digits_mlp")["weak"]
    config = ServerConfig(model="digits_mlp", rounds=2, min_devices=2, local_steps=2, lr=0.1,
                          store_dir=tmp_path / "store", deadline_s=120)
    digits = load_dataset("digits")
    server_events: list[tuple[str, dict]] = []
    device_events: list[tuple[str, dict]] = []
    conns = _Connections()

    def on_device(kind: str, data: dict) -> None:
        device_events.append((kind, data))
        if kind == "round_done" and data["device"] == "back" and data["round"] == 1:
            asyncio.ensure_future(conns.open[-1].close())  # the link drops: the device reconnects

    async def run() -> list[dict]:
        orch, server = await start_orchestrator(config, lambda kind, data: server_events.append((kind, data)))
        url = f"ws://127.0.0.1:{orch.port}"
        devices = [DeviceClient(DeviceSettings(url, name, budget, backend="torch", payload_cache=tmp_path / name,
                                             reconnect_max_delay=0.5),
                                digits.x[i::2], digits.y[i::2], on_event=on_device,
                                connect=conns if name == "back" else None)
                   for i, name in enumerate(("back", "stays"))]
        await asyncio.gather(*(d.run() for d in devices))
        return await asyncio.wait_for(server, timeout=300)

    history = asyncio.run(run())
    assert [h["round"] for h in history] == [1, 2]
    assert any(k == "reconnect" and d["device"] == "back" for k, d in device_events)
    sent = {(d["device"], d["round"], d["kind"]): d["bytes"] for k, d in server_events if k == "sent"}
    for device in ("back", "stays"):
        assert sent[(device, 1, "chunk")] > 0 and sent[(device, 2, "chunk")] == 0, sent
        assert sent[(device, 2, "model")] > 0  # the tail's new weights: not held
        used = {(d["round"], d["kind"]) for k, d in device_events if k == "from_store" and d["device"] == device}
        assert used == {(2, "chunk")}, used
        r2 = history[1]["bytes"][device]
        assert r2["down"]["chunk"] == 0 and r2["held"]["chunk"] == history[0]["bytes"][device]["down"]["chunk"]
        assert r2["down"]["model"] > 0 and r2["up"]["update"] > 0
    assert round_bytes(history[1])["held"] == round_bytes(history[0])["down"] - sum(
        history[0]["bytes"][d]["down"]["model"] for d in ("back", "stays"))  # every chunk byte of round 1, held
    with Store(tmp_path / "store") as store:
        rows = store.transfers.all(2)
    from_store = {(r["device_id"], r["kind"]) for r in rows if r["from_device_store"]}
    assert from_store == {("back", "chunk"), ("stays", "chunk")}, rows
    assert all(r["bytes"] > 0 for r in rows if not r["from_device_store"])
