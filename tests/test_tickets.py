"""A browser page's ticket (:mod:`orchestrator.server.tickets`, docs/security.md "Tickets"): issued by
``/ticket.json`` only to a request that proves itself (a credential proof made for ``ticket`` of the same
device, or the token), good for one upgrade of that device within seconds, and on that upgrade exempt
from the pending-hello caps as the ``Authorization`` header is."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from edge_sdk import protocol as p
from edge_sdk.credentials import make_proof
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.server.tickets import TicketError, Tickets
from orchestrator.store import Store
from tests.factories import server_config
from tests.test_web import _get, _sdk


def test_a_ticket_is_bound_to_its_device_good_once_and_only_for_its_lifetime() -> None:
    tickets = Tickets(lifetime_s=30.0, max_tickets=2)
    first, second = tickets.issue("dev-0", now=0.0), tickets.issue("dev-1", now=1.0)
    assert first != second and len(first) >= 20
    with pytest.raises(TicketError, match="2 tickets are outstanding"):
        tickets.issue("dev-2", now=2.0)
    assert tickets.redeem(first, now=29.0) == "dev-0"
    with pytest.raises(TicketError, match="unknown, spent or expired"):
        tickets.redeem(first, now=29.0)  # spent
    with pytest.raises(TicketError, match="unknown, spent or expired"):
        tickets.redeem(second, now=31.0)  # expired
    assert len(tickets) == 0  # expired ones are dropped: room again
    tickets.issue("dev-2", now=31.0)


def test_one_device_holds_a_few_tickets_at_most_its_newest() -> None:
    tickets = Tickets(lifetime_s=30.0, max_tickets=10, per_device=2)
    first, second, third = (tickets.issue("dev-0", now=float(t)) for t in range(3))
    other = tickets.issue("dev-1", now=3.0)
    assert len(tickets) == 3  # dev-0's first was retired by its third
    with pytest.raises(TicketError):
        tickets.redeem(first, now=4.0)
    assert [tickets.redeem(t, now=4.0) for t in (third, second, other)] == ["dev-0", "dev-0", "dev-1"]
    assert len(tickets) == 0 and tickets._of == {}


def _hello(device_id: str, token: str) -> p.Hello:
    return p.Hello(device_id=device_id, token=token, budget_bytes=2 << 30, cores=1, runtimes=["torch"], num_samples=10)


async def _ticket(port: int, device_id: str, authorization: str) -> tuple[int, dict]:
    status, _, body = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/ticket.json?id={device_id}",
                                              {"Authorization": authorization} if authorization else {})
    return status, json.loads(body)


async def _upgrade(port: int, ticket: str, hello: p.Hello | None = None) -> int | p.Message:
    """The upgrade's HTTP status with ``?ticket=`` (101: opened), or the answer to ``hello`` sent on it."""
    try:
        async with connect(f"ws://127.0.0.1:{port}/?ticket={ticket}", **ws_options()) as ws:
            if hello is None:
                return 101
            await send_msg(ws, hello)
            return await recv_msg(ws)
    except InvalidStatus as exc:
        return exc.response.status_code


def test_with_credentials_a_ticket_opens_one_upgrade_past_full_pending_caps(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as store:
        secret = store.credentials.enroll("dev-0")

    async def main() -> dict[str, object]:
        config = server_config(tmp_path / "s", require_credentials=True, web=True, min_devices=5, wait_devices_s=60,
                               max_pending_hellos=2, web_sdk=str(_sdk(tmp_path / "sdk")))
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        port, out = orch.port, {}
        held = [await connect(f"ws://127.0.0.1:{port}", **ws_options()) for _ in range(2)]  # never say hello
        out["plain"] = await _upgrade(port, "")
        auth = lambda purpose: f"Edgetrain dev-0 {make_proof('dev-0', secret, purpose=purpose)}"  # noqa: E731
        out["hello proof"] = (await _ticket(port, "dev-0", auth("hello")))[0]
        out["other device"] = (await _ticket(port, "dev-1", auth("ticket")))[0]
        out["no proof"] = (await _ticket(port, "dev-0", ""))[0]
        status, body = await _ticket(port, "dev-0", auth("ticket"))
        out["issued"] = status, body["device"], body["expires_in_s"]
        out["welcome"] = await _upgrade(port, body["ticket"], _hello("dev-0", make_proof("dev-0", secret)))
        out["again"] = await _upgrade(port, body["ticket"])
        bound = (await _ticket(port, "dev-0", auth("ticket")))[1]["ticket"]
        out["hello of another"] = await _upgrade(port, bound, _hello("dev-1", make_proof("dev-1", secret)))
        orch.admission.tickets.lifetime_s = 0.2
        late = (await _ticket(port, "dev-0", auth("ticket")))[1]["ticket"]
        await asyncio.sleep(0.4)
        out["expired"] = await _upgrade(port, late)
        for ws in held:
            await ws.close()
        server.cancel()
        return out

    out = asyncio.run(main())
    assert out["plain"] == 503  # the pending caps are full for a connection that proves nothing
    assert (out["hello proof"], out["other device"], out["no proof"]) == (401, 401, 401)
    assert out["issued"] == (200, "dev-0", 30.0)
    assert isinstance(out["welcome"], p.Welcome)
    assert out["again"] == 401 and out["expired"] == 401
    other = out["hello of another"]
    assert isinstance(other, p.Error) and other.code == "unauthorized" and "another device" in other.message


def test_with_the_token_tickets_need_it_and_an_open_server_has_none(tmp_path: Path) -> None:
    async def main() -> list[int]:
        codes = []
        for kw in ({"token": "s3cret"}, {}):
            config = server_config(tmp_path / f"s{len(codes)}", web=True, min_devices=5, wait_devices_s=60,
                                   web_sdk=str(_sdk(tmp_path / "sdk")), **kw)
            orch, server = await start_orchestrator(config, lambda kind, data: None)
            for authorization in ("Bearer s3cret", "Bearer wrong", ""):
                codes.append((await _ticket(orch.port, "page-1", authorization))[0])
            codes.append((await _ticket(orch.port, "bad/../id", "Bearer s3cret"))[0])
            server.cancel()
        return codes

    assert asyncio.run(main()) == [200, 401, 401, 400, 404, 404, 404, 404]
