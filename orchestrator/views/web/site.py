"""The HTTP side of the orchestrator's port: a request that is not a websocket upgrade gets a page.

Served with ``--web`` only, each response with the cross-origin isolation headers (WebAssembly threads):

- ``/``: the device page (a phone joins by opening it), ``/web.json`` what it needs to know of the run,
  ``/budget.json`` the least budget the server plans a browser device for, ``/device.json`` the rounds
  a device trained (the journal's), ``/shard/<k>.bin`` the demo's shards (the training split of
  ``--data``, cut as the Python device's ``--client k --num-clients n``), ``/sdk/...`` the built
  JavaScript SDK and onnxruntime-web, ``/sw.js`` the page's service worker (an installable page);
- ``/install``, ``/ca.crt``: with a local certificate authority (:mod:`~orchestrator.views.web.certs`), how a
  phone installs it, and its certificate (the plain-http side serves them too: :mod:`~orchestrator.views.web.install`);
- ``/status``: the read-only status page, whose data (``/status.json``) needs the devices' token, or with
  ``--require-credentials`` an enrolled device's credential proof, in its ``Authorization`` header;
- ``/ticket.json?id=<device>``: a single-use, short-lived ticket the device page carries on its websocket
  upgrade (``?ticket=``) in place of the header a browser cannot set, for the same token or proof.

A websocket upgrade goes on to admission as without ``--web`` (docs/web.md).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from edge_sdk.protocol import ProtocolError
from edge_sdk.settings import device_id_problem
from orchestrator.views.web.certs import LocalAuthority
from orchestrator.views.web.files import REVALIDATE, STATIC, SdkFiles, default_sdk_dir, respond
from orchestrator.views.web.install import ca_response, install_page, trust_response
from orchestrator.views.web.status import ServerView, StatusFeed, snapshot

__all__ = ["WebOptions", "WebSite"]

log = logging.getLogger("edgetrain.web")
JSON = "application/json"
#: What the device page can wait for before it trains (where the browser tells: docs/web.md).
CONDITIONS = ("charging", "unmetered")
#: The runtime the device page declares; budgets are offered for it, or for its GPU (WebGPU) build, which
#: it declares before it (``/budget.json?runtime=``).
WEB_RUNTIME = "onnxruntime-web"
WEB_RUNTIMES = ("onnxruntime-web", "onnxruntime-webgpu")


@dataclass(frozen=True)
class WebOptions:
    """How ``serve`` sets up the pages: the conditions the server asks of every device page
    (``--web-condition``) and the local certificate authority the port serves TLS from, if any
    (``--web-tls``)."""

    conditions: tuple[str, ...] = ()
    authority: LocalAuthority | None = None


class WebSite:
    """Pages, SDK files, demo shards and the status on the server's port, reading ``server`` (a
    :class:`ServerView`); the server hands it every request (:meth:`process_request`: a websocket
    upgrade goes on to ``admit``, admission's answer) and every event (``feed``, the status page's)."""

    def __init__(self, server: ServerView, *, admit: Callable[..., Response | None], options: WebOptions = WebOptions(),
                 sdk_dir: Path | None = None) -> None:
        self.server, self._admit = server, admit
        self.config = server.config
        self.conditions, self.authority = tuple(options.conditions), options.authority
        self.files = SdkFiles(sdk_dir or (Path(self.config.web_sdk) if self.config.web_sdk else default_sdk_dir()))
        threading.Thread(target=self.files.warm, name="web files", daemon=True).start()
        self.feed = StatusFeed()
        self._shards: dict[int, bytes] = {}
        self._budgets: dict[tuple[int, str], dict[str, object]] = {}

    async def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return self._admit(connection, request)
        try:
            return await self.route(request)
        except Exception:  # a fault of the site's own: this request fails, the server goes on
            log.exception("serving %s", request.path[:200])
            return respond(500, b"internal error\n", "text/plain; charset=utf-8")

    async def route(self, request: Request) -> Response:
        url = urlsplit(request.path)
        path, query, headers = url.path, parse_qs(url.query), request.headers
        found: Response | None = None
        if path in ("/", "/index.html"):
            found = await self.files.page("device.html", headers)
        elif path == "/status":
            found = await self.files.page("status.html", headers)
        elif path.startswith("/static/"):
            found = await self.files.page(path.removeprefix("/static/"), headers)
        elif path.startswith("/sdk/"):
            found = await self.files.sdk(path.removeprefix("/sdk/"), headers)
        elif path == "/sw.js":
            found = self.service_worker()
        elif path == "/trust.json":
            found = trust_response()
        elif path == "/web.json":
            found = self._json(200, self.run_info())
        elif path == "/budget.json":
            found = await self.budget(query.get("samples", ["0"])[0], query.get("runtime", [WEB_RUNTIME])[0])
        elif path in ("/status.json", "/device.json"):
            refused = self.refusal(headers.get("Authorization", ""))
            if refused:
                found = self._json(401, {"error": refused})
            elif path == "/status.json":
                found = self._json(200, snapshot(self.server, self.feed))
            else:
                found = self._json(200, await asyncio.to_thread(self.device_rounds, query.get("id", [""])[0]))
        elif path == "/ticket.json":
            found = self.ticket(headers.get("Authorization", ""), query.get("id", [""])[0])
        elif path.startswith("/shard/") and path.endswith(".bin"):
            found = await self.shard(path.removeprefix("/shard/").removesuffix(".bin"))
        elif self.authority is not None and path in ("/ca.crt", "/ca.pem", "/install"):
            found = install_page(self.authority, self._https_url(headers)) if path == "/install" \
                else ca_response(self.authority, pem=path == "/ca.pem")
        return found or respond(404, b"not found\n", "text/plain; charset=utf-8")

    def _https_url(self, headers: Headers) -> str:
        host = headers.get("Host", "") or f"127.0.0.1:{self.server.port()}"
        return f"https://{host}/"

    def service_worker(self) -> Response:
        """``/sw.js`` at the site's root (its scope is the whole site): the script, told its cache's name
        (the files' version) and the files to keep from its install on."""
        preamble = (f"const VERSION = {json.dumps(self.files.version())};\n"
                    f"const PRECACHE = {json.dumps(self.files.precache())};\n")
        body = preamble.encode() + (STATIC / "sw.js").read_bytes()
        return respond(200, body, "text/javascript", cache=REVALIDATE)

    def run_info(self) -> dict[str, object]:
        """What the device page needs: the run's model and rounds, the demo's shards, how devices prove themselves."""
        c = self.config
        auth = "credentials" if c.require_credentials else "token" if c.token else "none"
        from orchestrator.server.evaluate import model_classes

        model = self.server.model
        return {"model": c.model, "rounds": c.rounds, "local_steps": c.local_steps, "data": c.eval_data,
                "shards": c.web_demo_shards, "auth": auth, "sdk_missing": self.files.missing(),
                "input_shape": list(model.input_shape) if model is not None else None,
                "num_classes": model_classes(model) if model is not None else None,
                "conditions": list(self.conditions), "tls": self.authority is not None}

    async def budget(self, samples: str, runtime: str = WEB_RUNTIME) -> Response:
        """The least budget the server plans a browser device with ``samples`` local samples for, and
        that plan: what the device page offers when the browser reports no memory size. ``runtime``: the
        page trains on WebAssembly (``onnxruntime-web``) or on its GPU (``onnxruntime-webgpu``, which holds
        more). The server's own plan arithmetic (``profiles.planner.plan_split`` over the model, the splits
        with a training graph and the planner's batch, as a hello is planned), without an export: it
        answers at once."""
        if not samples.isdigit() or int(samples) > self.config.max_device_samples:
            return self._json(400, {"error": f"samples must be a count up to {self.config.max_device_samples}"})
        if runtime not in WEB_RUNTIMES:
            return self._json(400, {"error": f"runtime is one of {', '.join(WEB_RUNTIMES)}"})
        key = (int(samples), runtime)
        if key not in self._budgets:
            if len(self._budgets) > 64:
                self._budgets.clear()
            self._budgets[key] = await asyncio.to_thread(self._least_budget, *key)
        found = self._budgets[key]
        return self._json(409 if "error" in found else 200, found)

    def _least_budget(self, samples: int, runtime: str = WEB_RUNTIME) -> dict[str, object]:
        from edge_sdk import protocol as p
        from profiles.planner import PlanError, plan_split

        planning = self.server.planning
        hello = p.Hello(device_id="web-budget", token="", budget_bytes=1, cores=1,
                        runtimes=list(dict.fromkeys([runtime, WEB_RUNTIME])), num_samples=samples)

        def plan(budget: int):  # as Planning plans a hello of this budget
            return plan_split(planning.cost, budget, self.config.planner_batch, local_samples=samples,
                              backends=(planning.runtime(hello).name,), graph_splits=planning.graph_splits,
                              rows=planning.planned_rows(hello), memory=planning.memory)
        try:
            least = plan(1).budget_bytes
        except PlanError as exc:
            if exc.needed_bytes <= 0:
                return {"error": str(exc)[:512]}
            least = exc.needed_bytes
        found = plan(least)
        return {"budget_bytes": least, "role": found.role, "split": found.split, "num_blocks": found.num_blocks,
                "samples": samples, "runtime": found.backend}

    def device_rounds(self, device_id: str) -> dict[str, object]:
        """The rounds whose train report of ``device_id`` the journal holds as accepted: what a reopened
        device page shows as this device's rounds (a tab counts only its own otherwise)."""
        rounds = sorted({u["round"] for u in self.server.store.reports.all()
                         if u["device_id"] == device_id and u.get("phase", "train") == "train" and u.get("accepted")})
        return {"device": device_id, "rounds": len(rounds), "last_round": rounds[-1] if rounds else None}

    def prove(self, authorization: str, purpose: str) -> str:
        """The device id ``authorization`` proves at the web door ``purpose`` ("" for the token, or on a
        server that asks nothing); else ``unauthorized``. The token as ``Bearer <token>``; with
        credentials, ``Edgetrain <device id> <proof>``, a fresh proof made for ``purpose``, spent in
        admission's replay record (:meth:`Admission.prove`)."""
        c = self.config
        if not (c.require_credentials or c.token):
            return ""
        proven = self.server.admission.prove(authorization, purpose)
        if proven is None:
            raise ProtocolError("unauthorized", "this needs an enrolled device's credential" if c.require_credentials
                                else "this needs the devices' token")
        return proven

    def refusal(self, authorization: str) -> str | None:
        """Why ``authorization`` does not open the status (None: it does)."""
        try:
            self.prove(authorization, "status")
        except ProtocolError as exc:
            return exc.message
        return None

    def ticket(self, authorization: str, device_id: str) -> Response:
        """``/ticket.json?id=<device id>``: a ticket for one websocket upgrade of that device
        (:mod:`orchestrator.server.tickets`), for a browser page, which cannot set the upgrade's header. The
        request proves itself as the upgrade would (a proof made for ``ticket`` of the same device, or
        the token); a server that asks nothing has no use for tickets (404)."""
        c = self.config
        if not (c.require_credentials or c.token):
            return self._json(404, {"error": "this server asks devices for no credential: connect without a ticket"})
        if (problem := device_id_problem(device_id)) is not None:
            return self._json(400, {"error": problem})
        try:
            proven = self.prove(authorization, "ticket")
            if proven and proven != device_id:
                raise ProtocolError("unauthorized", "the ticket is asked for another device than the proof's")
            ticket = self.server.admission.issue_ticket(device_id)
        except ProtocolError as exc:
            return self._json(401 if exc.code == "unauthorized" else 503, {"error": exc.message})
        return self._json(200, {"ticket": ticket, "device": device_id,
                                "expires_in_s": self.server.admission.tickets.lifetime_s})

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
