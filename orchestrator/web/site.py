"""The HTTP side of the orchestrator's port: a request that is not a websocket upgrade gets a page.

Served with ``--web`` only, each response with the cross-origin isolation headers (WebAssembly threads):

- ``/``: the device page (a phone joins by opening it), ``/web.json`` what it needs to know of the run,
  ``/shard/<k>.bin`` the demo's shards (the training split of ``--data``, cut as the Python device's
  ``--client k --num-clients n``), ``/sdk/...`` the built JavaScript SDK and onnxruntime-web;
- ``/status``: the read-only status page, whose data (``/status.json``) needs the devices' token, or with
  ``--require-credentials`` an enrolled device's credential proof, in its ``Authorization`` header.

A websocket upgrade goes on to admission as without ``--web`` (docs/web.md).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from pathlib import Path
from urllib.parse import urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from edge_sdk.credentials import CredentialError, ReplayWindow, verify_proof
from orchestrator.web.files import SdkFiles, default_sdk_dir, respond
from orchestrator.web.status import Served, StatusFeed, snapshot

__all__ = ["WebSite"]

log = logging.getLogger("edgetrain.web")
JSON = "application/json"


class WebSite:
    """Pages, SDK files, demo shards and the status on ``server``'s port; hooks its ``process_request``
    (upgrades still go to admission) and its ``on_event`` (the status page's feed)."""

    def __init__(self, server: Served, *, sdk_dir: Path | None = None) -> None:
        self.server = server
        self.config = server.config
        self.files = SdkFiles(sdk_dir or (Path(self.config.web_sdk) if self.config.web_sdk else default_sdk_dir()))
        self.feed = StatusFeed()
        self._replay = ReplayWindow(window_s=2 * self.config.credential_skew_s)
        self._shards: dict[int, bytes] = {}
        self._admit = server.process_request
        server.process_request = self.process_request
        server.on_event = self.feed.tee(server.on_event)

    async def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return self._admit(connection, request)  # type: ignore[return-value]
        try:
            return await self.route(request)
        except Exception:  # a fault of the site's own: this request fails, the server goes on
            log.exception("serving %s", request.path[:200])
            return respond(500, b"internal error\n", "text/plain; charset=utf-8")

    async def route(self, request: Request) -> Response:
        path = urlsplit(request.path).path
        found: Response | None = None
        if path in ("/", "/index.html"):
            found = self.files.page("device.html")
        elif path == "/status":
            found = self.files.page("status.html")
        elif path.startswith("/static/"):
            found = self.files.page(path.removeprefix("/static/"))
        elif path.startswith("/sdk/"):
            found = self.files.sdk(path.removeprefix("/sdk/"))
        elif path == "/web.json":
            found = self._json(200, self.run_info())
        elif path == "/status.json":
            refused = self.refusal(request.headers.get("Authorization", ""))
            found = self._json(401, {"error": refused}) if refused else self._json(200, snapshot(self.server, self.feed))
        elif path.startswith("/shard/") and path.endswith(".bin"):
            found = await self.shard(path.removeprefix("/shard/").removesuffix(".bin"))
        return found or respond(404, b"not found\n", "text/plain; charset=utf-8")

    def run_info(self) -> dict[str, object]:
        """What the device page needs: the run's model and rounds, the demo's shards, how devices prove themselves."""
        c = self.config
        auth = "credentials" if c.require_credentials else "token" if c.token else "none"
        return {"model": c.model, "rounds": c.rounds, "local_steps": c.local_steps, "data": c.eval_data,
                "shards": c.web_demo_shards, "auth": auth, "sdk_missing": self.files.missing()}

    def refusal(self, authorization: str) -> str | None:
        """Why ``authorization`` does not open the status (None: it does). The token as ``Bearer <token>``;
        with credentials, ``Edgetrain <device id> <proof>``, a fresh proof per request as in a hello."""
        c = self.config
        scheme, _, value = authorization.strip().partition(" ")
        if c.require_credentials:
            device_id, _, proof = value.strip().partition(" ")
            cred = self.server.store.credential(device_id) if scheme == "Edgetrain" else None
            if cred is None or cred["revoked"] is not None:
                return "the status needs an enrolled device's credential"
            try:
                verify_proof(device_id, proof, cred["key"], self._replay, max_skew_s=c.credential_skew_s)
            except CredentialError as exc:
                return str(exc)
            return None
        if c.token and not (scheme == "Bearer" and hmac.compare_digest(value.strip().encode(), c.token.encode())):
            return "the status needs the devices' token"
        return None

    async def shard(self, name: str) -> Response | None:
        """The demo's shard ``name`` (a client index below ``web_demo_shards``), as tensors ``x`` and ``y``."""
        if not name.isdigit() or int(name) >= self.config.web_demo_shards:
            return None
        k = int(name)
        if k not in self._shards:
            try:
                self._shards[k] = await asyncio.to_thread(self._load_shard, k)
            except (OSError, ValueError) as exc:
                return respond(404, f"no demo shard: {exc}\n".encode(), "text/plain; charset=utf-8")
        return respond(200, self._shards[k], "application/octet-stream")

    def _load_shard(self, k: int) -> bytes:
        from edge_sdk.cli import load_shard
        from edge_sdk.protocol import encode_tensors

        c = self.config
        x, y = load_shard(c.eval_data, client=k, num_clients=c.web_demo_shards, seed=c.seed, data_root=c.data_root)
        return encode_tensors({"x": x, "y": y})

    @staticmethod
    def _json(status: int, value: object) -> Response:
        return respond(status, json.dumps(value, default=str).encode(), JSON)
