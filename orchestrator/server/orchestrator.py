"""The orchestrator: an asyncio websockets server that plans devices and carries out the strategy's rounds.

This module does the I/O and wires the parts, each one job (docs/architecture.md, "The server"):
admission and identity (:mod:`orchestrator.server.admission`), planning, the one owner of budget
arithmetic (:mod:`orchestrator.server.planning` over :mod:`profiles.planner`), payload preparation and
caching (:mod:`orchestrator.server.payloads`), report intake, from an upload's first byte to the fold
(:mod:`orchestrator.aggregation.intake`, assembled here once by :mod:`orchestrator.aggregation.assembly`,
which also hears what a device says beyond fetches and reports), and the round loop that drives the
strategy (:mod:`orchestrator.server.roundloop`). The parts share the records of :mod:`orchestrator.parts`.
The session state machine (:mod:`edge_sdk.protocol.session`) checks every message against the
conversation so far. The server has no mode: secure aggregation and differential privacy are parts of
its report intake, and the web pages (``--web``) a view of it (:mod:`orchestrator.views.web`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from edge_sdk import protocol as p
from edge_sdk.memory import tune_allocator
from edge_sdk.models import LayeredModel, build_model
from edge_sdk.protocol.session import ServerSession
from edge_sdk.references import load_reference
from edge_sdk.transport import Channel, Pace, recv_msg, send_msg, send_payload, server_tls, ws_options
from exporters.cache import ChunkCache
from exporters.train_export import TrainGraphCache
from orchestrator.aggregation.assembly import IntakeServices, assemble_intake
from orchestrator.aggregation.intake import ReportIntake
from orchestrator.aggregation.privacy import PrivacyBudgetSpent
from orchestrator.aggregation.reference import ReferenceUpdate
from orchestrator.config import ServerConfig
from orchestrator.parts import Session, Traffic, Work
from orchestrator.rounds import ROUND_DRIVERS, RoundState
from orchestrator.server.admission import Admission, device_info, journaled_id, model_context
from orchestrator.server.evaluate import Evaluator
from orchestrator.server.heap import RoundHeap
from orchestrator.server.limits import raise_fd_limit
from orchestrator.server.payloads import FetchLimits, Payloads
from orchestrator.server.plancache import PlanCache
from orchestrator.server.planning import Planning
from orchestrator.server.resume import start_run
from orchestrator.server.revocation import Revocations
from orchestrator.server.roundloop import RoundLoop
from orchestrator.server.uploads import Uploads
from orchestrator.store import Store
from orchestrator.strategies import Strategy, make_strategy
from profiles.accounting import measure_model
from profiles.planner import Plan

if TYPE_CHECKING:
    from orchestrator.views.web import WebOptions, WebSite

__all__ = ["Orchestrator", "Session"]

log = logging.getLogger("edgetrain.server")


class Orchestrator:
    """Registers devices, runs ``config.rounds`` rounds as the strategy directs, persists each one."""

    def __init__(self, config: ServerConfig, *, on_event: Callable[[str, dict], None] | None = None,
                 strategy: Strategy | None = None, web: WebOptions | None = None) -> None:
        """``strategy``: built already (else from ``config``); ``web``: the pages' options (``config.web``)."""
        self.config = config
        self.on_event = on_event or (lambda kind, data: None)
        self.web: WebSite | None = None  # the pages of --web, made last (they read a view of the whole server)
        emit = self._emit  # the parts report through on_event as it is at the time (tests replace it)
        # Frames this side sends are config.frame_size; it accepts any peer's up to the default bound.
        self.limits = p.Limits(max_frame_bytes=max(config.frame_size, p.DEFAULT_LIMITS.max_frame_bytes))
        # The architecture every part reads (block names, state names, shapes). Nobody loads weights
        # into it: exports and evaluation each run on a model built for them (payloads.model_at).
        self.model: LayeredModel = build_model(config.model, seed=config.seed)
        self.model.eval()
        self.strategy = strategy if strategy is not None else make_strategy(config.strategy, **config.strategy_options)
        self.store = Store(config.store_dir, keep=config.keep_checkpoints)
        self.cache = ChunkCache(max_bytes=256 << 20, directory=config.store_dir / "chunks")
        self.cost = measure_model(self.model)  # measured once; every hello is planned against it
        # Training graphs for devices on a graph runtime: exported once per split (the weights are
        # inputs), verified against torch, kept under the store.
        self.train_graphs = TrainGraphCache(config.train_graph_dir or config.store_dir / "train_graphs")
        self.sessions: dict[str, Session] = {}
        sparse = getattr(self.model, "sparse_inputs", {})  # table entry -> the input column indexing it
        self.hello_context = model_context(sparse, self.model.state_dict())
        self.planning = Planning(config, self.model, self.cost, self.train_graphs,
                                 {e: self.hello_context.shapes[e][0] for e in sparse},
                                 selects_rows=self.strategy.selects_rows, emit=emit)
        self.admission = Admission(config, self.store)
        self.payloads = Payloads(config, self.model, self.strategy, self.planning, self.cache, self.train_graphs)
        self.pace = Pace(config.transfer_stall_s, config.transfer_min_rate, config.transfer_grace_s)
        self.fetches = FetchLimits(config.fetch_rate, config.fetch_repeats)
        self.traffic = Traffic()
        self.revocations = Revocations(config, self.store, self.sessions, note_closure=self.admission.note_closure,
                                       current_round=self._round_number, close=self._close, emit=emit)
        evaluator, heap = Evaluator(config, self.model), RoundHeap()
        start = start_run(config, self.store, self.strategy.name, self.model)
        self.intake = self.report_intake(evaluator, heap)
        # The round driver of the run's mode, chosen once (orchestrator.rounds.ROUND_DRIVERS): synchronous
        # rounds or FedBuff's buffered ones; the server has no mode of its own.
        driver: type[RoundLoop] = load_reference(ROUND_DRIVERS[config.round_mode], "round driver")
        self.loop = driver(config, self.strategy, self.store, self.model, self.sessions, self.payloads, self.intake,
                           start=start, evaluator=evaluator, heap=heap, traffic=self.traffic, send=self._send,
                           emit=emit)
        self.port: int | None = None
        if config.web:  # pages on the port, reading a view of the server and fed its events (views.web)
            self.web = self._web_site(web)

    def report_intake(self, evaluator: Evaluator, heap: RoundHeap) -> ReportIntake:
        """Report intake, from an upload's first byte to the fold, assembled from its parts for these
        settings and this strategy (docs/architecture.md, "Report intake"): the one place it is made.
        A bound that sees updates measures them against the server's own update on ``evaluator``'s
        held-out data."""
        services = IntakeServices(
            uploads=Uploads(self.limits, self.pace, self.traffic, send=self._send, emit=self._emit),
            check_revoked=self.revocations.check, limits=self.limits, round_state=self._round_state,
            reference=ReferenceUpdate(self.config, self.model, evaluator, heap), work_of=self._train_work,
            sessions=self.sessions, send=self._send, emit=self._emit, alive=lambda d: self.loop.attendance.alive(d))
        return assemble_intake(self.config, self.model, self.strategy, self.store, services)

    def _web_site(self, options: WebOptions | None) -> WebSite:
        from orchestrator.views.web import ServerView, WebOptions, WebSite

        view = ServerView(self.config, self.store, self.admission, self.sessions, self.model, self.planning,
                          round=self._round_state, port=lambda: self.port)
        return WebSite(view, admit=self.admission.admit, options=options or WebOptions())

    def _emit(self, kind: str, data: dict) -> None:
        """An event of the server: to the web site's status feed, if any, and to ``on_event``."""
        if self.web is not None:
            self.web.feed.take(kind, data)
        self.on_event(kind, data)

    def _round_state(self) -> RoundState | None:
        return self.loop.round

    def _train_work(self, device_id: str) -> Work | None:
        return self.loop.work_for(device_id, "train")

    def _round_number(self) -> int | None:
        return None if self.loop.round is None else self.loop.round.round

    # What other code reads of a server: the global state, the run's progress, the plans.
    @property
    def global_state(self) -> dict[str, np.ndarray]:
        return self.loop.global_state

    @property
    def start_round(self) -> int:
        return self.loop.start_round

    @property
    def history(self) -> list[dict]:
        return self.loop.history

    @property
    def plans(self) -> PlanCache:
        return self.planning.plans

    @property
    def graph_splits(self) -> frozenset[int]:
        return self.planning.graph_splits

    async def shippable_plan(self, hello: p.Hello) -> Plan:
        return await self.planning.shippable_plan(hello)

    # -- serving --------------------------------------------------------------------------------
    async def run(self, *, ready: asyncio.Event | None = None, start: asyncio.Event | None = None) -> list[dict]:
        """Serve until every round is done; return the per-round metrics.

        ``start``: the first round also waits for this event once ``min_devices`` are connected
        (a benchmark measures the connected fleet at rest first)."""
        raise_fd_limit()  # a socket per device: the soft limit (often 1,024) up to the hard one
        tune_allocator()  # payloads and updates are large buffers: freed, they go back to the OS
        try:
            tls = server_tls(self.config.tls_cert, self.config.tls_key) if self.config.tls_cert else None
            # backlog: a fleet reconnecting at once (a server restart) must not overflow the accept
            # queue (asyncio's default is 100; the kernel caps it at net.core.somaxconn).
            process_request: Any = self.admission.admit if self.web is None else self.web.process_request
            async with serve(self._handler, self.config.host, self.config.port, ssl=tls,
                             process_request=process_request, backlog=max(100, self.config.max_pending_hellos),
                             **ws_options(self.limits)) as server:
                self.port = server.sockets[0].getsockname()[1]
                self._emit("listening", {"host": self.config.host, "port": self.port, "tls": tls is not None})
                if ready is not None:
                    ready.set()
                watch = asyncio.create_task(self.revocations.watch())
                try:
                    await self.loop.run(start)
                except PrivacyBudgetSpent as spent:  # dp_target_epsilon: the run ends before the round over it
                    log.warning("%s", spent)
                    self._emit("privacy_budget_spent", {"message": str(spent)})
                finally:
                    watch.cancel()
                    await self._say_bye("training finished")
        finally:
            # Closed only after the server stopped accepting: a late hello must not meet a closed journal.
            self.admission.flush()
            self.store.close()
        return self.history

    async def revoke(self, device_id: str) -> bool:
        """Revoke a device's credential and close its connection at once; False if it had none."""
        return await self.revocations.revoke(device_id)

    async def _say_bye(self, reason: str) -> None:
        """Goodbye to every device at once: a closing handshake waits for the device's answer, and
        ten thousand of them one after another would take minutes."""
        async def bye(session: Session) -> None:
            with contextlib.suppress(Exception):
                await self._send(session, p.Bye(reason))
                await session.ws.close()

        await asyncio.gather(*(bye(s) for s in list(self.sessions.values())))

    async def _send(self, session: Session, msg: p.Message) -> None:
        async with session.channel.send_lock:
            await send_msg(session.channel, msg)

    async def _handler(self, ws: ServerConnection) -> None:
        """One connection's life. A fault while handling it ends this connection, never the server:
        protocol errors get their error frame, anything unexpected is logged and gets ``internal``."""
        session: Session | None = None
        hello: p.Message | None = None
        pending = True
        try:
            reason = self.admission.connect(ws)
            if reason is not None:
                await ws.close(1013, reason[:120])  # 1013: try again later (a device reconnects)
                return
            channel = Channel(ws, ServerSession(), self.limits)
            try:
                hello = await asyncio.wait_for(recv_msg(channel), timeout=self.config.hello_timeout_s)
            finally:
                self.admission.hello_done(ws)
                pending = False
            hello_at = time.monotonic()
            if not isinstance(hello, p.Hello):
                raise p.ProtocolError("unexpected", f"first message must be hello, got {hello.TYPE}")
            session = await self._register(channel, hello)
            await self._serve_session(session, hello_at)
        except p.ProtocolError as exc:
            log.warning("closing %s: %s %s", session.device_id if session else ws.remote_address, exc.code, exc.message)
            self._emit("closed", {"device": journaled_id(str(getattr(hello, "device_id", None) or ws.remote_address)),
                                      "code": exc.code, "message": exc.message[:256]})
            await self._close(ws, exc.code, exc.message)
        except (ConnectionClosed, asyncio.TimeoutError):
            pass
        except Exception as exc:  # a fault of this server's own: this connection ends, the server goes on
            log.exception("closing %s after an internal error", session.device_id if session else ws.remote_address)
            await self._close(ws, "internal", f"the server failed handling this device: {type(exc).__name__}")
        finally:
            self.admission.disconnect(ws, pending=pending)
            if session is not None and self.sessions.get(session.device_id) is session:
                del self.sessions[session.device_id]
                self.fetches.forget(session.device_id)
                self.intake.dropped(session.device_id)
                await self.loop.on_disconnect(session.device_id)
                self._emit("disconnected", {"device": session.device_id})

    @staticmethod
    async def _close(ws: ServerConnection, code: str, message: str) -> None:
        with contextlib.suppress(Exception):
            await send_msg(ws, p.Error(code, message[:1024]))
            await ws.close(1008 if code != "refused" else 1000, code)

    async def _register(self, channel: Channel, hello: p.Hello) -> Session:
        """Authenticate, bound, plan and register a hello (a reconnect replaces the old connection)."""
        enrolled_samples = self.admission.authenticate(hello, self.admission.proven_id(channel.ws))
        self.admission.check_hello(hello, self.model)
        plan = await self.planning.shippable_plan(hello)
        info = device_info(hello, plan, self.hello_context, self.strategy)
        old = self.sessions.get(hello.device_id)
        if old is not None:
            asyncio.ensure_future(old.ws.close(1000, "replaced"))  # the stale connection of the same device
        # Held while the device is connected: its declared rows and extensions live on in info, not twice.
        kept = replace(hello, rows={}, ext={}) if hello.rows or hello.ext else hello
        session = Session(hello.device_id, channel, kept, plan, info, enrolled_samples)
        self.sessions[hello.device_id] = session
        self.admission.journal(hello, plan)
        self._emit("registered", {"device": hello.device_id, "role": plan.role, "split": plan.split})
        return session

    async def _serve_session(self, session: Session, hello_at: float | None = None) -> None:
        """Welcome the device, pick up the round it was in if it came back, then answer its messages."""
        plan, config = session.plan, self.config
        welcome = p.Welcome(
            device_id=session.device_id, role=plan.role, split=plan.split, num_blocks=len(self.model),
            chunks=[tuple(c) for c in plan.chunks], model=config.model, model_version=self.start_round - 1,
            batch_size=config.batch_size, local_steps=config.local_steps,
            config={"lr": config.lr_at(self.start_round), "momentum": config.momentum,
                    "weight_decay": config.weight_decay, "footprint_bytes": plan.footprint_bytes},
        )
        await self._send(session, welcome)
        if hello_at is not None:  # hello read to welcome written: planning, journaling, queueing
            self._emit("welcomed", {"device": session.device_id, "latency_s": time.monotonic() - hello_at})
        # A device that drops mid-round and comes back resumes that round (docs/architecture.md, "Qualities
        # and how they are kept"); report intake hears of it first (a secure round refuses it for that round).
        self.intake.returned(session)
        await self.loop.arrived(session)
        while True:
            try:
                msg = await recv_msg(session.channel)
            except p.ProtocolError as exc:  # refused by the codec: report intake may journal it (a secure round)
                self.intake.refused_frame(session.device_id, exc)
                raise
            if isinstance(msg, p.Fetch):
                await self._on_fetch(session, msg)
            elif isinstance(msg, p.Report):
                await self.loop.take_report(session, msg)
            elif isinstance(msg, p.Bye):
                return
            elif isinstance(msg, p.Error):  # the device gives up on an error of its own: say why, end it
                log.warning("device %s stopped: %s %s", session.device_id, msg.code, msg.message[:256])
                self._emit("device_error", {"device": session.device_id, "code": msg.code, "message": msg.message[:256]})
                return
            else:  # what report intake takes beyond reports (a secure round's messages), or refuses
                await self.intake.on_message(session, msg)

    async def _on_fetch(self, session: Session, msg: p.Fetch) -> None:
        payload = self.payloads.get(msg.payload_id)
        if payload is None or not self.loop.serves_fetch(session.device_id, msg.round):
            await self._send(session, p.Ack(msg.round, False, "round closed"))
            return
        if not 0 <= msg.offset <= len(payload.data):
            raise p.ProtocolError("malformed", f"offset {msg.offset} outside the payload of {len(payload.data)} bytes")
        # A payload the device holds by content (Fetch.held) costs it no byte; a stale one is sent as a
        # delta from what the device holds where the server has that (download_delta), else whole.
        payload, offset = await asyncio.to_thread(self.payloads.answer, msg.payload_id, msg.held, msg.offset)
        size = len(payload.data)
        self._charge_fetch(session, msg.round, size - offset)
        tid = f"{payload.kind}-{msg.round}-{msg.payload_id[:48]}-{session.device_id}"
        # A device that stops reading cannot hold this connection's sender (and the round) for longer
        # than its payload takes at the slowest pace allowed.
        # (transfer_min_rate 0: no slowest pace, so no limit.)
        allowed = self.pace.stall_s + (size - offset) / self.pace.min_rate if self.pace.min_rate > 0 else None
        async with session.channel.send_lock:
            try:
                await asyncio.wait_for(
                    send_payload(session.channel, payload.data, transfer_id=tid, kind=payload.kind,
                                 meta={**payload.meta, "round": msg.round}, frame_size=self.config.frame_size,
                                 offset=offset, sha256=payload.sha256),
                    timeout=allowed)
            except asyncio.TimeoutError:
                raise p.ProtocolError("timeout", f"{msg.payload_id[:64]!r} not taken within {allowed:.0f} s") from None
        sent = size - offset
        held = size if offset == size and size else 0  # from the device's store or bundle
        self.traffic.count_sent(sent, session.device_id, payload.kind, msg.payload_id, held=held)
        self._emit("sent", {"device": session.device_id, "round": msg.round, "kind": payload.kind,
                               "payload": msg.payload_id, "bytes": sent, **({"held": True} if held else {})})

    def _charge_fetch(self, session: Session, round_no: int, nbytes: int) -> None:
        """Count a fetch against the device's limits (:class:`FetchLimits`); over them, it is cut off."""
        named = [len(payload.data) for work in self.loop.work_of(session.device_id)
                 for payload in map(self.payloads.get, work.payload_ids) if payload is not None]
        reason = self.fetches.charge(session.device_id, round_no, nbytes, named)
        if reason is not None:
            self.admission.note_closure(session.device_id, "fetch_limit", reason, round_no)
            raise p.ProtocolError("refused", f"fetch limit: {reason}")
