"""Payloads: what each instruction of a round sends, cut, encoded and hashed once per round.

For every instruction the round loop dispatches, :meth:`Payloads.prepare` (run in a worker thread:
ONNX export and encoding are CPU work) checks that the selection fits the device's budget (asking
:class:`~orchestrator.server.planning.Planning`), exports the frozen chunks of the state's version, cuts and
encodes the model payload, encodes any broadcast, and names the training graph of a device on a
graph runtime. Exports never run on a model the round loop or the evaluator uses: chunks are
exported from a model built for the version they belong to (:func:`model_at`), and the exporters
copy the model they are given before they touch it.
"""

from __future__ import annotations

import copy
import hashlib
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from edge_sdk import protocol as p
from edge_sdk.models import LayeredModel
from edge_sdk.models.adapters import adapter_update_names
from edge_sdk.wire_codecs import CODEC_META, FEEDBACK_KEY, RECON_META, UPDATE_CODEC_KEY, encode_payload, needs_feedback
from exporters.cache import ChunkCache
from exporters.onnx_export import ExportError
from exporters.train_export import TrainGraphCache
from orchestrator.config import ServerConfig
from orchestrator.parts import Payload, Prepared, Session, Work
from orchestrator.server.download_deltas import DeltaDownloads, delta_bits
from orchestrator.server.planning import Planning
from orchestrator.strategies import Broadcast, Instruction, Strategy
from orchestrator.strategies.base import SelectionCost
from orchestrator.strategies.selection import Selection
from profiles.accounting import ModelCost
from profiles.planner import Plan
from profiles.runtime import RUNTIMES

__all__ = ["FetchLimits", "Payloads", "chunk_ranges", "exceeds_rows", "model_at", "selection_rows", "state_version"]


def state_version(state: Mapping[str, np.ndarray]) -> str:
    """Content hash of the global weights: the model version that chunk and model ids derive from."""
    h = hashlib.sha256()
    for name in sorted(state):
        arr = np.ascontiguousarray(state[name])
        h.update(name.encode())
        h.update(str(arr.dtype).encode())
        h.update(arr.tobytes())
    return h.hexdigest()[:16]


_COPY_LOCK = threading.Lock()


def model_at(template: LayeredModel, state: Mapping[str, np.ndarray]) -> LayeredModel:
    """A model of its own holding ``state`` (in eval mode), built from ``template``, which nobody
    changes: what exports and evaluation run on, so none of them sees another's changes."""
    with _COPY_LOCK:
        model = copy.deepcopy(template)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    model.eval()
    return model


def selection_rows(selection: Selection) -> dict[str, int]:
    """Rows per table a selection sends (empty for whole tables), for the budget check."""
    return {name: len(idx) for name, idx in selection.rows.items()} if selection.kind == "rows" else {}


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


class Payloads:
    """This round's payloads by id, and the preparation of each instruction's work."""

    def __init__(self, config: ServerConfig, template: LayeredModel, strategy: Strategy, planning: Planning,
                 cache: ChunkCache, train_graphs: TrainGraphCache) -> None:
        self.config = config
        self.template = template
        self.strategy = strategy
        self.planning = planning
        self.cache = cache
        self.train_graphs = train_graphs
        self.by_id: dict[str, Payload] = {}
        self._broadcasts: dict[int, tuple[Broadcast, str]] = {}  # id(Broadcast) -> (kept alive, payload id)
        self.version = ""
        self.state: Mapping[str, np.ndarray] = {}
        self._models: dict[str, LayeredModel] = {}  # version -> the model its chunks export from
        self._lock = threading.Lock()
        bits = delta_bits(config.download_delta)
        self.deltas = DeltaDownloads(bits, config.download_delta_keep) if bits else None

    def __getitem__(self, payload_id: str) -> Payload:
        return self.by_id[payload_id]

    def get(self, payload_id: str) -> Payload | None:
        return self.by_id.get(payload_id)

    def begin(self, state: Mapping[str, np.ndarray], keep: Sequence[str] = ()) -> None:
        """A new round serves ``state``: its version, no payloads yet but those ``keep`` names (an
        earlier version's, still out to a device that trains on it: buffered rounds)."""
        kept = {pid: self.by_id[pid] for pid in keep if pid in self.by_id}
        self.state, self.version = state, state_version(state)
        self.clear()
        self.by_id.update(kept)
        if self.deltas is not None:
            self.deltas.next_round()
        with self._lock:
            self._models = {v: m for v, m in self._models.items() if v == self.version}

    def clear(self) -> None:
        self.by_id, self._broadcasts = {}, {}

    def drop_chunks(self) -> None:
        """Forget the chunks held in memory: those of past versions are never served again, and a
        cache full of them (256 MiB) was most of a long run's memory growth. Chunks stay on disk
        (within ``chunk_disk_bytes``) and the next version's are exported into memory anew."""
        self.cache.clear()

    def prune_disk(self, max_bytes: int) -> None:
        """Chunks of past versions are never asked for again: keep the chunks on disk within a byte budget."""
        self.cache.prune_disk(max_bytes)

    def model_for(self, version: str, state: Mapping[str, np.ndarray]) -> LayeredModel:
        """The model the chunks of ``version`` export from (built once per version)."""
        with self._lock:
            model = self._models.get(version)
        if model is None:
            model = model_at(self.template, state)
            with self._lock:
                model = self._models.setdefault(version, model)
        return model

    def check_chunks(self, state: Mapping[str, np.ndarray], ranges: Sequence[tuple[int, int]]) -> str | None:
        """Export (and so verify) the frozen chunks ``ranges`` of ``state``; why not, if they fail.
        The model built for them serves the next round if ``state`` is committed."""
        version = state_version(state)
        model = self.model_for(version, state)
        try:
            for a, b in ranges:
                self.cache.get_or_export(model, version, a, b)
        except ExportError as exc:
            return f"the frozen chunks of the new model fail their export check: {exc}"
        return None

    def prepare(self, instructions: Sequence[Instruction], sessions: Mapping[str, Session],
                round_no: int) -> list[Prepared]:
        """Cut, encode and hash every payload the instructions need that this round does not hold yet."""
        names_by_split: dict[int, tuple[str, ...]] = {}
        out: list[Prepared] = []
        for ins in instructions:
            session = sessions.get(ins.device_id)
            out.append((session, ins, None if session is None else self._work(session, ins, round_no, names_by_split)))
        return out

    def _work(self, session: Session, ins: Instruction, round_no: int,
              names_by_split: dict[int, tuple[str, ...]]) -> Work | None:
        """The work of one instruction, or None when the device cannot take it."""
        selection = self.planned(session.plan, ins.selection)
        if not 0 <= selection.split < len(self.template):
            raise ValueError(f"strategy {self.strategy.name}: split {selection.split} outside [0, {len(self.template)})")
        ranges = chunk_ranges(session.plan.chunks, selection.split)
        other = self.strategy.selection_cost(ins, selection, self.config.model)
        if not self._affordable(session, selection, ranges, other):
            return None  # never asked: the device could not hold that much
        names = names_by_split.get(selection.split)
        if names is None:
            names = names_by_split[selection.split] = tuple(self.template.state_names(selection.split))
        extra: dict[str, p.Scalar] = {}
        if RUNTIMES[session.plan.backend].needs_graph and other is None:
            graph_id = self.train_graph(selection)
            if graph_id is None:  # a strategy's longer tail whose graph is refused: not asked
                return None
            extra[p.TRAIN_GRAPH_KEY] = graph_id
        wire = p.Instruction(
            round=round_no, phase=ins.phase, model_version=round_no - 1, split=selection.split,
            chunk_ids=self._chunks(ranges), model_id=self._model(selection, names),
            selection=selection.kind, broadcast_id=self._broadcast(ins.broadcast, round_no),
            local_steps=self.config.local_steps if ins.local_steps is None else int(ins.local_steps),
            lr=self.config.lr_at(round_no) if ins.lr is None else float(ins.lr), deadline_s=0.0,
            config={"seed": self.config.seed * 100_003 + round_no,
                    **({} if self.config.loss_after else {"loss_after": False}), **self._update_codec,
                    **dict(ins.config), **extra},
        )
        model = self.by_id[wire.model_id]  # its decoded size bounds the update that answers it
        work = Work(ins, selection, wire, names, int(model.meta.get("decoded_size", len(model.data))))
        # What each payload's bytes hash to: a device holding them fetches with Fetch.held, and is sent none.
        # A delta-coded payload's digest is that of the bytes the device rebuilds (and keeps).
        digests = {pid: str(self.by_id[pid].meta.get(RECON_META, self.by_id[pid].sha256)) for pid in work.payload_ids}
        return replace(work, wire=replace(wire, digests=digests))

    def answer(self, payload_id: str, held: str, offset: int) -> tuple[Payload, int]:
        """What a fetch of ``payload_id`` is sent, from which offset: nothing of a payload the device
        holds (``held`` is its digest or, delta-coded, its reconstruction's), a delta from the
        reconstruction it holds, else the whole payload (from ``offset`` when resuming)."""
        payload = self.by_id[payload_id]
        if not held:
            return payload, offset
        if held in (payload.sha256, payload.meta.get(RECON_META)):
            return payload, len(payload.data)
        delta = None if self.deltas is None or RECON_META not in payload.meta else \
            self.deltas.answer(payload_id, payload, held)
        return (payload, 0) if delta is None else (delta, 0)

    def planned(self, plan: Plan, asked: Selection | None = None) -> Selection:
        """What an instruction's selection ``asked`` (None: the planned tail) trains on a device with
        ``plan``: as asked, except that the tail at its planned split, for a device planned through
        adapters (``Plan.adapters``), is that tail trained through its adapters (strategies ask for
        tails; the plan says how the device can train one)."""
        if asked is not None and not (asked.kind == "tail" and asked.split == plan.split):
            return asked
        if not plan.adapters:
            return asked or Selection.tail(plan.split)
        return Selection.of_adapters(plan.split, adapter_update_names(self.template, plan.split))

    def _affordable(self, session: Session, selection: Selection, ranges: list[tuple[int, int]],
                    other: SelectionCost | None) -> bool:
        """Whether the device can train the selection: its runtime can (a selection of another
        model, e.g. a width slice, names the backends that can) and it fits its budget whenever
        it asks for more than the plan counted (:meth:`Planning.fits`)."""
        plan, rows = session.plan, selection_rows(selection)
        fits = self.planning.fits
        if other is not None:
            return RUNTIMES[plan.backend].backend in other.backends and fits(
                session.device_id, session.hello, plan, selection.split, ranges, rows, cost=other.cost)
        whole = plan.adapters and selection.kind != "adapters"  # more than the adapters it was planned for
        if selection.split < plan.split or whole or exceeds_rows(plan, rows, self.planning.cost, selection.split):
            return fits(session.device_id, session.hello, plan, selection.split, ranges, rows,
                        adapters=selection.kind == "adapters")
        return True

    @property
    def _update_codec(self) -> dict[str, p.Scalar]:
        """The instruction ``config`` entries that tell a device its update's codec (none: nothing)."""
        name = self.config.update_codec
        return {} if name == "none" else {UPDATE_CODEC_KEY: name, FEEDBACK_KEY: needs_feedback(name)}

    def _payload(self, kind: str, data: bytes, meta: dict[str, p.Scalar], payload_id: str = "") -> Payload:
        """A payload as it travels: through the codec the configuration names for its kind
        (``meta["codec"]`` says which), hashed once; chunks and tails delta-coded where
        ``download_delta`` is set (:class:`DeltaDownloads`)."""
        if self.deltas is not None and payload_id and kind in ("chunk", "model"):
            return self.deltas.whole(payload_id, kind, data, meta)
        name = {"chunk": self.config.chunk_codec, "model": self.config.tail_codec,
                "train_graph": self.config.graph_codec}.get(kind, "none")
        if name != "none":
            meta = {**meta, CODEC_META: name, "decoded_size": len(data)}
            data = encode_payload(data, name, kind)
        return Payload(kind, data, p.sha256_hex(data), meta)

    def _chunks(self, ranges: Sequence[tuple[int, int]]) -> list[str]:
        chunk_ids = []
        for a, b in ranges:
            cid, data = self.cache.get_or_export(self.model_for(self.version, self.state), self.version, a, b)
            if cid not in self.by_id:
                self.by_id[cid] = self._payload("chunk", data, {"chunk_id": cid, "start": a, "stop": b}, cid)
            chunk_ids.append(cid)
        return chunk_ids

    def _model(self, selection: Selection, names: tuple[str, ...]) -> str:
        model_id = f"model-{self.version}-{selection.key()}"
        if model_id not in self.by_id:
            data = p.encode_tensors(selection.cut(self.state, names))
            self.by_id[model_id] = self._payload("model", data, {"split": selection.split, "selection": selection.kind,
                                                                 "version": self.version}, model_id)
        return model_id

    def _broadcast(self, broadcast: Broadcast | None, round_no: int) -> str:
        if broadcast is None:
            return ""
        kept = self._broadcasts.get(id(broadcast))
        if kept is not None:
            return kept[1]
        broadcast_id = f"broadcast-{round_no}-{len(self._broadcasts)}"
        data = p.encode_tensors(dict(broadcast.tensors))
        self.by_id[broadcast_id] = Payload("broadcast", data, p.sha256_hex(data))
        self._broadcasts[id(broadcast)] = (broadcast, broadcast_id)
        return broadcast_id

    def train_graph(self, selection: Selection) -> str | None:
        """The payload id of the training graph for ``selection`` (exported and verified on first use),
        or None when the export check refuses it (the round goes on without that device)."""
        if selection.kind not in ("tail", "adapters"):
            raise ValueError(f"strategy {self.strategy.name}: a {selection.kind} selection at split {selection.split} "
                             "has no training graph for a device on a graph runtime")
        if selection.split not in self.planning.graph_splits:
            return None
        adapters = selection.kind == "adapters"
        try:
            gid, data = self.train_graphs.get_or_export(self.template, selection.split, adapters)
        except ExportError as exc:
            if not adapters:
                self.planning.refuse_graph(selection.split, str(exc))
            return None
        if gid not in self.by_id:
            self.by_id[gid] = self._payload("train_graph", data, {"split": selection.split})
        return gid


@dataclass
class _Fetched:
    """One device's fetches: its round's count and bytes, and its rate allowance (a token bucket)."""

    round: int
    count: int = 0
    bytes: int = 0
    tokens: float = 0.0
    at: float = 0.0


class FetchLimits:
    """Per-device fetch limits: what a round's instructions name, ``repeats`` times over, and a
    rate. An honest device fetches each payload it was named once (again after a reconnect,
    from where it stopped); a device fetching its model in a loop takes bandwidth and the
    server's sending time from every other device, and is cut off instead."""

    def __init__(self, rate: float, repeats: int, *, burst_s: float = 4.0) -> None:
        self.rate, self.repeats = rate, repeats
        self.burst = max(1.0, rate * burst_s)
        self._by_device: dict[str, _Fetched] = {}

    def charge(self, device_id: str, round_no: int, nbytes: int, named: Sequence[int]) -> str | None:
        """Count a fetch of ``nbytes`` by a device whose instructions this round name payloads of
        sizes ``named``; why it must be cut off, if so (nothing is counted then)."""
        now = time.monotonic()
        f = self._by_device.get(device_id)
        if f is None:
            f = self._by_device[device_id] = _Fetched(round_no, tokens=self.burst, at=now)
        if f.round != round_no:
            f.round, f.count, f.bytes = round_no, 0, 0
        f.tokens = min(self.burst, f.tokens + (now - f.at) * self.rate)
        f.at = now
        if f.tokens < 1.0:
            return f"more than {self.rate:g} fetches per second"
        if f.count + 1 > self.repeats * max(1, len(named)) or f.bytes + nbytes > self.repeats * sum(named):
            return (f"fetched {f.count} payloads ({f.bytes} bytes) in round {round_no}, more than {self.repeats} "
                    f"times what its instructions name ({len(named)} payloads, {sum(named)} bytes)")
        f.tokens -= 1.0
        f.count += 1
        f.bytes += nbytes
        return None

    def forget(self, device_id: str) -> None:
        """The device left: keep nothing of it."""
        self._by_device.pop(device_id, None)
