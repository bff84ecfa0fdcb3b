"""One proof, one door: a credential proof names its purpose in its signed bytes
(:mod:`edge_sdk.credentials`, format 2), so a proof made for one door (the hello, the websocket upgrade
request's ``Authorization`` header, the status page's ``/status.json``, a browser page's
``/ticket.json``) is refused at every other, even unspent (captured on its way); and one replay record
(``Admission.spend_proof``, the store's ``proofs`` table) spends it at its own door once."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from edge_sdk import protocol as p
from edge_sdk.credentials import make_proof
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.store import Store
from tests.factories import server_config
from tests.test_web import _get, _sdk

DOORS = ("status", "ticket", "upgrade", "hello")


async def _knock(door: str, port: int, proof: str) -> bool:
    """Whether ``door`` takes device dev-0's ``proof``."""
    url, header = f"ws://127.0.0.1:{port}", {"Authorization": f"Edgetrain dev-0 {proof}"}
    if door in ("status", "ticket"):
        path = "status.json" if door == "status" else "ticket.json?id=dev-0"
        return (await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/{path}", header))[0] == 200
    try:
        async with connect(url, additional_headers=header if door == "upgrade" else None, **ws_options()) as ws:
            if door == "upgrade":
                return True
            await send_msg(ws, p.Hello(device_id="dev-0", token=proof, budget_bytes=2 << 30, cores=1,
                                       runtimes=["torch"], num_samples=10))
            return isinstance(await recv_msg(ws), p.Welcome)
    except InvalidStatus as exc:
        assert exc.response.status_code == 401
        return False


def test_a_proof_is_good_once_and_only_at_the_door_it_names(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as store:
        secret = store.credentials.enroll("dev-0")

    async def main() -> dict[tuple[str, str], tuple[bool, bool, bool]]:
        config = server_config(tmp_path / "s", require_credentials=True, web=True, min_devices=5, wait_devices_s=60,
                               web_sdk=str(_sdk(tmp_path / "sdk")))
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        seen = {}
        for made_for, tried_at in itertools.permutations(DOORS, 2):
            proof = make_proof("dev-0", secret, purpose=made_for)
            # captured unspent and tried elsewhere; then its own door, twice (the second a replay)
            seen[(made_for, tried_at)] = (await _knock(tried_at, orch.port, proof),
                                          await _knock(made_for, orch.port, proof),
                                          await _knock(made_for, orch.port, proof))
        server.cancel()
        return seen

    seen = asyncio.run(main())
    assert seen == {pair: (False, True, False) for pair in itertools.permutations(DOORS, 2)}, seen
