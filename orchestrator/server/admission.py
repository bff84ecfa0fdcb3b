"""Admission: who may connect, and what a device's hello may declare, before anything is planned.

The server asks, in this order: does the upgrade request's ``Authorization`` header, if any, prove
the token or a credential, or its ``?ticket=`` a browser page's ticket (:meth:`Admission.admit`, HTTP
401 before the websocket opens when it does not; a proven connection is exempt from the pending caps); is there room for another connection
(:meth:`Admission.connect`, HTTP 503 before the websocket upgrade when full, 429 when one address
holds too many connections still to say hello); does the hello prove a credential
(:meth:`Admission.authenticate`); are its declarations bounded (:func:`check_hello_bounds`); can the
model take the data it declares (:func:`check_hello_data`, before any byte of the model is sent); and are
the extension fields the strategy declares well formed (:func:`parse_hello_ext`). A registered
device is what strategies see of it (:func:`device_info`), journaled in batches (:meth:`Admission.journal`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import time
import weakref
from collections.abc import Mapping
from http import HTTPStatus
from types import MappingProxyType
from urllib.parse import parse_qs, urlsplit

import numpy as np
from websockets.asyncio.server import ServerConnection

from edge_sdk import protocol as p
from edge_sdk.credentials import CredentialError, ReplayWindow, verify_proof
from edge_sdk.models import LayeredModel
from edge_sdk.settings import device_id_problem
from orchestrator.config import ServerConfig
from orchestrator.server.evaluate import data_mismatch, model_classes
from orchestrator.server.tickets import TicketError, Tickets
from orchestrator.store import Store
from orchestrator.strategies import DeviceInfo, Strategy
from orchestrator.strategies.base import HelloContext
from profiles.planner import Plan

__all__ = ["Admission", "MAX_BUDGET_BYTES", "check_hello_bounds", "check_hello_data", "device_info", "model_context",
           "parse_hello_ext", "plan_summary"]

log = logging.getLogger("edgetrain.server")

#: What a hello may declare (its fields are journaled and planned against, so each is bounded).
MAX_BUDGET_BYTES = 1 << 40  # 1 TiB: more is no device's app budget
MAX_LABELS, MAX_LABEL_CHARS = 32, 256
MAX_RUNTIMES = 8


def _host(connection: ServerConnection) -> str | None:
    """The IP address a connection comes from (None if the transport does not say)."""
    address = getattr(connection, "remote_address", None)
    return str(address[0]) if address else None


def check_hello_bounds(hello: p.Hello) -> None:
    """Refuse a hello whose declarations no device makes (an id outside the documented character set,
    a budget of 0 or of petabytes, kilobytes of labels), before it is planned or journaled."""
    if (problem := device_id_problem(hello.device_id)) is not None:
        raise p.ProtocolError("malformed", problem)
    if not 0 < hello.budget_bytes <= MAX_BUDGET_BYTES:
        raise p.ProtocolError("refused", f"budget of {hello.budget_bytes} bytes is outside (0, {MAX_BUDGET_BYTES}]")
    if hello.num_samples < 1:
        raise p.ProtocolError("refused", "a device without local samples has nothing to train on")
    if len(hello.labels) > MAX_LABELS or any(len(k) + len(v) > MAX_LABEL_CHARS for k, v in hello.labels.items()):
        raise p.ProtocolError("malformed", f"at most {MAX_LABELS} labels of at most {MAX_LABEL_CHARS} characters")
    if len(hello.runtimes) > MAX_RUNTIMES or any(len(r) > 64 for r in hello.runtimes):
        raise p.ProtocolError("malformed", f"at most {MAX_RUNTIMES} runtimes of at most 64 characters")


def journaled_id(device_id: str) -> str:
    """How a hello's device id is journaled: as it is when it is a device id, else as its escaped
    ``ascii()`` form, so a NUL or U+202E never reaches the journal or the status page."""
    return device_id if device_id_problem(device_id) is None else ascii(device_id[:64])


def check_hello_data(hello: p.Hello, model: LayeredModel) -> None:
    """Refuse a device whose declared samples (``Hello.input_shape``, ``num_classes``) the model cannot
    take, naming both shapes: it would download the model only to fail on its first batch. Each
    declared field is checked whatever else is present (labels beyond the model's classes are refused
    without a shape too); a hello that declares neither (an older device) is not checked."""
    num_classes = hello.num_classes if hello.num_classes >= 0 else None
    if hello.input_shape:
        problem = data_mismatch(model, tuple(hello.input_shape), num_classes, "this device's data")
    elif num_classes is not None and (classes := model_classes(model)) is not None and num_classes > classes:
        problem = f"model {model.name} takes {classes} classes, but this device's data has labels 0..{num_classes - 1}"
    else:
        problem = None
    if problem is not None:
        raise p.ProtocolError("refused", problem)


def parse_hello_ext(hello: p.Hello, strategy: Strategy, context: HelloContext) -> Mapping[str, object]:
    """The strategy's declared hello fields (``Strategy.hello_fields``) this hello carries, parsed.
    A bad value, or one sent without a field it requires, is ``malformed``; keys the strategy did
    not declare are ignored (a device may serve several strategies)."""
    fields = strategy.hello_fields
    parsed: dict[str, object] = {}
    for key, value in hello.ext.items():
        spec = fields.get(key)
        if spec is None:
            continue
        missing = [r for r in spec.requires if r not in hello.ext]
        if missing:
            raise p.ProtocolError("malformed", f"hello.ext[{key!r}] needs {missing} too")
        try:
            parsed[key] = spec.parse(value, context)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise p.ProtocolError("malformed", f"hello.ext[{key!r}]: {exc}"[:1024]) from None
    return MappingProxyType(parsed)


def device_info(hello: p.Hello, plan: Plan, context: HelloContext, strategy: Strategy) -> DeviceInfo:
    """What strategies see of a device. Declared rows are mapped from input columns to table entries."""
    rows: dict[str, np.ndarray] = {}
    for column, entry in context.columns.items():
        values = hello.rows.get(column)
        if values is None:
            continue
        table_rows = context.shapes[entry][0]
        if values and values[-1] >= table_rows:
            raise p.ProtocolError("malformed", f"hello.rows[{column}] names row {values[-1]} of a table with "
                                               f"{table_rows} rows")
        rows[entry] = np.asarray(values, dtype=np.int64)
    return DeviceInfo(
        device_id=hello.device_id, role=plan.role, split=plan.split, num_samples=hello.num_samples,
        device_class=hello.device_class, tags=MappingProxyType(dict(hello.labels)),
        runtimes=tuple(hello.runtimes), rows=MappingProxyType(rows), ext=parse_hello_ext(hello, strategy, context),
    )


def hello_profile(hello: p.Hello) -> dict[str, object]:
    """What the journal keeps of a hello."""
    return {
        "budget_bytes": hello.budget_bytes, "cores": hello.cores, "runtimes": list(hello.runtimes),
        "num_samples": hello.num_samples, "device_class": hello.device_class, "labels": dict(hello.labels),
        "rows": {k: len(v) for k, v in hello.rows.items()},
    }


def plan_summary(plan: Plan) -> dict[str, object]:
    return {"role": plan.role, "split": plan.split, "chunks": [list(c) for c in plan.chunks],
            "footprint_bytes": plan.footprint_bytes, "capacity": plan.capacity, "backend": plan.backend}


class Admission:
    """Connection caps, authentication and the journal of registered devices."""

    def __init__(self, config: ServerConfig, store: Store) -> None:
        self.config = config
        self.store = store
        self.connections = 0  # open
        self.pending = 0  # of which still to say hello
        self._proven_pending = 0  # of which proven in their upgrade request
        self._pending_at: dict[str, int] = {}  # address -> pending connections not proven (when gated)
        self._proven: weakref.WeakKeyDictionary[ServerConnection, str] = weakref.WeakKeyDictionary()
        self._refusals, self._refusals_logged = 0, -math.inf  # connections turned away for capacity
        # The replay cache lives in the store too: a proof captured before a restart stays refused.
        self._replay = ReplayWindow(window_s=2 * config.credential_skew_s)
        self.tickets = Tickets()  # a browser page's proof on the upgrade (:mod:`orchestrator.server.tickets`)
        for device_id, nonce, seen in store.proofs.since(time.time() - self._replay.window_s):
            self._replay.check_and_add(device_id, nonce, seen)
        self._device_rows: list[tuple[str, dict, dict]] = []  # registered, not yet journaled (one turn)
        self._proof_rows: list[tuple[str, str, float]] = []  # proofs accepted, not yet stored (one turn)
        self._closure_rows: list[tuple[float, str, str, int | None, str]] = []  # closures, not yet journaled
        self._flush_due = False

    @property
    def gated(self) -> bool:
        """Whether a device must prove itself (a token or credentials): then connections that did not
        prove themselves in their upgrade request are capped per address as well."""
        return bool(self.config.token) or self.config.require_credentials

    def over_capacity(self, host: str | None = None, *, proven: bool = False) -> tuple[HTTPStatus, str] | None:
        """Why a new connection cannot be taken now, if so: connections held; for one not proven
        in its upgrade request, connections still to say hello, in all and from its address."""
        if self.connections >= self.config.max_connections:
            return (HTTPStatus.SERVICE_UNAVAILABLE,
                    f"the server holds its maximum of {self.config.max_connections} connections; retry later")
        if proven:
            return None
        if self.pending - self._proven_pending >= self.config.max_pending_hellos:
            return HTTPStatus.SERVICE_UNAVAILABLE, "too many connections are still to say hello; retry later"
        if self.gated and host is not None and self._pending_at.get(host, 0) >= self.config.max_pending_per_address:
            return (HTTPStatus.TOO_MANY_REQUESTS, f"{self.config.max_pending_per_address} connections from this "
                                                  "address are still to say hello; retry later")
        return None

    def admit(self, connection: ServerConnection, request: object) -> object:
        """Before the websocket upgrade. An ``Authorization`` header (:meth:`prove`), or a browser
        page's ``?ticket=`` (:meth:`redeem_ticket`), that is wrong is answered HTTP 401; one that is
        right exempts the connection from the pending caps, so a flood of connections that never say
        hello cannot keep a device holding the token or its credential out. Over capacity, answer
        HTTP 503 (429: too many from one address) and keep nothing. A device retries a failed opening
        handshake with backoff (a 401 it takes as a refusal), whereas an ``Error`` frame after the
        upgrade is a refusal it takes as final: a fleet reconnecting at once must not lose every
        device beyond the caps. Cheap, too: no websocket, no session, no error frame."""
        header = getattr(request, "headers", {}).get("Authorization")
        ticket = parse_qs(urlsplit(getattr(request, "path", "")).query).get("ticket", [None])[0]
        proven: str | None = None
        try:
            if header is not None:
                proven = self.prove(header)
            if proven is None and ticket is not None:
                proven = self.redeem_ticket(ticket)
        except p.ProtocolError as exc:
            self.note_refusal(f"refused an upgrade request: {exc.message}")
            return connection.respond(HTTPStatus.UNAUTHORIZED, exc.message + "\n")
        refusal = self.over_capacity(_host(connection), proven=proven is not None)
        if refusal is None:
            if proven is not None:
                self._proven[connection] = proven
            return None
        self.note_refusal(refusal[1])
        return connection.respond(refusal[0], refusal[1] + "\n")

    def issue_ticket(self, device_id: str) -> str:
        """A ticket for one upgrade of ``device_id`` (:mod:`orchestrator.server.tickets`); the caller has
        proved the request (``/ticket.json``). No room: ``refused``."""
        try:
            return self.tickets.issue(device_id, time.monotonic())
        except TicketError as exc:
            raise p.ProtocolError("refused", str(exc)) from None

    def redeem_ticket(self, ticket: str) -> str:
        """The device id an upgrade's ticket proves (spent now); unknown, spent or expired: ``unauthorized``."""
        try:
            return self.tickets.redeem(ticket, time.monotonic())
        except TicketError as exc:
            raise p.ProtocolError("unauthorized", str(exc)) from None

    def prove(self, header: str, purpose: str = "upgrade") -> str | None:
        """Check an ``Authorization`` header at the door ``purpose`` (the upgrade request's, or the
        web site's ``status`` and ``ticket``): ``Bearer <token>`` (the shared token) or
        ``Edgetrain <device_id> <proof>`` (a credential proof made for ``purpose``, spent like a
        hello's and in the same replay record). Returns the device id it proves ("" for the token),
        None for a scheme this server does not use (the upgrade ignores it: the hello still proves
        itself); a header of the scheme it uses that proves nothing is ``unauthorized``."""
        scheme, _, rest = header.strip().partition(" ")
        if scheme == "Edgetrain" and self.config.require_credentials:
            device_id, _, token = rest.strip().partition(" ")
            self.spend_proof(device_id, token.strip(), purpose)
            return device_id
        if scheme == "Bearer" and self.config.token and not self.config.require_credentials:
            if hmac.compare_digest(rest.strip().encode(), self.config.token.encode()):
                return ""
            raise p.ProtocolError("unauthorized", "bad credentials in the Authorization header")
        return None

    def connect(self, connection: ServerConnection | None = None) -> str | None:
        """Count a new connection (still to say hello); why it must go, if over capacity (a burst
        admitted together may overshoot the caps)."""
        proven = connection is not None and connection in self._proven
        host = None if proven or connection is None else _host(connection)
        refusal = self.over_capacity(host, proven=proven)
        self.connections += 1
        self.pending += 1
        self._proven_pending += proven
        if host is not None:
            self._pending_at[host] = self._pending_at.get(host, 0) + 1
        if refusal is not None:
            self.note_refusal(refusal[1])
            return refusal[1]
        return None

    def proven_id(self, connection: ServerConnection) -> str | None:
        """The device id the connection's upgrade request proved ("": the token), or None."""
        return self._proven.get(connection)

    def hello_done(self, connection: ServerConnection | None = None) -> None:
        """A counted connection said hello (or gave up before it): it is no longer pending."""
        self.pending -= 1
        if connection is not None and connection in self._proven:
            self._proven_pending -= 1
        elif connection is not None and (host := _host(connection)) in self._pending_at:
            left = self._pending_at[host] - 1
            if left > 0:
                self._pending_at[host] = left
            else:
                del self._pending_at[host]

    def disconnect(self, connection: ServerConnection | None = None, *, pending: bool) -> None:
        """A counted connection closed; ``pending``: before :meth:`hello_done` was called for it."""
        self.connections -= 1
        if pending:
            self.hello_done(connection)
        if connection is not None:
            self._proven.pop(connection, None)

    def note_refusal(self, reason: str) -> None:
        """Count a connection turned away for capacity; logged at most every 10 s, not per connection."""
        self._refusals += 1
        now = time.monotonic()
        if now - self._refusals_logged >= 10.0:
            log.warning("turned away %d connections since the last report: %s", self._refusals, reason)
            self._refusals, self._refusals_logged = 0, now

    def authenticate(self, hello: p.Hello, proven: str | None = None) -> int | None:
        """Check the hello's credential before anything else; return the enrolled sample count, if any.

        With ``require_credentials`` every device proves its own enrolled credential
        (:mod:`edge_sdk.credentials`): unknown, revoked, stale, forged or replayed proofs are
        refused before any model data is sent, and a device id can be taken only by its own
        credential. Otherwise the shared ``token`` (a lab setting) is compared in constant time.
        A connection whose upgrade request proved a device id (``proven``) says hello as that device.
        Every refusal is journaled (``store.closures``, kind ``unauthorized``).
        """
        try:
            if proven and hello.device_id != proven:
                raise p.ProtocolError("unauthorized", "the hello names another device than the upgrade request proved")
            return self._check_credential(hello)
        except p.ProtocolError as exc:
            self.note_closure(journaled_id(hello.device_id), "unauthorized", exc.message)
            raise

    def check_hello(self, hello: p.Hello, model: LayeredModel) -> None:
        """Bound the hello's declarations and check its data against ``model``
        (:func:`check_hello_bounds`, :func:`check_hello_data`); a refusal is journaled (kind
        ``hello_refused``) with its reason before it is raised."""
        try:
            check_hello_bounds(hello)
            check_hello_data(hello, model)
        except p.ProtocolError as exc:
            self.note_closure(journaled_id(hello.device_id), "hello_refused", f"{exc.code}: {exc.message}")
            raise

    def _check_credential(self, hello: p.Hello) -> int | None:
        if self.config.require_credentials:
            return self.spend_proof(hello.device_id, hello.token, "hello")
        if self.config.token and not hmac.compare_digest(hello.token.encode(), self.config.token.encode()):
            raise p.ProtocolError("unauthorized", "bad credentials")
        return None

    def spend_proof(self, device_id: str, proof: str, purpose: str) -> int | None:
        """Check a credential proof of ``device_id`` made for the door ``purpose`` (``hello``,
        ``upgrade``, ``status``, ``ticket``: :mod:`edge_sdk.credentials`) and spend it. The purpose is
        in the proof's signed bytes, so a proof captured on its way to one door is no good at another;
        one replay record (this window, kept in the store's ``proofs`` table) serves every door, so a
        proof is spent once. Returns the enrolled sample count; an unknown, revoked, stale, forged,
        misdirected or spent proof is ``unauthorized``."""
        cred = self.store.credentials.get(device_id)
        if cred is None or cred["revoked"] is not None:
            raise p.ProtocolError("unauthorized", "no valid credential is enrolled for this device")
        now = time.time()
        try:
            spent = verify_proof(device_id, proof, cred["key"], self._replay, purpose=purpose, now=now,
                                 max_skew_s=self.config.credential_skew_s)
        except CredentialError as exc:
            raise p.ProtocolError("unauthorized", str(exc)) from None
        self._proof_rows.append((device_id, spent.nonce, now))
        self._flush_soon()
        return cred["samples"]

    def note_closure(self, device_id: str, kind: str, reason: str, round: int | None = None) -> None:
        """Journal a connection refused or ended for cause (batched per turn, as registrations are)."""
        self._closure_rows.append((time.time(), device_id, kind, round, reason[:512]))
        self._flush_soon()

    def journal(self, hello: p.Hello, plan: Plan) -> None:
        """Journal a registered device. The hellos taken in one turn of the event loop share one
        commit (``store.devices.record_many``), written as soon as that turn's callbacks are done:
        a commit per hello was most of the server's own work per hello."""
        self._device_rows.append((hello.device_id, hello_profile(hello), plan_summary(plan)))
        self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._flush_due:
            self._flush_due = True
            with contextlib.suppress(RuntimeError):  # no running loop (a direct call): flushed by the caller
                asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write what this turn registered, accepted and refused: one commit per kind."""
        self._flush_due = False
        rows, self._device_rows = self._device_rows, []
        if rows:
            self.store.devices.record_many(rows)
        proofs, self._proof_rows = self._proof_rows, []
        if proofs:
            self.store.proofs.record(proofs, forget_before=time.time() - self._replay.window_s)
        closures, self._closure_rows = self._closure_rows, []
        self.store.closures.record(closures)


def model_context(sparse_inputs: Mapping[str, object], state: Mapping[str, np.ndarray]) -> HelloContext:
    """What hello fields are checked against: the model's sparse input columns and state shapes."""
    return HelloContext(columns=MappingProxyType({str(c): e for e, c in sparse_inputs.items()}),
                        shapes=MappingProxyType({k: tuple(v.shape) for k, v in state.items()}))
