"""The orchestrator: an asyncio websockets server that plans devices and carries out the strategy's rounds.

The server does the I/O; the decisions live in sans-I/O pieces it calls (docs/architecture.md):
the planner (:mod:`profiles.planner`) gives each hello a role and split, the strategy
(:mod:`orchestrator.strategies`) decides who does what in a round and folds the reports, round
bookkeeping (:mod:`orchestrator.rounds`) tracks the instructions out, payload selections
(:mod:`orchestrator.selection`) cut what each device receives and bound what it may return, and the
session state machine (:mod:`edge_sdk.protocol.session`) checks every message against the
conversation so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import math
import time
from collections import deque
from http import HTTPStatus
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np
import torch
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from edge_sdk import protocol as p
from edge_sdk.credentials import CredentialError, ReplayWindow, verify_proof
from edge_sdk.models import LayeredModel, build_model
from edge_sdk.protocol.session import ServerSession
from edge_sdk.transport import (
    Channel,
    Pace,
    recv_msg,
    recv_payload,
    send_msg,
    send_payload,
    server_tls,
    ws_options,
)
from exporters.cache import ChunkCache
from exporters.onnx_export import ExportError
from exporters.train_export import TrainGraphCache, train_graph_refusal
from orchestrator.config import ServerConfig
from orchestrator.evaluate import Evaluator
from orchestrator.limits import raise_fd_limit
from orchestrator.plancache import PlanCache
from orchestrator.rounds import RoundState
from orchestrator.selection import Selection
from orchestrator.store import Store
from orchestrator.strategies import (
    Broadcast,
    DeviceInfo,
    DeviceReport,
    Instruction,
    Refused,
    RoundContext,
    Strategy,
    make_strategy,
)
from profiles.accounting import ModelCost, measure_model
from profiles.planner import Plan, PlanError, RoleThresholds, plan_split, width_cost
from profiles.runtime import runtime_memory

log = logging.getLogger("edgetrain.server")

#: Phases whose reports must carry tensors (deltas of the state the selection sent).
TENSOR_PHASES = frozenset({"train"})


@dataclass
class Session:
    """A connected device: its hello, its plan, what strategies see of it, and its channel."""

    device_id: str
    channel: Channel
    hello: p.Hello
    plan: Plan
    info: DeviceInfo
    enrolled_samples: int | None = None  # fixed at enrollment, when the device has a credential

    @property
    def ws(self) -> ServerConnection:
        return self.channel.ws


@dataclass
class Work:
    """One instruction out in the current round: what the strategy asked and what went on the wire."""

    instruction: Instruction
    selection: Selection
    wire: p.Instruction
    names: tuple[str, ...]  # state entries of the selected tail

    @property
    def payload_ids(self) -> tuple[str, ...]:
        ids = (*self.wire.chunk_ids, self.wire.model_id)
        return (*ids, self.wire.broadcast_id) if self.wire.broadcast_id else ids


@dataclass
class PartialUpload:
    """An update whose transfer a dropped connection cut short. Kept until the round ends, so that
    the device's reconnect continues it from the bytes held (docs/protocol.md, "Resume")."""

    report: p.Report
    incoming: p.IncomingTransfer


@dataclass(frozen=True)
class Payload:
    """One encoded payload of the round: sent to every device that fetches its id, hashed once."""

    kind: str  # chunk | model | broadcast | train_graph
    data: bytes
    sha256: str
    meta: dict[str, p.Scalar] = field(default_factory=dict)


def device_backends(hello: p.Hello) -> tuple[str, ...]:
    """The training backend a device's hello asks for: torch if it lists torch, else ONNX Runtime
    (training graphs; edge_sdk.client.hello_runtimes)."""
    return ("torch",) if "torch" in hello.runtimes else ("onnxruntime",)


def state_version(state: dict[str, np.ndarray]) -> str:
    """Content hash of the global weights: the model version that chunk and model ids derive from."""
    h = hashlib.sha256()
    for name in sorted(state):
        arr = np.ascontiguousarray(state[name])
        h.update(name.encode())
        h.update(str(arr.dtype).encode())
        h.update(arr.tobytes())
    return h.hexdigest()[:16]


class Orchestrator:
    """Registers devices, runs ``config.rounds`` rounds as the strategy directs, persists each one."""

    def __init__(self, config: ServerConfig, *, on_event: Callable[[str, dict], None] | None = None,
                 strategy: Strategy | None = None) -> None:
        self.config = config
        self.on_event = on_event or (lambda kind, data: None)
        # Frames this side sends are config.frame_size; it accepts any peer's up to the default bound.
        self.limits = p.Limits(max_frame_bytes=max(config.frame_size, p.DEFAULT_LIMITS.max_frame_bytes))
        self.model: LayeredModel = build_model(config.model, seed=config.seed)
        self.model.eval()
        self.global_state = {k: v.detach().numpy().copy() for k, v in self.model.state_dict().items()}
        self.strategy = strategy if strategy is not None else make_strategy(config.strategy, **config.strategy_options)
        self.store = Store(config.store_dir, keep=config.keep_checkpoints)
        self.cache = ChunkCache(max_bytes=256 << 20, directory=config.store_dir / "chunks")
        self.evaluator = Evaluator(config)
        self.cost = measure_model(self.model)  # measured once; every hello is planned against it
        # Training graphs for devices planned on the ONNX Runtime backend: exported once per split
        # (the weights are inputs), verified against torch, kept under the store.
        self.train_graphs = TrainGraphCache(config.train_graph_dir or config.store_dir / "train_graphs")
        # Splits with no static refusal, less those whose graph the export check refused (found on
        # first use and remembered on disk): a plan never names a graph that cannot be shipped.
        self.graph_splits = frozenset(k for k in range(len(self.model)) if train_graph_refusal(self.model, k) is None
                                      and self.train_graphs.known_refusal(self.model, k) is None)
        self.sessions: dict[str, Session] = {}
        self.plans = PlanCache()  # hello profile -> plan: each distinct profile is planned once
        self._device_rows: list[tuple[str, dict, dict]] = []  # registered, not yet journaled (one turn)
        self.round: RoundState | None = None
        self.ctx: RoundContext | None = None
        self.version = ""
        self.payloads: dict[str, Payload] = {}  # this round's payloads by id
        self._broadcast_ids: dict[int, tuple[Broadcast, str]] = {}  # id(Broadcast) -> (kept alive, payload id)
        self.work: dict[str, dict[str, Work]] = {}  # device -> phase -> instruction out this round
        # Updates cut short by a dropped connection, by device: resumed when the device comes back this round.
        self.partial_uploads: dict[str, PartialUpload] = {}
        self.start_round = 1
        self.history: list[dict] = []
        self._changed = asyncio.Event()
        self._bytes = [0, 0]  # sent, received this round
        # L2 norms of recent accepted updates, per selection (a weak device's head-only update is
        # far smaller than a strong device's whole-model one: each is bounded against its peers).
        self._norms: dict[str, deque[float]] = {}
        self.pace = Pace(config.transfer_stall_s, config.transfer_min_rate, config.transfer_grace_s)
        self._open = [0, 0]  # connections open, of which still to say hello
        self._refusals, self._refusals_logged = 0, -math.inf  # connections turned away for capacity
        self._replay = ReplayWindow(window_s=2 * config.credential_skew_s)
        self.port: int | None = None
        self._start: asyncio.Event | None = None  # run(start=...): the first round waits for it
        self._prepare_store()

    # -- persistence ----------------------------------------------------------------------
    def _prepare_store(self) -> None:
        identity = {"model": self.config.model, "strategy": self.strategy.name, "seed": str(self.config.seed)}
        if self.config.resume:
            for key, value in identity.items():
                stored = self.store.get_meta(key)
                if stored is not None and stored != value:
                    raise ValueError(f"--resume: the store at {self.config.store_dir} was a run with {key}={stored}, not {value}")
            last = self.store.last_completed()
            if last is not None:
                done, state = last
                missing = set(self.global_state) - set(state)
                if missing:
                    raise ValueError(f"checkpoint of round {done} lacks {sorted(missing)[:3]}")
                self.global_state = {k: np.asarray(state[k]).copy() for k in self.global_state}
                self.start_round = done + 1
                self.history = [r.get("metrics", {}) for r in self.store.rounds() if r.get("metrics")]
                log.info("resuming after round %d", done)
        elif any(r["complete"] for r in self.store.rounds()):
            raise ValueError(
                f"{self.config.store_dir} already holds a run; pass --resume to continue it or choose a fresh --store"
            )
        for key, value in identity.items():
            self.store.set_meta(key, value)

    def _load_global_into_model(self) -> None:
        state = {k: torch.from_numpy(np.array(v)) for k, v in self.global_state.items()}
        self.model.load_state_dict(state)
        self.model.eval()

    # -- serving --------------------------------------------------------------------------
    async def run(self, *, ready: asyncio.Event | None = None, start: asyncio.Event | None = None) -> list[dict]:
        """Serve until every round is done; return the per-round metrics.

        ``start``: the first round also waits for this event once ``min_devices`` are connected
        (a benchmark measures the connected fleet at rest first)."""
        self._start = start
        raise_fd_limit()  # a socket per device: the soft limit (often 1,024) up to the hard one
        try:
            tls = server_tls(self.config.tls_cert, self.config.tls_key) if self.config.tls_cert else None
            # backlog: a fleet reconnecting at once (a server restart) must not overflow the accept
            # queue (asyncio's default is 100; the kernel caps it at net.core.somaxconn).
            async with serve(self._handler, self.config.host, self.config.port, ssl=tls, process_request=self._admit,
                             backlog=max(100, self.config.max_pending_hellos), **ws_options(self.limits)) as server:
                self.port = server.sockets[0].getsockname()[1]
                self.on_event("listening", {"host": self.config.host, "port": self.port, "tls": tls is not None})
                if ready is not None:
                    ready.set()
                try:
                    await self._rounds()
                finally:
                    await self._say_bye("training finished")
        finally:
            # Closed only after the server stopped accepting: a late hello must not meet a closed journal.
            self._flush_devices()
            self.store.close()
        return self.history

    async def _say_bye(self, reason: str) -> None:
        """Goodbye to every device at once: a closing handshake waits for the device's answer, and
        ten thousand of them one after another would take minutes."""
        async def bye(session: Session) -> None:
            with contextlib.suppress(Exception):
                async with session.channel.send_lock:
                    await send_msg(session.channel, p.Bye(reason))
                await session.ws.close()

        await asyncio.gather(*(bye(s) for s in list(self.sessions.values())))

    def _over_capacity(self) -> str | None:
        """Why a new connection cannot be taken now (connections held, or still to say hello), if so."""
        if self._open[0] >= self.config.max_connections:
            return f"the server holds its maximum of {self.config.max_connections} connections; retry later"
        if self._open[1] >= self.config.max_pending_hellos:
            return "too many connections are still to say hello; retry later"
        return None

    def _admit(self, connection: ServerConnection, request: object) -> object:
        """Before the websocket upgrade: over capacity, answer HTTP 503 and keep nothing. A device
        retries a failed opening handshake with backoff, whereas an ``Error`` frame after the
        upgrade is a refusal it takes as final: a fleet reconnecting at once must not lose every
        device beyond the caps. Cheap, too: no websocket, no session, no error frame."""
        reason = self._over_capacity()
        if reason is None:
            return None
        self._note_refusal(reason)
        return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, reason + "\n")

    def _note_refusal(self, reason: str) -> None:
        """Count a connection turned away for capacity; logged at most every 10 s, not per connection."""
        self._refusals += 1
        now = time.monotonic()
        if now - self._refusals_logged >= 10.0:
            log.warning("turned away %d connections since the last report: %s", self._refusals, reason)
            self._refusals, self._refusals_logged = 0, now

    async def _handler(self, ws: ServerConnection) -> None:
        channel = Channel(ws, ServerSession(), self.limits)
        session: Session | None = None
        pending = True
        try:
            reason = self._over_capacity()  # a burst admitted together may overshoot: try again later
            self._open[0] += 1
            self._open[1] += 1
            if reason is not None:
                self._note_refusal(reason)
                await ws.close(1013, reason[:120])  # 1013: try again later (a device reconnects)
                return
            try:
                hello = await asyncio.wait_for(recv_msg(channel), timeout=self.config.hello_timeout_s)
            finally:
                self._open[1] -= 1
                pending = False
            hello_at = time.monotonic()
            if not isinstance(hello, p.Hello):
                raise p.ProtocolError("unexpected", f"first message must be hello, got {hello.TYPE}")
            session = await self._register(channel, hello)
            await self._serve_session(session, hello_at)
        except p.ProtocolError as exc:
            log.warning("closing %s: %s %s", session.device_id if session else ws.remote_address, exc.code, exc.message)
            with contextlib.suppress(Exception):
                await send_msg(ws, p.Error(exc.code, exc.message[:1024]))
                await ws.close(1008 if exc.code != "refused" else 1000, exc.code)
        except (ConnectionClosed, asyncio.TimeoutError):
            pass
        finally:
            self._open[0] -= 1
            if pending:
                self._open[1] -= 1
            if session is not None and self.sessions.get(session.device_id) is session:
                del self.sessions[session.device_id]
                await self._on_disconnect(session.device_id)
                self.on_event("disconnected", {"device": session.device_id})
                self._changed.set()

    async def _on_disconnect(self, device_id: str) -> None:
        rs = self.round
        if rs is None or not rs.expects(device_id):
            return
        if device_id in self.partial_uploads:
            # Cut mid-upload: still awaited for a while, to come back and resume.
            asyncio.get_running_loop().call_later(self.config.upload_resume_s, self._give_up_upload, device_id,
                                                  rs.round)
            return
        await self._gone(device_id)

    async def _gone(self, device_id: str) -> None:
        rs, ctx = self.round, self.ctx
        if rs is None or ctx is None:
            return
        phases = rs.on_gone(device_id)
        if phases:
            await self._dispatch(self.strategy.on_missing(device_id, phases, ctx))

    def _give_up_upload(self, device_id: str, round: int) -> None:
        """The device whose upload was cut has not come back in time: stop waiting for it."""
        rs = self.round
        if rs is not None and rs.round == round and device_id not in self.sessions:
            self.partial_uploads.pop(device_id, None)
            asyncio.ensure_future(self._gone(device_id))
            self._changed.set()

    def _authenticate(self, hello: p.Hello) -> int | None:
        """Check the hello's credential before anything else; return the enrolled sample count, if any.

        With ``require_credentials`` every device proves its own enrolled credential
        (:mod:`edge_sdk.credentials`): unknown, revoked, stale, forged or replayed proofs are
        refused before any model data is sent, and a device id can be taken only by its own
        credential. Otherwise the shared ``token`` (a lab setting) is compared in constant time.
        """
        if self.config.require_credentials:
            cred = self.store.credential(hello.device_id)
            if cred is None or cred["revoked"] is not None:
                raise p.ProtocolError("unauthorized", "no valid credential is enrolled for this device")
            try:
                verify_proof(hello.device_id, hello.token, cred["key"], self._replay,
                             max_skew_s=self.config.credential_skew_s)
            except CredentialError as exc:
                raise p.ProtocolError("unauthorized", str(exc)) from None
            return cred["samples"]
        if self.config.token and not hmac.compare_digest(hello.token.encode(), self.config.token.encode()):
            raise p.ProtocolError("unauthorized", "bad credentials")
        return None

    async def _register(self, channel: Channel, hello: p.Hello) -> Session:
        enrolled_samples = self._authenticate(hello)
        if not hello.device_id or len(hello.device_id) > 128:
            raise p.ProtocolError("malformed", "device_id must be 1-128 characters")
        check_hello_bounds(hello)
        plan = await self.shippable_plan(hello)
        old = self.sessions.get(hello.device_id)
        if old is not None:
            # A reconnect replaces the stale connection of the same device.
            asyncio.ensure_future(old.ws.close(1000, "replaced"))
        info = self._device_info(hello, plan)
        # Held while the device is connected: its declared rows live on in info (as arrays), not twice.
        kept = replace(hello, rows={}, row_bits={}) if hello.rows or hello.row_bits else hello
        session = Session(hello.device_id, channel, kept, plan, info, enrolled_samples)
        self.sessions[hello.device_id] = session
        profile = {
            "budget_bytes": hello.budget_bytes, "cores": hello.cores, "runtimes": list(hello.runtimes),
            "num_samples": hello.num_samples, "device_class": hello.device_class, "labels": dict(hello.labels),
            "rows": {k: len(v) for k, v in hello.rows.items()},
        }
        self._journal_device(hello.device_id, profile, plan)
        self.on_event("registered", {"device": hello.device_id, "role": plan.role, "split": plan.split})
        return session

    def _journal_device(self, device_id: str, profile: dict[str, object], plan: Plan) -> None:
        """Journal a registered device. The hellos taken in one turn of the event loop share one
        commit (:meth:`Store.record_devices`), written as soon as that turn's callbacks are done:
        a commit per hello was most of the server's own work per hello."""
        if not self._device_rows:
            asyncio.get_running_loop().call_soon(self._flush_devices)
        self._device_rows.append((device_id, profile, plan_summary(plan)))

    def _flush_devices(self) -> None:
        rows, self._device_rows = self._device_rows, []
        if rows:
            self.store.record_devices(rows)

    def _device_info(self, hello: p.Hello, plan: Plan) -> DeviceInfo:
        """What strategies see of a device. Declared rows are mapped from input columns to table entries."""
        rows: dict[str, np.ndarray] = {}
        for entry, column in getattr(self.model, "sparse_inputs", {}).items():
            values = hello.rows.get(str(column))
            if values is None:
                continue
            table_rows = self.global_state[entry].shape[0]
            if values and values[-1] >= table_rows:
                raise p.ProtocolError("malformed", f"hello.rows[{column}] names row {values[-1]} of a table with "
                                                   f"{table_rows} rows")
            rows[entry] = np.asarray(values, dtype=np.int64)
        # Private heat: one randomized-response bit per table row (never the true rows; FedSubAvg).
        bits: dict[str, bytes] = {}
        columns = {str(c): e for e, c in getattr(self.model, "sparse_inputs", {}).items()}
        for column, packed in hello.row_bits.items():
            entry = columns.get(column)
            if entry is None:
                raise p.ProtocolError("malformed", f"hello.row_bits[{column}] names no sparse input of the model")
            need = (self.global_state[entry].shape[0] + 7) // 8
            if len(packed) != need:
                raise p.ProtocolError("malformed", f"hello.row_bits[{column}] has {len(packed)} bytes; the table "
                                                   f"has {self.global_state[entry].shape[0]} rows ({need} bytes)")
            bits[entry] = bytes(packed)
        return DeviceInfo(
            device_id=hello.device_id, role=plan.role, split=plan.split, num_samples=hello.num_samples,
            device_class=hello.device_class, tags=MappingProxyType(dict(hello.labels)),
            runtimes=tuple(hello.runtimes), rows=MappingProxyType(rows),
            row_bits=MappingProxyType(bits), row_epsilon=float(hello.row_epsilon),
        )

    def plan_key(self, hello: p.Hello) -> tuple:
        """What a hello's plan depends on (:mod:`orchestrator.plancache`): equal keys, equal plans."""
        forced = hello.labels.get("force_split") if self.config.allow_forced_split else None
        return (self.config.model, self.config.planner_batch, hello.budget_bytes, hello.cores,
                device_backends(hello), hello.num_samples, tuple(sorted(self._planned_rows(hello).items())), forced)

    async def shippable_plan(self, hello: p.Hello) -> Plan:
        """The device's plan, whose training graph (ONNX Runtime backend) exports and verifies.

        Planned once per profile (:meth:`plan_key`): a hello whose profile was planned before
        takes the cached plan (or refusal) without planning or checking a graph again.

        A split whose graph the export check refuses (ResNet20's stem: a weight gradient 1e-3 off)
        is dropped from :attr:`graph_splits` and the device planned again, so it gets the largest
        split with a shippable graph; when none fits its budget it is refused with the reasons.
        Exports run in a worker thread (seconds, once per split; cached on disk). Authenticated
        hellos only: planning may export.
        """
        key = self.plan_key(hello)
        cached = self.plans.get(key)
        if isinstance(cached, str):
            raise p.ProtocolError("refused", cached)
        if cached is not None:
            return cached
        refused: list[str] = []
        while True:
            try:
                plan = self._plan(hello)
            except PlanError as exc:
                message = "; ".join([str(exc), *refused])
                self.plans.put(key, message)
                raise p.ProtocolError("refused", message) from None
            if plan.backend == "onnxruntime":
                reason = await asyncio.to_thread(self.train_graphs.refusal, self.model, plan.split)
                if reason is not None:
                    self._refuse_graph(plan.split, reason)
                    refused.append(f"split {plan.split}: {reason}")
                    continue
            self.plans.put(key, plan)
            return plan

    def _refuse_graph(self, split: int, reason: str) -> None:
        """Never plan an ONNX Runtime device at ``split`` again (its graph failed the export check)."""
        if split in self.graph_splits:
            self.graph_splits = self.graph_splits - {split}
            self.plans.clear()  # plans made with the split, and refusals made without it, are stale
            log.warning("training graph of split %d refused: %s", split, reason)
            self.on_event("train_graph_refused", {"split": split, "reason": reason[:512]})

    def _plan(self, hello: p.Hello) -> Plan:
        """The planner's choice for this budget, or a split the device asked for where allowed.

        ``labels["force_split"]`` is honoured only when the server's configuration allows it
        (``allow_forced_split``: emulation and tests, e.g. make a weak device train the whole model
        to show that it cannot); otherwise the planner decides.
        """
        batch = self.config.planner_batch
        rows = self._planned_rows(hello)
        forced = hello.labels.get("force_split")
        if forced is None or not self.config.allow_forced_split:
            return plan_split(self.cost, hello.budget_bytes, batch, local_samples=hello.num_samples,
                              backends=device_backends(hello), graph_splits=self.graph_splits, rows=rows)
        try:
            k = int(forced)
        except ValueError:
            raise p.ProtocolError("malformed", f"force_split must be an integer, not {forced!r}") from None
        if not 0 <= k < len(self.model):
            raise p.ProtocolError("malformed", f"force_split {k} outside [0, {len(self.model)})")
        chunks = [(0, k)] if k > 0 else []
        backend = device_backends(hello)[0]
        if backend == "onnxruntime" and k not in self.graph_splits:
            raise p.ProtocolError("refused", f"split {k} of {self.cost.model} has no training graph and the device "
                                             "has no torch")
        footprint = self.cost.footprint(k, batch, runtime_bytes=runtime_memory().for_backend(backend), chunks=chunks,
                                        local_samples=hello.num_samples, rows=rows)
        capacity = self.cost.capacity(k, batch)
        return Plan(
            model=self.cost.model, split=k, role=RoleThresholds().role(k, capacity), chunks=chunks,
            footprint_bytes=footprint.total, capacity=capacity, budget_bytes=hello.budget_bytes, batch_size=batch,
            num_blocks=len(self.cost), trainable_params=self.cost.trainable_params(k), footprint=footprint,
            backend=backend, rows={e: n for e, n in rows.items() if any(t.entry == e and t.block >= k
                                                                         for t in self.cost.tables)},
        )

    def _planned_rows(self, hello: p.Hello) -> dict[str, int]:
        """Rows per sparse table the device will hold, for a strategy that sends row selections
        (``selects_rows``, FedSubAvg): the rows it declared. Empty (whole tables) otherwise, since
        a strategy that sends tails sends every row."""
        if not getattr(self.strategy, "selects_rows", False):
            return {}
        out: dict[str, int] = {}
        for entry, column in getattr(self.model, "sparse_inputs", {}).items():
            values = hello.rows.get(str(column))
            if values is not None:
                out[entry] = min(len(values), int(self.global_state[entry].shape[0]))
        return out

    async def _serve_session(self, session: Session, hello_at: float | None = None) -> None:
        plan = session.plan
        welcome = p.Welcome(
            device_id=session.device_id, role=plan.role, split=plan.split, num_blocks=len(self.model),
            chunks=[tuple(c) for c in plan.chunks], model=self.config.model, model_version=self.start_round - 1,
            batch_size=self.config.batch_size, local_steps=self.config.local_steps,
            config={"lr": self.config.lr_at(self.start_round), "momentum": self.config.momentum, "weight_decay": self.config.weight_decay,
                    "footprint_bytes": plan.footprint_bytes},
        )
        async with session.channel.send_lock:
            await send_msg(session.channel, welcome)
        if hello_at is not None:  # hello read to welcome written: planning, journaling, queueing
            self.on_event("welcomed", {"device": session.device_id, "latency_s": time.monotonic() - hello_at})
        # A device that drops mid-round and comes back resumes that round (docs/architecture.md, "Qualities and how they are kept").
        rs = self.round
        if rs is not None and session.hello.resume_round == rs.round and rs.expects(session.device_id):
            rs.on_back(session.device_id)
            partial = self.partial_uploads.pop(session.device_id, None)
            if partial is not None and partial.report.round == rs.round:
                await self._resume_upload(session, partial)
            else:
                for work in self.work.get(session.device_id, {}).values():
                    if rs.expects(session.device_id, work.wire.phase):
                        await self._send_instruction(session, work)
        self._changed.set()
        while True:
            msg = await recv_msg(session.channel)
            if isinstance(msg, p.Fetch):
                await self._on_fetch(session, msg)
            elif isinstance(msg, p.Report):
                await self._on_report(session, msg)
            elif isinstance(msg, p.Bye):
                return
            else:
                raise p.ProtocolError("unexpected", f"a device may not send {msg.TYPE} here")

    # -- payloads -------------------------------------------------------------------------
    async def _on_fetch(self, session: Session, msg: p.Fetch) -> None:
        payload = self.payloads.get(msg.payload_id)
        rs = self.round
        if payload is None or rs is None or msg.round != rs.round or not rs.expects(session.device_id):
            async with session.channel.send_lock:
                await send_msg(session.channel, p.Ack(msg.round, False, "round closed"))
            return
        if not 0 <= msg.offset <= len(payload.data):
            raise p.ProtocolError("malformed", f"offset {msg.offset} outside the payload of {len(payload.data)} bytes")
        tid = f"{payload.kind}-{rs.round}-{msg.payload_id[:48]}-{session.device_id}"
        # A device that stops reading cannot hold this connection's sender (and the round) for longer
        # than its payload takes at the slowest pace allowed.
        allowed = self.pace.stall_s + (len(payload.data) - msg.offset) / self.pace.min_rate
        async with session.channel.send_lock:
            try:
                await asyncio.wait_for(
                    send_payload(session.channel, payload.data, transfer_id=tid, kind=payload.kind,
                                 meta={**payload.meta, "round": rs.round}, frame_size=self.config.frame_size,
                                 offset=msg.offset, sha256=payload.sha256),
                    timeout=allowed)
            except asyncio.TimeoutError:
                raise p.ProtocolError("timeout", f"{msg.payload_id[:64]!r} not taken within {allowed:.0f} s") from None
        sent = len(payload.data) - msg.offset
        self._bytes[0] += sent
        self.on_event("sent", {"device": session.device_id, "round": rs.round, "kind": payload.kind,
                               "payload": msg.payload_id, "bytes": sent})

    def _prepare(self, instructions: Sequence[Instruction]) -> list[tuple[Session | None, Instruction, Work | None]]:
        """Cut, encode and hash every payload the instructions need that this round does not hold yet
        (runs in a worker thread: ONNX export and encoding are CPU work). A device gone gives
        ``(None, ins, None)``; one whose budget cannot hold the instruction ``(session, ins, None)``."""
        out: list[tuple[Session | None, Instruction, Work | None]] = []
        rs = self.round
        assert rs is not None
        names_by_split: dict[int, tuple[str, ...]] = {}
        for ins in instructions:
            session = self.sessions.get(ins.device_id)
            if session is None:
                out.append((None, ins, None))
                continue
            selection = ins.selection if ins.selection is not None else Selection.tail(session.plan.split)
            if not 0 <= selection.split < len(self.model):
                raise ValueError(f"strategy {self.strategy.name}: split {selection.split} outside [0, {len(self.model)})")
            ranges = chunk_ranges(session.plan.chunks, selection.split)
            rows = selection_rows(selection)
            width = selection_width(selection, ins.config)
            if width is not None:
                # A channel slice (width reduction): the model built at that width, trained with torch.
                check_width_shapes(self.config.model, selection, width)
                if "torch" not in session.hello.runtimes or not self._fits(session, selection.split, ranges, rows,
                                                                             width=width):
                    out.append((session, ins, None))
                    continue
            elif ((selection.split < session.plan.split or exceeds_rows(session.plan, rows, self.cost, selection.split))
                    and not self._fits(session, selection.split, ranges, rows)):
                out.append((session, ins, None))  # never asked: the device could not hold that much
                continue
            chunk_ids = []
            for a, b in ranges:
                cid, data = self.cache.get_or_export(self.model, self.version, a, b)
                if cid not in self.payloads:
                    self.payloads[cid] = Payload("chunk", data, p.sha256_hex(data), {"chunk_id": cid, "start": a, "stop": b})
                chunk_ids.append(cid)
            names = names_by_split.get(selection.split)
            if names is None:
                names = names_by_split[selection.split] = tuple(self.model.state_names(selection.split))
            model_id = f"model-{self.version}-{selection.key()}"
            if model_id not in self.payloads:
                data = p.encode_tensors(selection.cut(self.global_state, names))
                self.payloads[model_id] = Payload("model", data, p.sha256_hex(data),
                                                  {"split": selection.split, "selection": selection.kind,
                                                   "version": self.version})
            broadcast_id = ""
            if ins.broadcast is not None:
                kept = self._broadcast_ids.get(id(ins.broadcast))
                if kept is None:
                    broadcast_id = f"broadcast-{rs.round}-{len(self._broadcast_ids)}"
                    data = p.encode_tensors(dict(ins.broadcast.tensors))
                    self.payloads[broadcast_id] = Payload("broadcast", data, p.sha256_hex(data))
                    self._broadcast_ids[id(ins.broadcast)] = (ins.broadcast, broadcast_id)
                else:
                    broadcast_id = kept[1]
            extra: dict[str, p.Scalar] = {}
            if session.plan.backend == "onnxruntime" and width is None:
                graph_id = self._train_graph(selection)
                if graph_id is None:  # a strategy's longer tail whose graph is refused: not asked
                    out.append((session, ins, None))
                    continue
                extra[p.TRAIN_GRAPH_KEY] = graph_id
            wire = p.Instruction(
                round=rs.round, phase=ins.phase, model_version=rs.round - 1, split=selection.split,
                chunk_ids=chunk_ids, model_id=model_id, selection=selection.kind, broadcast_id=broadcast_id,
                local_steps=self.config.local_steps if ins.local_steps is None else int(ins.local_steps),
                lr=self.config.lr_at(rs.round) if ins.lr is None else float(ins.lr), deadline_s=0.0,
                config={"seed": self.config.seed * 100_003 + rs.round, **dict(ins.config), **extra},
            )
            out.append((session, ins, Work(ins, selection, wire, names)))
        return out

    def _fits(self, session: Session, split: int, chunks: Sequence[tuple[int, int]],
              rows: Mapping[str, int] | None = None, width: float = 1.0) -> bool:
        """Whether a longer tail than the plan's, or more table rows, fits the device's budget (the
        server enforces budgets: a strategy may ask for more, e.g. FedAvg for the whole model, but a
        device is never sent more than it can hold). ``rows``: a row selection's tables count only
        its rows (:func:`selection_rows`). ``width``: a channel selection's model is counted as built
        at that width (profiles.planner.width_cost)."""
        cost = self.cost if width == 1.0 else width_cost(self.config.model, width)
        footprint = cost.footprint(split, self.config.planner_batch, runtime_bytes=runtime_memory().training,
                                        chunks=chunks, local_samples=session.hello.num_samples, rows=rows)
        if footprint.total <= session.hello.budget_bytes:
            return True
        self.on_event("over_budget", {"device": session.device_id, "split": split, "planned_split": session.plan.split,
                                      "footprint_bytes": footprint.total, "budget_bytes": session.hello.budget_bytes})
        return False

    def _train_graph(self, selection: Selection) -> str | None:
        """The payload id of the training graph for ``selection`` (exported and verified on first use),
        or None when the export check refuses it (the round goes on without that device)."""
        if selection.kind != "tail":
            raise ValueError(f"strategy {self.strategy.name}: a {selection.kind} selection at split {selection.split} "
                             "has no training graph for a device on the ONNX Runtime backend")
        if selection.split not in self.graph_splits:
            return None
        try:
            gid, data = self.train_graphs.get_or_export(self.model, selection.split)
        except ExportError as exc:
            self._refuse_graph(selection.split, str(exc))
            return None
        if gid not in self.payloads:
            self.payloads[gid] = Payload("train_graph", data, p.sha256_hex(data), {"split": selection.split})
        return gid

    async def _dispatch(self, instructions: Iterable[Instruction], *, issued: bool = False) -> None:
        """Send the strategy's instructions (payloads prepared first); a device gone meanwhile is missing.

        Every instruction is entered in the round's bookkeeping before the first ``await``, so the
        round cannot be seen as settled while its follow-ups are being prepared.
        """
        batch = list(instructions)
        rs, ctx = self.round, self.ctx
        if not batch or rs is None or ctx is None:
            return
        if not issued:
            for ins in batch:
                rs.issue(ins.device_id, ins.phase)
        prepared = await asyncio.to_thread(self._prepare, batch)
        missing: dict[str, list[str]] = {}
        for session, ins, work in prepared:
            if session is not None and work is None:
                rs.on_skipped(ins.device_id, ins.phase)
                missing.setdefault(ins.device_id, []).append(ins.phase)
                continue
            if session is None or work is None or self.sessions.get(ins.device_id) is not session:
                # Gone before or while its payloads were prepared. If its disconnect already told
                # the strategy (Orchestrator._gone), on_gone finds nothing open and it is not told twice.
                if ins.phase in rs.on_gone(ins.device_id):
                    missing.setdefault(ins.device_id, []).append(ins.phase)
                continue
            self.work.setdefault(ins.device_id, {})[ins.phase] = work
            try:
                await self._send_instruction(session, work)
            except (ConnectionClosed, p.ProtocolError):
                # The connection closed (or is closing: the device said bye or erred) since it was
                # looked up; its handler's cleanup tells the strategy, unless it already has.
                if ins.phase in rs.on_gone(ins.device_id):
                    missing.setdefault(ins.device_id, []).append(ins.phase)
        self._changed.set()
        for device_id, phases in missing.items():
            await self._dispatch(self.strategy.on_missing(device_id, phases, ctx))

    async def _send_instruction(self, session: Session, work: Work) -> None:
        rs = self.round
        assert rs is not None
        wire = p.Instruction(**{**work.wire.__dict__, "deadline_s": max(0.0, rs.deadline - time.monotonic())})
        async with session.channel.send_lock:
            await send_msg(session.channel, wire)

    # -- reports --------------------------------------------------------------------------
    async def _on_report(self, session: Session, msg: p.Report) -> None:
        if not msg.transfer_id:
            await self._take_report(session, msg, {})
            return
        begin = await recv_msg(session.channel)
        if not isinstance(begin, p.TransferBegin) or begin.transfer_id != msg.transfer_id or begin.kind != "update":
            raise p.ProtocolError("unexpected", "a report with tensors must be followed by their transfer")
        bound = self._update_bound(session, msg.phase)
        if begin.total_size > bound:
            # Refused at its first message, before anything is allocated for it.
            raise p.ProtocolError("too_large", f"an update of {begin.total_size} bytes, but deltas of what this "
                                               f"device was sent take at most {bound}")
        await self._receive_update(session, msg, begin, p.IncomingTransfer(begin, self.limits, hash_in_feed=False))

    def _update_bound(self, session: Session, phase: str) -> int:
        """The largest update a device may send for an instruction: its deltas have the names, shapes
        and rows of the model payload it was sent, so they encode to at most that payload's size
        (plus headers); nothing larger is ever received. A late report (its round closed) is bounded
        by the device's planned tail, so that it can still be read and answered as late."""
        work = self.work.get(session.device_id, {}).get(phase)
        payload = None if work is None else self.payloads.get(work.wire.model_id)
        if payload is not None:
            return len(payload.data) + (64 << 10)
        names = self.model.state_names(session.plan.split)
        return sum(self.global_state[n].nbytes for n in names) + 256 * len(names) + (64 << 10)

    async def _resume_upload(self, session: Session, partial: PartialUpload) -> None:
        """Ask a reconnected device for the rest of the update it was sending when its connection dropped."""
        transfer_id, offset = partial.report.transfer_id, partial.incoming.offset
        async with session.channel.send_lock:
            await send_msg(session.channel, p.Resume(transfer_id, offset))
        begin = await recv_msg(session.channel)
        if not isinstance(begin, p.TransferBegin) or begin.transfer_id != transfer_id:
            raise p.ProtocolError("unexpected", f"resume of {transfer_id[:64]!r} must be answered by its transfer")
        self.on_event("upload_resumed", {"device": session.device_id, "round": partial.report.round, "offset": offset,
                                         "total": partial.incoming.total_size})
        await self._receive_update(session, partial.report, begin, partial.incoming)

    async def _receive_update(self, session: Session, msg: p.Report, begin: p.TransferBegin,
                              incoming: p.IncomingTransfer) -> None:
        """Receive a report's tensors (``begin`` starts or resumes ``incoming``), then take the report."""
        try:
            payload = await recv_payload(session.channel, begin, self.limits, incoming=incoming, pace=self.pace)
        except ConnectionClosed:
            rs = self.round
            if rs is not None and msg.round == rs.round and rs.expects(session.device_id, msg.phase):
                self.partial_uploads[session.device_id] = PartialUpload(msg, incoming)
                self.on_event("upload_cut", {"device": session.device_id, "round": msg.round,
                                             "offset": incoming.offset, "total": incoming.total_size})
            raise
        self._bytes[1] += len(payload)
        await self._take_report(session, msg, p.decode_tensors(payload, self.limits))

    async def _take_report(self, session: Session, msg: p.Report, tensors: dict) -> None:
        """Check a report against the instruction it answers, hand it to the strategy, ack, dispatch follow-ups."""
        rs, ctx = self.round, self.ctx
        work = self.work.get(session.device_id, {}).get(msg.phase)
        if rs is None or ctx is None or msg.round != rs.round or work is None \
                or not rs.expects(session.device_id, msg.phase):
            await self._ack(session, p.Ack(msg.round, False, "late: the round is closed", msg.phase))
            self.on_event("late", {"device": session.device_id, "round": msg.round, "phase": msg.phase})
            return
        try:
            self._check_report(session, msg, work, tensors)
        except p.ProtocolError as exc:
            rs.on_report(session.device_id, msg.phase, False)
            self.store.record_update(rs.round, session.device_id, {"accepted": False, "reason": exc.message,
                                                                   "closed": True}, phase=msg.phase)
            self.on_event("rejected", {"device": session.device_id, "round": rs.round, "reason": exc.message})
            self._changed.set()
            raise
        # Bounded influence: the weight is at most the sample count registered for the device.
        samples = min(msg.num_samples, self._registered_samples(session))
        tensors, reason = self._bound_norm(tensors, f"{work.selection.kind}-{work.selection.split}")
        report = DeviceReport(
            device_id=session.device_id, round=rs.round, phase=msg.phase, role=session.plan.role,
            num_samples=samples, trained=tuple(msg.trained), metrics=MappingProxyType(dict(msg.metrics)),
            tensors=MappingProxyType(tensors), selection=work.selection,
        )
        follow: Sequence[Instruction] = ()
        try:
            if reason is not None:
                raise Refused(reason)
            follow = self.strategy.on_report(report, ctx)
            accepted, reason = True, ""
        except Refused as exc:
            accepted, reason = False, exc.reason
            log.info("refused %s's %s report of round %d: %s", session.device_id, msg.phase, rs.round, reason)
        rs.on_report(session.device_id, msg.phase, accepted)
        for ins in follow:  # entered before any await: the round is not settled while they are prepared
            rs.issue(ins.device_id, ins.phase)
        self.store.record_update(rs.round, session.device_id, {**report_info(report), "accepted": accepted,
                                                               "reason": reason}, phase=msg.phase)
        await self._ack(session, p.Ack(rs.round, accepted, reason, msg.phase))
        self.on_event("update", {"device": session.device_id, "round": rs.round, "role": session.plan.role,
                                 "phase": msg.phase, "accepted": accepted, "reason": reason,
                                 "reported": rs.num_reported(), "selected": rs.num_selected})
        await self._dispatch(follow, issued=True)
        self._changed.set()

    def _registered_samples(self, session: Session) -> int:
        """The sample count a device's reports may weigh: what it declared when it registered,
        capped by the operator's policy (``max_device_samples``, and the count fixed at its
        enrollment), never what an update claims."""
        limit = self.config.max_device_samples
        if session.enrolled_samples is not None:
            limit = min(limit, session.enrolled_samples)
        return min(session.hello.num_samples, limit)

    def _bound_norm(self, tensors: dict, peers: str) -> tuple[dict, str | None]:
        """Optional norm bound (``norm_bound`` > 0): an update whose L2 norm exceeds ``norm_bound``
        times the median norm of recent accepted updates of the same selection (``peers``) is
        clipped to that norm, or refused (``norm_bound_action``). Returns the tensors to fold and a
        refusal reason, if any."""
        if not tensors:
            return tensors, None
        norm = math.sqrt(sum(float(np.sum(np.square(np.asarray(t.values if isinstance(t, p.RowSparse) else t,
                                                                  dtype=np.float64))))
                             for t in tensors.values()
                             if (t.values if isinstance(t, p.RowSparse) else t).dtype.kind == "f"))
        bound = self.config.norm_bound
        norms = self._norms.setdefault(peers, deque(maxlen=100))
        recent = sorted(norms)
        limit = bound * recent[len(recent) // 2] if bound > 0 and len(recent) >= 3 else math.inf
        if norm <= limit:
            norms.append(norm)
            return tensors, None
        if self.config.norm_bound_action == "reject":
            return tensors, f"update norm {norm:.3g} exceeds {bound:g} x the median of recent updates ({limit:.3g})"
        scale = limit / norm
        clipped = {n: (p.RowSparse(t.indices, t.values * np.asarray(scale, t.values.dtype), t.num_rows)
                       if isinstance(t, p.RowSparse) else (t * np.asarray(scale, t.dtype) if t.dtype.kind == "f" else t))
                   for n, t in tensors.items()}
        norms.append(limit)
        return clipped, None

    def _check_report(self, session: Session, msg: p.Report, work: Work, tensors: dict) -> None:
        """What the server guarantees every strategy: the tensors are deltas of exactly what was sent
        (finite: checked on decode), with a positive sample count (whose weight is capped by
        :meth:`_registered_samples`)."""
        if msg.num_samples <= 0:
            raise p.ProtocolError("malformed", f"implausible sample count {msg.num_samples}")
        if msg.phase in TENSOR_PHASES or tensors:
            expected = (work.selection.split, len(self.model))
            if tuple(msg.trained) != expected:
                raise p.ProtocolError("malformed", f"trained {tuple(msg.trained)} but the instruction sent {expected}")
            reason = work.selection.check(tensors, self.global_state, work.names)
            if reason is not None:
                raise p.ProtocolError("malformed", f"report rejected: {reason}")

    async def _ack(self, session: Session, ack: p.Ack) -> None:
        async with session.channel.send_lock:
            await send_msg(session.channel, ack)

    # -- rounds ---------------------------------------------------------------------------
    async def _wait_for_devices(self, needed: int) -> None:
        deadline = time.monotonic() + self.config.wait_devices_s
        while self._idle_count() < needed:  # woken by every hello: O(1) between rounds
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {self._idle_count()} of {needed} devices were ready in time")
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=0.5)

    def _idle(self) -> list[str]:
        rs = self.round
        return [d for d in self.sessions if rs is None or not rs.expects(d)]

    def _idle_count(self) -> int:
        """``len(self._idle())``, without a scan of the registry while no round is open."""
        return len(self.sessions) if self.round is None else len(self._idle())

    async def _rounds(self) -> None:
        # The first round waits for min_devices to connect; later ones go ahead with whoever is
        # idle, so a fleet that loses a device keeps training.
        # A round whose result fails its checks is not committed and runs again from the last good
        # state (with another sample of devices); after round_retries failures it is journaled as
        # failed, the model unchanged, and training goes on.
        r, attempt = self.start_round, 0
        while r <= self.config.rounds:
            await self._wait_for_devices(self.config.min_devices if r == self.start_round and not attempt else 1)
            if self._start is not None:
                await self._start.wait()
            if await self._run_round(r, attempt=attempt, last_try=attempt >= self.config.round_retries):
                r, attempt = r + 1, 0
            else:
                attempt += 1

    async def _run_round(self, r: int, *, attempt: int = 0, last_try: bool = True) -> bool:
        """Run round ``r``; False if its result failed the checks and it should run again."""
        t0, cpu0 = time.monotonic(), time.process_time()
        self._load_global_into_model()
        self.version = state_version(self.global_state)
        self.payloads, self._broadcast_ids, self.work = {}, {}, {}
        self._bytes = [0, 0]
        rs = RoundState(r, deadline=time.monotonic() + self.config.deadline_s, quorum=self.config.quorum)
        frozen = MappingProxyType(self.global_state)
        ctx = RoundContext(
            round=r, global_state=frozen, devices=MappingProxyType({d: self.sessions[d].info for d in self._idle()}),
            state=rs, blocks=tuple(self.model.block_names), fraction=self.config.fraction,
            seed=self.config.seed + 7919 * attempt,
        )
        self.round, self.ctx = rs, ctx
        instructions = list(self.strategy.configure(ctx))
        self.store.begin_round(r, sorted({i.device_id for i in instructions}))
        self.on_event("round_start", {"round": r, "selected": len({i.device_id for i in instructions})})
        await self._dispatch(instructions)
        while not (rs.settled() or time.monotonic() >= rs.deadline or self.strategy.round_complete(ctx)):
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=0.25)
        result = self.strategy.aggregate(ctx)
        candidate = {k: np.asarray(v) for k, v in result.state.items()}
        failure = await asyncio.to_thread(self._check_state, candidate)
        if failure is None:
            self.global_state = candidate
        else:
            log.warning("round %d (attempt %d) not committed: %s", r, attempt + 1, failure)
            self.on_event("round_failed", {"round": r, "attempt": attempt + 1, "reason": failure,
                                           "devices": list(result.devices)})
        self.round = self.ctx = None
        self.payloads, self._broadcast_ids, self.work = {}, {}, {}
        self.partial_uploads.clear()
        reported = rs.reported()
        metrics: dict[str, object] = {
            "round": r, "selected": len(rs.selected), "reported": len(reported), "rejected": len(rs.refused()),
            "stragglers": sorted(rs.stragglers()), "over_budget": sorted(rs.skipped()), "roles": role_counts(self.sessions, rs.reported("train") or reported),
            "bytes_sent": self._bytes[0], "bytes_received": self._bytes[1],
            **{k: v for k, v in result.extra.items() if isinstance(v, (int, float, str, bool, list, dict))},
            "attempt": attempt + 1, **({"failed": failure} if failure else {}),
        }
        if failure is not None and not last_try:
            return False
        eval_s = eval_cpu = 0.0
        if self.config.eval_every and (r % self.config.eval_every == 0 or r == self.config.rounds):
            te, tc = time.monotonic(), time.process_time()
            self._load_global_into_model()
            metrics.update(await asyncio.to_thread(self.evaluator.evaluate, self.model))
            eval_s, eval_cpu = time.monotonic() - te, time.process_time() - tc
        metrics.update({
            "round_wall_s": time.monotonic() - t0,
            "eval_s": eval_s,
            # The orchestrator's own work this round (CPU of this process: exporting and encoding
            # payloads, streaming, decoding and folding reports, aggregating, checkpointing), with
            # evaluation left out; waiting on devices costs none.
            "server_cpu_s": time.process_time() - cpu0 - eval_cpu,
        })
        self.store.complete_round(r, self.global_state, metrics)
        # Chunks of past versions are never asked for again: the store on disk keeps a byte budget.
        await asyncio.to_thread(self.cache.prune_disk, self.config.chunk_disk_bytes)
        self.history.append(metrics)
        self.on_event("round_end", metrics)
        return True

    def _check_state(self, state: dict[str, np.ndarray]) -> str | None:
        """None if ``state`` may become the global model, else why not: every value finite, and
        the frozen chunks the connected devices will need export and verify against torch (they
        are then cached for the next round). Checked before the checkpoint is written, so a
        resumed server never starts from a state that cannot be served."""
        for name, value in state.items():
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                return f"non-finite values in {name}"
        ranges = sorted({(int(a), int(b)) for s in list(self.sessions.values()) for a, b in s.plan.chunks})
        if not ranges or not getattr(self.strategy, "sends_chunks", True):  # width reduction sends none
            return None
        self.model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
        self.model.eval()
        version = state_version(state)
        try:
            for a, b in ranges:
                self.cache.get_or_export(self.model, version, a, b)
        except ExportError as exc:
            return f"the frozen chunks of the new model fail their export check: {exc}"
        return None


#: What a hello may declare (its fields are journaled and planned against, so each is bounded).
MAX_BUDGET_BYTES = 1 << 40  # 1 TiB: more is no device's app budget
MAX_LABELS, MAX_LABEL_CHARS = 32, 256
MAX_RUNTIMES = 8


def check_hello_bounds(hello: p.Hello) -> None:
    """Refuse a hello whose declarations no device makes (a budget of 0 or of petabytes, kilobytes
    of labels), before it is planned or journaled."""
    if not 0 < hello.budget_bytes <= MAX_BUDGET_BYTES:
        raise p.ProtocolError("refused", f"budget of {hello.budget_bytes} bytes is outside (0, {MAX_BUDGET_BYTES}]")
    if hello.num_samples < 1:
        raise p.ProtocolError("refused", "a device without local samples has nothing to train on")
    if len(hello.labels) > MAX_LABELS or any(len(k) + len(v) > MAX_LABEL_CHARS for k, v in hello.labels.items()):
        raise p.ProtocolError("malformed", f"at most {MAX_LABELS} labels of at most {MAX_LABEL_CHARS} characters")
    if len(hello.runtimes) > MAX_RUNTIMES or any(len(r) > 64 for r in hello.runtimes):
        raise p.ProtocolError("malformed", f"at most {MAX_RUNTIMES} runtimes of at most 64 characters")


def selection_rows(selection: Selection) -> dict[str, int]:
    """Rows per table a selection sends (empty for whole tables), for the budget check."""
    return {name: len(idx) for name, idx in selection.rows.items()} if selection.kind == "rows" else {}


def selection_width(selection: Selection, config: Mapping[str, object]) -> float | None:
    """A channel selection's width ratio (``config["width"]``, width reduction), None for other
    selections; a channel selection without a valid one is counted at full width."""
    if selection.kind != "channels":
        return None
    w = config.get("width", 1.0)
    ok = isinstance(w, (int, float)) and not isinstance(w, bool) and 0.0 < float(w) <= 1.0
    return float(w) if ok else 1.0


def check_width_shapes(model: str, selection: Selection, width: float) -> None:
    """A strategy's channel selection at ``width`` < 1 must cut the shapes of the model built at that
    width (what the device builds, and what the budget check counted)."""
    if width == 1.0:
        return
    from edge_sdk.models.zoo import width_shapes

    shapes = width_shapes(model, width)
    wrong = sorted(n for n, s in selection.channels.items() if shapes.get(n) != tuple(s))
    wrong += sorted(n for n, s in shapes.items() if s and n not in selection.channels)  # scalars go whole
    if wrong:
        raise ValueError(f"a channel selection at width {width} must cut {model} to its shapes at that width; "
                         f"{wrong[:3]} differ")


def exceeds_rows(plan: Plan, rows: Mapping[str, int], cost: ModelCost, split: int) -> bool:
    """Whether a selection sends more of a trained table than the plan counted (plans count a
    row-selecting strategy's devices for their declared rows only)."""
    if not plan.rows:
        return False
    for t in cost.tables:
        if t.block >= split and rows.get(t.entry, t.rows) > plan.rows.get(t.entry, t.rows):
            return True
    return False


def chunk_ranges(planned: Sequence[Sequence[int]], split: int) -> list[tuple[int, int]]:
    """The frozen chunks of blocks ``[0, split)``: the plan's chunks when the instruction keeps the
    planned split, else the plan's chunks cut at ``split`` (a strategy asked for a longer tail)."""
    out = []
    for a, b in planned:
        if a >= split:
            break
        out.append((int(a), int(min(b, split))))
    if split > 0 and (not out or out[-1][1] < split):
        out.append((out[-1][1] if out else 0, split))
    return out


def plan_summary(plan: Plan) -> dict[str, object]:
    return {"role": plan.role, "split": plan.split, "chunks": [list(c) for c in plan.chunks],
            "footprint_bytes": plan.footprint_bytes, "capacity": plan.capacity, "backend": plan.backend}


def report_info(r: DeviceReport) -> dict[str, object]:
    return {"phase": r.phase, "role": r.role, "trained": list(r.trained), "num_samples": r.num_samples,
            "loss_before": r.metrics.get("loss_before"), "loss_after": r.metrics.get("loss_after"),
            "selection": r.selection.kind, "metrics": dict(r.metrics)}


def role_counts(sessions: dict[str, Session], reported: set[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for d in reported:
        s = sessions.get(d)
        role = s.plan.role if s else "gone"
        counts[role] = counts.get(role, 0) + 1
    return counts
