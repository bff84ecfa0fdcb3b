"""A scripted device for tests: it speaks the wire protocol by hand, so every byte it sends is the
test's choice (honest or hostile deltas, any sample count)."""

from __future__ import annotations

from websockets.asyncio.client import connect

from edge_sdk import protocol as p
from edge_sdk.transport import recv_msg, send_msg, send_payload, ws_options


async def scripted_device(url: str, orch, device_id: str, labels: dict[str, str], delta_of, *,
                          num_samples: int = 50, report_samples: int | None = None, token: str = "",
                          instructions: list[p.Instruction] | None = None) -> list[p.Ack]:
    """Answer every instruction with deltas ``delta_of(n, shape)`` (n counts the instructions answered),
    claiming ``num_samples`` in the hello and ``report_samples`` (default the same) in every report.
    Returns the acks it received; the instructions go to ``instructions`` if given."""
    acks: list[p.Ack] = []
    async with connect(url, **ws_options()) as ws:
        await send_msg(ws, p.Hello(device_id=device_id, token=token, budget_bytes=8 << 30, cores=1, runtimes=["torch"],
                                   num_samples=num_samples, labels=labels))
        welcome = await recv_msg(ws)
        assert isinstance(welcome, p.Welcome)
        n = 0
        while True:
            msg = await recv_msg(ws)
            if isinstance(msg, p.Bye):
                return acks
            assert isinstance(msg, p.Instruction), msg
            if instructions is not None:
                instructions.append(msg)
            deltas = {name: delta_of(n, orch.global_state[name].shape) for name in orch.model.state_names(msg.split)}
            payload = p.encode_tensors(deltas)
            tid = f"{device_id}-{n}"
            claimed = num_samples if report_samples is None else report_samples
            await send_msg(ws, p.Report(msg.round, "train", claimed, (msg.split, welcome.num_blocks), tid,
                                        {"loss_before": 1.0, "loss_after": 0.9}))
            await send_payload(ws, payload, transfer_id=tid, kind="update", meta={})
            ack = await recv_msg(ws)
            assert isinstance(ack, p.Ack)
            acks.append(ack)
            n += 1
