"""The orchestrator: an asyncio websockets server that plans devices and runs federated rounds.

I/O lives here; the decisions live in sans-I/O pieces it calls: the planner
(:mod:`profiles.planner`), round bookkeeping (:mod:`orchestrator.rounds`), the strategy
(:mod:`orchestrator.strategies`) and the wire protocol (:mod:`edge_sdk.protocol`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from edge_sdk import protocol as p
from edge_sdk.models import LayeredModel, build_model
from edge_sdk.transport import recv_msg, recv_payload, send_msg, send_payload, server_tls, ws_options
from exporters.cache import ChunkCache
from orchestrator.config import ServerConfig
from orchestrator.evaluate import Evaluator
from orchestrator.rounds import RoundState, sample_devices
from orchestrator.store import Store
from orchestrator.strategies import DeviceUpdate, UpdateRejected, make_strategy
from profiles.accounting import measure_model
from profiles.planner import Plan, PlanError, RoleThresholds, plan_split
from profiles.runtime import runtime_memory

log = logging.getLogger("edgetrain.server")


@dataclass
class Session:
    """A connected device: its hello, its plan, and the round it is working on (or None)."""

    device_id: str
    ws: ServerConnection
    hello: p.Hello
    plan: Plan
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    busy_round: int | None = None


@dataclass
class PartialUpload:
    """An update whose transfer a dropped connection cut short. Kept until the round ends, so that
    the device's reconnect continues it from the bytes held (docs/protocol.md, "Resume")."""

    update: p.Update
    incoming: p.IncomingTransfer


@dataclass
class RoundPayloads:
    """What devices of the current round download: ONNX chunks by range, encoded tails by split."""

    round: int
    version: str
    chunk_ids: dict[tuple[int, int], str]
    chunks: dict[str, bytes]
    tails: dict[int, bytes]
    # sha256 of each payload, computed once per round rather than once per device that fetches it
    digests: dict[str | int, str] = field(default_factory=dict)


def state_version(state: dict[str, np.ndarray]) -> str:
    """Content hash of the global weights: the model version that chunk ids are derived from."""
    h = hashlib.sha256()
    for name in sorted(state):
        arr = np.ascontiguousarray(state[name])
        h.update(name.encode())
        h.update(str(arr.dtype).encode())
        h.update(arr.tobytes())
    return h.hexdigest()[:16]


class Orchestrator:
    """Registers devices, runs ``config.rounds`` rounds, and persists every completed one."""

    def __init__(self, config: ServerConfig, *, on_event: Callable[[str, dict], None] | None = None) -> None:
        self.config = config
        self.on_event = on_event or (lambda kind, data: None)
        # Frames this side sends are config.frame_size; it accepts any peer's up to the default bound.
        self.limits = p.Limits(max_frame_bytes=max(config.frame_size, p.DEFAULT_LIMITS.max_frame_bytes))
        self.model: LayeredModel = build_model(config.model, seed=config.seed)
        self.model.eval()
        self.global_state = {k: v.detach().numpy().copy() for k, v in self.model.state_dict().items()}
        self.strategy = make_strategy(config.strategy, blocks=self.model.block_names, **config.strategy_options)
        self.store = Store(config.store_dir, keep=config.keep_checkpoints)
        self.cache = ChunkCache(max_bytes=256 << 20, directory=config.store_dir / "chunks")
        self.evaluator = Evaluator(config)
        self.cost = measure_model(self.model)  # measured once; every hello is planned against it
        self.sessions: dict[str, Session] = {}
        self.round: RoundState | None = None
        self.payloads: RoundPayloads | None = None
        # Updates cut short by a dropped connection, by device: resumed when the device comes back this round.
        self.partial_uploads: dict[str, PartialUpload] = {}
        self.start_round = 1
        self.history: list[dict] = []
        self._changed = asyncio.Event()
        self.port: int | None = None
        self._prepare_store()

    # -- persistence ----------------------------------------------------------------------
    def _prepare_store(self) -> None:
        identity = {"model": self.config.model, "strategy": self.config.strategy, "seed": str(self.config.seed)}
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
    async def run(self, *, ready: asyncio.Event | None = None) -> list[dict]:
        """Serve until every round is done; return the per-round metrics."""
        try:
            tls = server_tls(self.config.tls_cert, self.config.tls_key) if self.config.tls_cert else None
            async with serve(self._handler, self.config.host, self.config.port, ssl=tls,
                             **ws_options(self.limits)) as server:
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
            self.store.close()
        return self.history

    async def _say_bye(self, reason: str) -> None:
        for session in list(self.sessions.values()):
            with contextlib.suppress(Exception):
                async with session.send_lock:
                    await send_msg(session.ws, p.Bye(reason))
                await session.ws.close()

    async def _handler(self, ws: ServerConnection) -> None:
        session: Session | None = None
        try:
            hello = await asyncio.wait_for(recv_msg(ws, self.limits), timeout=30)
            if not isinstance(hello, p.Hello):
                raise p.ProtocolError("unexpected", f"first message must be hello, got {hello.TYPE}")
            session = self._register(ws, hello)
            await self._serve_session(session)
        except p.ProtocolError as exc:
            log.warning("closing %s: %s %s", session.device_id if session else ws.remote_address, exc.code, exc.message)
            with contextlib.suppress(Exception):
                await send_msg(ws, p.Error(exc.code, exc.message))
                await ws.close(1008 if exc.code != "refused" else 1000, exc.code)
        except (ConnectionClosed, asyncio.TimeoutError):
            pass
        finally:
            if session is not None and self.sessions.get(session.device_id) is session:
                del self.sessions[session.device_id]
                if self.round is not None:
                    if session.device_id in self.partial_uploads:
                        # Cut mid-upload: still awaited for a while, to come back and resume.
                        asyncio.get_running_loop().call_later(self.config.upload_resume_s, self._give_up_upload,
                                                              session.device_id, self.round.round)
                    else:
                        self.round.on_gone(session.device_id)
                self.on_event("disconnected", {"device": session.device_id})
                self._changed.set()

    def _give_up_upload(self, device_id: str, round: int) -> None:
        """The device whose upload was cut has not come back in time: stop waiting for it."""
        rs = self.round
        if rs is not None and rs.round == round and device_id not in self.sessions:
            rs.on_gone(device_id)
            self._changed.set()

    def _register(self, ws: ServerConnection, hello: p.Hello) -> Session:
        if self.config.token and not hmac.compare_digest(hello.token.encode(), self.config.token.encode()):
            raise p.ProtocolError("unauthorized", "bad credentials")
        if not hello.device_id or len(hello.device_id) > 128:
            raise p.ProtocolError("malformed", "device_id must be 1-128 characters")
        try:
            plan = self._plan(hello)
        except PlanError as exc:
            raise p.ProtocolError("refused", str(exc)) from None
        old = self.sessions.get(hello.device_id)
        if old is not None:
            # A reconnect replaces the stale connection of the same device.
            asyncio.ensure_future(old.ws.close(1000, "replaced"))
        session = Session(hello.device_id, ws, hello, plan)
        self.sessions[hello.device_id] = session
        profile = {
            "budget_bytes": hello.budget_bytes, "cores": hello.cores, "runtimes": list(hello.runtimes),
            "num_samples": hello.num_samples, "device_class": hello.device_class, "labels": dict(hello.labels),
        }
        self.store.record_device(hello.device_id, profile, plan_summary(plan))
        self.on_event("registered", {"device": hello.device_id, "role": plan.role, "split": plan.split})
        return session

    def _plan(self, hello: p.Hello) -> Plan:
        """The planner's choice for this budget, or a split the device was told to take.

        ``labels["force_split"]`` is for emulation and tests (e.g. make a weak device train the
        whole model to show it cannot): the split is honoured whatever the budget says.
        """
        batch = self.config.planner_batch
        forced = hello.labels.get("force_split")
        if forced is None:
            return plan_split(self.cost, hello.budget_bytes, batch, local_samples=hello.num_samples)
        try:
            k = int(forced)
        except ValueError:
            raise p.ProtocolError("malformed", f"force_split must be an integer, not {forced!r}") from None
        if not 0 <= k < len(self.model):
            raise p.ProtocolError("malformed", f"force_split {k} outside [0, {len(self.model)})")
        chunks = [(0, k)] if k > 0 else []
        footprint = self.cost.footprint(k, batch, runtime_bytes=runtime_memory().training, chunks=chunks,
                                        local_samples=hello.num_samples)
        capacity = self.cost.capacity(k, batch)
        return Plan(
            model=self.cost.model, split=k, role=RoleThresholds().role(k, capacity), chunks=chunks,
            footprint_bytes=footprint.total, capacity=capacity, budget_bytes=hello.budget_bytes, batch_size=batch,
            num_blocks=len(self.cost), trainable_params=self.cost.trainable_params(k), footprint=footprint,
        )

    async def _serve_session(self, session: Session) -> None:
        plan = session.plan
        welcome = p.Welcome(
            device_id=session.device_id, role=plan.role, split=plan.split, num_blocks=len(self.model),
            chunks=[tuple(c) for c in plan.chunks], model=self.config.model, model_version=self.start_round - 1,
            batch_size=self.config.batch_size, local_steps=self.config.local_steps,
            config={"lr": self.config.lr, "momentum": self.config.momentum, "weight_decay": self.config.weight_decay,
                    "footprint_bytes": plan.footprint_bytes},
        )
        async with session.send_lock:
            await send_msg(session.ws, welcome)
        # A device that drops mid-round and comes back resumes that round (DESIGN.md "Nothing is lost").
        rs = self.round
        if rs is not None and session.hello.resume_round == rs.round and rs.expects(session.device_id):
            rs.on_back(session.device_id)
            partial = self.partial_uploads.pop(session.device_id, None)
            if partial is not None and partial.update.round == rs.round:
                await self._resume_upload(session, partial)
            else:
                await self._send_task(session, rs)
        self._changed.set()
        while True:
            msg = await recv_msg(session.ws, self.limits)
            if isinstance(msg, p.Fetch):
                await self._on_fetch(session, msg)
            elif isinstance(msg, p.Update):
                await self._on_update(session, msg)
            elif isinstance(msg, p.Bye):
                return
            else:
                raise p.ProtocolError("unexpected", f"a device may not send {msg.TYPE} here")

    async def _on_fetch(self, session: Session, msg: p.Fetch) -> None:
        pay = self.payloads
        if pay is None or self.round is None or msg.round != pay.round or not self.round.expects(session.device_id):
            async with session.send_lock:
                await send_msg(session.ws, p.Ack(msg.round, False, "round closed"))
            session.busy_round = None
            return
        plan = session.plan
        if msg.kind == "chunk":
            if not 0 <= msg.index < len(plan.chunks):
                raise p.ProtocolError("malformed", f"chunk index {msg.index} outside the plan's {len(plan.chunks)} chunks")
            rng = tuple(plan.chunks[msg.index])
            cid = pay.chunk_ids[rng]
            data, meta = pay.chunks[cid], {"chunk_id": cid, "start": rng[0], "stop": rng[1], "round": pay.round}
            digest = pay.digests[cid]
        elif msg.kind == "tail":
            data, meta = pay.tails[plan.split], {"split": plan.split, "round": pay.round, "version": pay.version}
            digest = pay.digests[plan.split]
        else:
            raise p.ProtocolError("malformed", f"cannot fetch kind {msg.kind!r}")
        if not 0 <= msg.offset <= len(data):
            raise p.ProtocolError("malformed", f"offset {msg.offset} outside the payload of {len(data)} bytes")
        tid = f"{msg.kind}-{pay.round}-{msg.index}-{session.device_id}"
        async with session.send_lock:
            await send_payload(session.ws, data, transfer_id=tid, kind=msg.kind, meta=meta,
                               frame_size=self.config.frame_size, offset=msg.offset, sha256=digest)

    async def _on_update(self, session: Session, msg: p.Update) -> None:
        begin = await recv_msg(session.ws, self.limits)
        if not isinstance(begin, p.TransferBegin) or begin.transfer_id != msg.transfer_id or begin.kind != "update":
            raise p.ProtocolError("unexpected", "an update must be followed by its transfer")
        await self._receive_update(session, msg, begin, p.IncomingTransfer(begin, self.limits, hash_in_feed=False))

    async def _resume_upload(self, session: Session, partial: PartialUpload) -> None:
        """Ask a reconnected device for the rest of the update it was sending when its connection dropped."""
        session.busy_round = partial.update.round
        transfer_id, offset = partial.update.transfer_id, partial.incoming.offset
        async with session.send_lock:
            await send_msg(session.ws, p.Resume(transfer_id, offset))
        begin = await recv_msg(session.ws, self.limits)
        if not isinstance(begin, p.TransferBegin) or begin.transfer_id != transfer_id:
            raise p.ProtocolError("unexpected", f"resume of {transfer_id[:64]!r} must be answered by its transfer")
        self.on_event("upload_resumed", {"device": session.device_id, "round": partial.update.round, "offset": offset,
                                         "total": partial.incoming.total_size})
        await self._receive_update(session, partial.update, begin, partial.incoming)

    async def _receive_update(self, session: Session, msg: p.Update, begin: p.TransferBegin,
                              incoming: p.IncomingTransfer) -> None:
        """Receive an update's deltas (``begin`` starts or resumes ``incoming``) and fold them in."""
        try:
            payload = await recv_payload(session.ws, begin, self.limits, incoming=incoming)
        except ConnectionClosed:
            rs = self.round
            if rs is not None and msg.round == rs.round and rs.expects(session.device_id):
                self.partial_uploads[session.device_id] = PartialUpload(msg, incoming)
                self.on_event("upload_cut", {"device": session.device_id, "round": msg.round,
                                             "offset": incoming.offset, "total": incoming.total_size})
            raise
        deltas = p.decode_tensors(payload, self.limits)
        rs = self.round
        session.busy_round = None
        if rs is None or msg.round != rs.round or not rs.expects(session.device_id):
            async with session.send_lock:
                await send_msg(session.ws, p.Ack(msg.round, False, "late: the round is closed"))
            self.on_event("late", {"device": session.device_id, "round": msg.round})
            return
        expected_range = (session.plan.split, len(self.model))
        if tuple(msg.trained) != expected_range:
            raise p.ProtocolError("malformed", f"trained {tuple(msg.trained)} but the plan is {expected_range}")
        if msg.num_samples <= 0 or msg.num_samples > max(session.hello.num_samples, 1) * 10:
            raise p.ProtocolError("malformed", f"implausible sample count {msg.num_samples}")
        update = DeviceUpdate(
            device_id=session.device_id, role=session.plan.role, trained=expected_range,
            num_samples=msg.num_samples, deltas=deltas, loss_before=msg.loss_before,
            loss_after=msg.loss_after, metrics=dict(msg.metrics),
        )
        reason = self.strategy.accept(update)
        if reason is None:
            try:
                self.strategy.fold(update)
            except UpdateRejected as exc:
                rs.on_report(session.device_id, accepted=False)
                self.store.record_update(rs.round, session.device_id, {**update_info(update), "accepted": False, "reason": str(exc)})
                self._changed.set()
                raise p.ProtocolError("malformed", f"update rejected: {exc}") from None
        rs.on_report(session.device_id, accepted=reason is None)
        self.store.record_update(rs.round, session.device_id, {**update_info(update), "accepted": reason is None, "reason": reason or ""})
        async with session.send_lock:
            await send_msg(session.ws, p.Ack(rs.round, reason is None, reason or ""))
        self.on_event("update", {"device": session.device_id, "round": rs.round, "role": session.plan.role,
                                 "accepted": reason is None, "reported": len(rs.reported), "selected": len(rs.selected)})
        self._changed.set()

    # -- rounds ---------------------------------------------------------------------------
    async def _wait_for_devices(self, needed: int) -> None:
        deadline = time.monotonic() + self.config.wait_devices_s
        while len(self._idle()) < needed:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self._idle())} of {needed} devices were ready in time")
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=0.5)

    def _idle(self) -> list[str]:
        return [d for d, s in self.sessions.items() if s.busy_round is None]

    async def _rounds(self) -> None:
        # The first round waits for min_devices to connect; later ones go ahead with whoever is
        # idle, so a fleet that loses a device keeps training.
        for r in range(self.start_round, self.config.rounds + 1):
            await self._wait_for_devices(self.config.min_devices if r == self.start_round else 1)
            await self._run_round(r)

    async def _prepare_payloads(self, r: int, sessions: list[Session]) -> RoundPayloads:
        self._load_global_into_model()
        version = state_version(self.global_state)
        ranges = sorted({tuple(c) for s in sessions for c in s.plan.chunks})
        splits = sorted({s.plan.split for s in sessions})

        def build() -> RoundPayloads:
            chunk_ids, chunks = {}, {}
            for a, b in ranges:
                cid, data = self.cache.get_or_export(self.model, version, a, b)
                chunk_ids[(a, b)] = cid
                chunks[cid] = data
            tails = {}
            for k in splits:
                names = self.model.state_names(k)
                tails[k] = p.encode_tensors({n: self.global_state[n] for n in names})
            digests: dict[str | int, str] = {key: p.sha256_hex(data) for key, data in (*chunks.items(), *tails.items())}
            return RoundPayloads(r, version, chunk_ids, chunks, tails, digests)

        return await asyncio.to_thread(build)

    async def _send_task(self, session: Session, rs: RoundState) -> None:
        pay = self.payloads
        assert pay is not None
        task = p.Task(
            round=rs.round, model_version=rs.round - 1, split=session.plan.split,
            chunk_ids=[pay.chunk_ids[tuple(c)] for c in session.plan.chunks], tail_id=f"tail-{pay.version}-{session.plan.split}",
            local_steps=self.config.local_steps, lr=self.config.lr,
            deadline_s=max(0.0, rs.deadline - time.monotonic()), config={"seed": self.config.seed * 100_003 + rs.round},
        )
        session.busy_round = rs.round
        async with session.send_lock:
            await send_msg(session.ws, task)

    async def _run_round(self, r: int) -> None:
        t0, cpu0 = time.monotonic(), time.process_time()
        selected = sample_devices(self._idle(), self.config.fraction, r, self.config.seed)
        sessions = [self.sessions[d] for d in selected]
        self.payloads = await self._prepare_payloads(r, sessions)
        self.strategy.begin_round(r, self.global_state)
        rs = RoundState(r, frozenset(selected), deadline=time.monotonic() + self.config.deadline_s, quorum=self.config.quorum)
        self.round = rs
        self.store.begin_round(r, selected)
        self.on_event("round_start", {"round": r, "selected": len(selected)})
        for s in sessions:
            with contextlib.suppress(ConnectionClosed):
                await self._send_task(s, rs)
        while not rs.done(time.monotonic()):
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=0.25)
        result = self.strategy.finish()
        self.global_state = {k: np.asarray(v) for k, v in result.state.items()}
        self.round = None
        self.payloads = None
        self.partial_uploads.clear()
        metrics: dict[str, object] = {
            "round": r, "selected": len(selected), "reported": len(rs.reported), "rejected": len(rs.rejected),
            "stragglers": sorted(rs.stragglers()), "roles": role_counts(self.sessions, rs.reported),
        }
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
            # payloads, streaming, decoding and folding updates, aggregating, checkpointing), with
            # evaluation left out; waiting on devices costs none.
            "server_cpu_s": time.process_time() - cpu0 - eval_cpu,
        })
        self.store.complete_round(r, self.global_state, metrics)
        for s in self.sessions.values():
            if s.busy_round == r:
                s.busy_round = None
        self.history.append(metrics)
        self.on_event("round_end", metrics)


def plan_summary(plan: Plan) -> dict[str, object]:
    return {"role": plan.role, "split": plan.split, "chunks": [list(c) for c in plan.chunks],
            "footprint_bytes": plan.footprint_bytes, "capacity": plan.capacity}


def update_info(u: DeviceUpdate) -> dict[str, object]:
    return {"role": u.role, "trained": list(u.trained), "num_samples": u.num_samples,
            "loss_before": u.loss_before, "loss_after": u.loss_after, "metrics": dict(u.metrics)}


def role_counts(sessions: dict[str, Session], reported: set[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for d in reported:
        s = sessions.get(d)
        role = s.plan.role if s else "gone"
        counts[role] = counts.get(role, 0) + 1
    return counts
