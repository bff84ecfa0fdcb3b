"""A hostile authenticated client against a live server: random and mutated message sequences.

Each case opens a connection, says a valid hello (it holds the token), then sends a random sequence
of messages (any protocol message with random fields, raw bytes, mutated encodings). Whatever it
sends, the server must answer with at most an error frame and a close, keep serving, and keep its
model: after the fuzzing, two honest devices train and the model equals, bit for bit, a run of the
same devices without the attacker.

``make test`` runs a few thousand cases; a longer run: ``EDGETRAIN_FUZZ_CASES=50000 .venv/bin/python -m
pytest -q tests/test_hostile_fuzz.py``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as sync_connect

from edge_sdk import protocol as p
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from test_protocol_messages import any_message
from tests.factories import server_config
from tests.scripted import scripted_device

CASES = int(os.environ.get("EDGETRAIN_FUZZ_CASES", "2000"))
TOKEN = "lab-token"


def _hello(device_id: str) -> p.Hello:
    return p.Hello(device_id=device_id, token=TOKEN, budget_bytes=2 << 30, cores=1, runtimes=["torch"],
                   num_samples=50)


@st.composite
def wire_messages(draw) -> bytes:
    kind = draw(st.sampled_from(["message", "message", "bytes", "mutated"]))
    if kind == "bytes":
        return draw(st.binary(min_size=0, max_size=300))
    encoded = p.encode(draw(any_message))
    if kind == "message":
        return encoded
    data = bytearray(encoded)
    for _ in range(draw(st.integers(1, 4))):
        if data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))])


class _Server:
    """An orchestrator in a background thread's event loop (the fuzzer's client is synchronous)."""

    def __init__(self, config: ServerConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.orch, self.task = asyncio.run_coroutine_threadsafe(
            start_orchestrator(config, lambda kind, data: None), self.loop).result(60)

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)


def _honest_run(tmp_path: Path, server: _Server | None):
    """Two honest scripted devices train two rounds; returns the final model."""
    config = server_config(tmp_path / "s", rounds=2, min_devices=2, token=TOKEN, deadline_s=60)
    server = server or _Server(config)
    orch = server.orch
    url = f"ws://127.0.0.1:{orch.port}"

    async def devices():
        await asyncio.gather(*(scripted_device(url, orch, f"honest-{i}", {}, lambda n, shape, v=v: np.full(shape, v,
                                                                                                    np.float32),
                                               token=TOKEN)
                               for i, v in enumerate((0.01, -0.03))))
        return await server.task

    history = server.run(devices())
    return history, {k: v.copy() for k, v in orch.global_state.items()}


@pytest.mark.slow
def test_a_hostile_client_never_breaks_the_server(tmp_path: Path) -> None:
    config = server_config(tmp_path / "fuzzed" / "s", rounds=2, min_devices=2, token=TOKEN, deadline_s=60,
                           wait_devices_s=3600)
    server = _Server(config)
    url = f"ws://127.0.0.1:{server.orch.port}"
    closed_by_server = [0]

    @settings(max_examples=CASES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(wire_messages(), min_size=1, max_size=6), st.booleans())
    def attack(messages: list[bytes], say_hello: bool) -> None:
        with sync_connect(url, compression=None, max_size=p.DEFAULT_LIMITS.max_message_bytes, close_timeout=0.01) as ws:
            try:
                if say_hello:
                    ws.send(p.encode(_hello("attacker")))
                    assert isinstance(p.decode(ws.recv(timeout=10)), p.Welcome)
                for data in messages:
                    ws.send(data)
                reply = ws.recv(timeout=0.02)
                assert isinstance(p.decode(reply), (p.Error, p.Welcome))
            except (ConnectionClosed, TimeoutError):
                closed_by_server[0] += 1
        assert not server.task.done(), "the server stopped"

    attack()
    assert not server.task.done()
    fuzzed_history, fuzzed_model = _honest_run(tmp_path / "fuzzed", server)
    clean_history, clean_model = _honest_run(tmp_path / "clean", None)
    assert [h["reported"] for h in fuzzed_history] == [2, 2]
    for name, value in clean_model.items():
        assert fuzzed_model[name].tobytes() == value.tobytes(), name
