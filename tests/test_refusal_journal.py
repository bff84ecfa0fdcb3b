"""Every kind of refused report is journaled: one device per kind answers its instruction with a
report the server must refuse (NaN/Inf, a broken checksum, garbage bytes, an update larger than
what it was sent, unknown names, wrong shapes, a range it was not asked to train, a zero sample
count), against a live server. Each connection is closed with an error frame; the round's journal
holds one refused row per device, with the refusal's kind and reason; the server finishes its round."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
from websockets.asyncio.client import connect

from edge_sdk import protocol as p
from edge_sdk.transport import recv_msg, send_msg, send_payload, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.store import Store
from tests.factories import server_config
from tests.scripted import scripted_device


def _deltas(orch, split: int, value: float = 0.01) -> dict[str, np.ndarray]:
    return {n: np.full(orch.global_state[n].shape, value, np.float32) for n in orch.model.state_names(split)}


def _payload(kind: str, orch, split: int) -> bytes:
    """The update bytes a hostile device of ``kind`` sends."""
    if kind == "non_finite":
        return p.encode_tensors(_deltas(orch, split, np.nan))
    if kind == "garbage":
        return os.urandom(200)
    if kind == "too_large":
        return os.urandom(len(p.encode_tensors(_deltas(orch, split))) + (64 << 10) + 1)
    if kind == "unknown_name":
        return p.encode_tensors({**_deltas(orch, split), "blocks.nope.weight": np.zeros(3, np.float32)})
    if kind == "wrong_shape":
        return p.encode_tensors({n: np.zeros((*v.shape, 2), np.float32) for n, v in _deltas(orch, split).items()})
    return p.encode_tensors(_deltas(orch, split))


async def _hostile(url: str, orch, device_id: str, kind: str) -> p.Message | None:
    """Say hello, wait for the instruction, answer it as ``kind``; return what the server answered."""
    async with connect(url, **ws_options()) as ws:
        await send_msg(ws, p.Hello(device_id=device_id, token="", budget_bytes=8 << 30, cores=1, runtimes=["torch"],
                                   num_samples=50))
        welcome = await recv_msg(ws)
        ins = await recv_msg(ws)
        assert isinstance(welcome, p.Welcome) and isinstance(ins, p.Instruction), ins
        trained = (ins.split + 1 if kind == "wrong_range" else ins.split, welcome.num_blocks)
        samples = 0 if kind == "zero_samples" else 50
        tid = f"{device_id}-update"
        await send_msg(ws, p.Report(ins.round, "train", samples, trained, tid, {}))
        payload = _payload(kind, orch, ins.split)
        checksum = "0" * 64 if kind == "checksum" else None
        try:
            await send_payload(ws, payload, transfer_id=tid, kind="update", meta={}, sha256=checksum)
            return await recv_msg(ws)
        except Exception as exc:  # the server closed the connection while we sent
            return p.Error("closed", repr(exc)[:200]) if not isinstance(exc, p.ProtocolError) else exc


KINDS = ("non_finite", "checksum", "garbage", "too_large", "unknown_name", "wrong_shape", "wrong_range",
         "zero_samples")


def test_every_refused_report_is_journaled_with_its_kind(tmp_path: Path) -> None:
    config = server_config(tmp_path / "s", min_devices=len(KINDS) + 1, deadline_s=30)

    async def main():
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        honest = scripted_device(url, orch, "honest", {}, lambda n, shape: np.full(shape, 0.01, np.float32))
        answers = await asyncio.gather(*(_hostile(url, orch, f"bad-{k}", k) for k in KINDS), honest, server)
        return answers

    answers = asyncio.run(main())
    history = answers[-1]
    assert history[0]["round"] == 1 and history[0]["rejected"] == len(KINDS)
    for kind, answer in zip(KINDS, answers):
        assert not isinstance(answer, p.Ack) or not answer.accepted, (kind, answer)
    with Store(tmp_path / "s") as store:
        rows = {u["device_id"]: u for u in store.reports.all(1)}
    assert rows["honest"]["accepted"]
    for kind in KINDS:
        row = rows.get(f"bad-{kind}")
        assert row is not None, f"{kind}: not journaled"
        assert row["accepted"] is False and row["refusal"] and row["reason"], (kind, row)
    assert rows["bad-non_finite"]["refusal"] == "non_finite"
    assert rows["bad-too_large"]["refusal"] == "too_large"
