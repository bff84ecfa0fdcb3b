"""A device's work on the server's instructions, one round at a time (EmbracingFL Algorithms 1-2).

One training instruction: fetch frozen chunk 1, run it over the local data, cache the activations,
free the chunk, fetch chunk 2 ... (Algorithm 1, lines 2-4), then let the instruction's training
backend fetch what it trains from (the tail's state, a training graph) and train tau local steps on
the cached activations (Algorithm 2). A strong device has no chunks and trains the whole model.
A round may hold several instructions (docs/protocol.md, "Phases"), each run by the phase of its
name in the device's registry (:mod:`edge_sdk.phases`): the phases see the round through
:class:`edge_sdk.phases.PhaseContext` (public methods only). The activations and the trained
update are kept for the round (:class:`RoundProgress`), so no phase computes them twice, a
reconnect loses neither, and a trained update is never trained again.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.backends import TrainingBackend, choose_backend
from edge_sdk.backends.base import Tail
from edge_sdk.downloads import Downloads, download_slot
from edge_sdk.memory import peak_rss_bytes
from edge_sdk.memory_policy import MemoryPolicy
from edge_sdk.phases import DeviceRegistry, PhaseResult, Tensors, TrainedUpdate
from edge_sdk.transport import Channel
from edge_sdk.wire_codecs import UpdateEncoder

__all__ = ["RoundProgress", "RoundWork", "device_seed"]


def device_seed(round_seed: int, device_id: str) -> int:
    """The local sampling seed: differs per device and round, the same on every run (no salted hash())."""
    return (round_seed * 1_000_003 + zlib.crc32(device_id.encode())) % (1 << 31)


@dataclass
class RoundProgress:
    """What survives a reconnect within one round: the activations computed so far, partial
    downloads, trained updates, and each report until the server acknowledges it."""

    round: int
    chunks_done: tuple[str, ...] = ()  # chunk ids run forward so far, in order
    activations: object | None = None  # ActivationCache
    partial: dict[str, p.IncomingTransfer] = field(default_factory=dict)
    storage: str = "memory"  # where the last chunk's activations went
    trained: dict[str, TrainedUpdate] = field(default_factory=dict)  # by model payload id
    reports: dict[str, tuple[p.Report, bytes | None]] = field(default_factory=dict)  # by phase, until acked
    acked: set[str] = field(default_factory=set)  # phases done this round
    notes: dict[str, p.Scalar] = field(default_factory=dict)  # what this round's phases share (PhaseContext.notes)
    secure: Any = None  # the round's edge_sdk.secagg.round.DeviceRound, until it has answered the unmasking
    timings: dict[str, float] = field(default_factory=lambda: {"download_s": 0.0, "forward_s": 0.0, "train_s": 0.0,
                                                               "upload_s": 0.0})


@dataclass(frozen=True)
class DeviceWork:
    """What a device brings to every round: its data, its phases, how it trains and computes."""

    device_id: str
    x: np.ndarray
    y: np.ndarray
    registry: DeviceRegistry
    backend: type[TrainingBackend]  # the device's own (a plan may ask for another: choose_backend)
    threads: int = 1
    forward_batch: int = 0  # batch of the multi-step forward pass; 0: the planned batch size
    warm_tails: Any = None
    secret: str = ""  # the device's credential: it signs a secure round's keys (edge_sdk.secagg.binding)
    secure_min_survivors: int = 3  # the device's own t (DeviceSettings.secure_min_survivors)


class RoundWork:
    """Carries out instructions for one device: the round's progress, the forward pass, the phases."""

    def __init__(self, device: DeviceWork, *, limits: p.Limits, downloads: Downloads, memory: MemoryPolicy,
                 on_event: Callable[[str, dict], None]) -> None:
        self.device, self.limits, self.downloads, self.memory, self.on_event = device, limits, downloads, memory, on_event
        self.welcome: p.Welcome | None = None  # the server's latest (welcomed)
        self.progress: RoundProgress | None = None
        self._backends: dict[type[TrainingBackend], TrainingBackend] = {}
        self.updates = UpdateEncoder()  # the update codec's error feedback lives across rounds

    def welcomed(self, welcome: p.Welcome) -> None:
        """The server welcomed the device (at each hello): its plan is what the next rounds follow."""
        self.welcome = welcome

    def round(self, round_no: int) -> RoundProgress:
        """The progress of ``round_no``; the previous round's activations and updates are freed first."""
        if self.progress is None or self.progress.round != round_no:
            self.drop()
            self.progress = RoundProgress(round_no)
        return self.progress

    def drop(self) -> None:
        """Forget the round (it ended, or the server aborted it)."""
        prog, self.progress = self.progress, None
        if prog is not None and prog.activations is not None:
            with contextlib.suppress(Exception):
                prog.activations.close()

    async def report(self, ch: Channel, ins: p.Instruction) -> tuple[p.Report, bytes | None]:
        """The instruction's report and its encoded tensors: the phase runs once, a report made
        before a reconnect is the one sent again."""
        prog = self.round(ins.round)
        if ins.phase not in prog.reports:
            self.memory.busy()
            result: PhaseResult = await self.device.registry.run(_Phase(self, ch, ins, prog))
            num_samples = len(self.device.x) if result.num_samples is None else result.num_samples
            if result.tensors is not None and ins.config.get(p.SECAGG_KEY):
                payload = await self.masked(ch, ins, prog, result.tensors, num_samples)
            else:
                payload = None if result.tensors is None else self.updates.encode(result.tensors, ins.config)
            prog.reports[ins.phase] = (p.Report(ins.round, ins.phase, num_samples, result.trained,
                                                "" if payload is None else uuid.uuid4().hex, result.metrics,
                                                model_version=ins.model_version), payload)
            if not self.memory.keeps_freed_buffers:  # else after the upload, when idle
                self.memory.release()
        return prog.reports[ins.phase]

    async def masked(self, ch: Channel, ins: p.Instruction, prog: RoundProgress, tensors: Tensors,
                     num_samples: int) -> bytes:
        """A secure round's upload in place of the update (edge_sdk.secagg.exchange; cryptography loads here)."""
        from edge_sdk.secagg import exchange

        assert self.welcome is not None
        prog.secure = exchange.start(self.device.device_id, self.device.secret, ins, self.welcome.num_blocks,
                                     self.device.secure_min_survivors)
        return p.encode_tensors(await exchange.masked_update(ch, prog.secure, ins, tensors, num_samples))

    async def reveal(self, ch: Channel, msg: p.SecAggUnmask) -> str:
        """Answer a secure round's unmasking request, once; the refusal if the device refused it."""
        from edge_sdk.secagg import exchange

        prog = self.progress
        refused = await exchange.reveal(ch, None if prog is None else prog.secure, msg)
        if prog is not None and (refused or msg.signatures):  # answered for good (not only signed the set)
            prog.secure = None
        if refused:  # the device stays: the server's request, not the device, is at fault
            self.on_event("secagg_refused", {"device": self.device.device_id, "round": msg.round, "reason": refused})
        return refused

    def backend_for(self, ins: p.Instruction) -> TrainingBackend:
        """The backend that carries out ``ins`` (chosen once per instruction), built on first use."""
        chosen = choose_backend(self.device.backend, ins,
                                trains_graph=self.device.registry.selection(ins.selection).trains_graph)
        backend = self._backends.get(chosen)
        if backend is None:
            backend = self._backends[chosen] = chosen(threads=self.device.threads, warm_tails=self.device.warm_tails)
        return backend

    async def forward(self, ch: Channel, ins: p.Instruction, prog: RoundProgress, *, graph: bool) -> np.ndarray:
        """The input of block ``ins.split`` for every local sample (EmbracingFL Algorithm 1): the raw
        data, or the output of the frozen chunks run one at a time, each freed before the next."""
        from edge_sdk.forward import ActivationCache, ChunkRunner  # onnxruntime loads on first use

        welcome = self.welcome
        assert welcome is not None
        if prog.activations is None or tuple(ins.chunk_ids[: len(prog.chunks_done)]) != prog.chunks_done:
            if prog.activations is not None:
                prog.activations.close()
            prog.activations, prog.chunks_done = ActivationCache.from_array(self.device.x), ()
        # The planned split's chunks are the welcome's ranges, in order (a bundle's chunk of a range).
        ranges = dict(zip(ins.chunk_ids, welcome.chunks)) if ins.split == welcome.split else {}
        for cid in ins.chunk_ids[len(prog.chunks_done):]:
            # One copy as bytes, the receive buffer freed before the session parses it: a chunk
            # then costs its bytes plus ONNX Runtime's two copies (profiles.accounting frozen_copies).
            data = bytes(await self.fetch(ch, ins, prog, cid, block_range=ranges.get(cid)))
            t = time.monotonic()
            runner = ChunkRunner(data, threads=self.device.threads)
            del data
            prog.storage = self.memory.activation_storage(runner, len(self.device.x), graph=graph)
            previous = prog.activations
            prog.activations = await asyncio.to_thread(
                previous.apply, runner, batch_size=self.device.forward_batch or welcome.batch_size,
                storage=prog.storage, directory=self.memory.work_dir(),
            )
            runner.close()
            del runner
            self.memory.release()
            prog.chunks_done = (*prog.chunks_done, cid)
            prog.timings["forward_s"] += time.monotonic() - t
        return prog.activations.array

    async def fetch(self, ch: Channel, ins: p.Instruction, prog: RoundProgress, payload_id: str, *,
                    block_range: tuple[int, int] | None = None) -> memoryview:
        """One of the instruction's payloads, resumed within the round."""
        return await self.downloads.fetch(ch, ins.round, payload_id, prog.partial, prog.timings, block_range=block_range,
                                          sha256=ins.digests.get(payload_id, ""), slot=download_slot(ins, payload_id))

    async def tail(self, ch: Channel, ins: p.Instruction, prog: RoundProgress) -> tuple[TrainingBackend, Tail]:
        """The instruction's backend and the tail it prepared."""
        backend = self.backend_for(ins)
        return backend, await backend.prepare(_TailSource(self, ch, ins, prog, graph=backend.kind == "graph"))

    async def trained(self, ch: Channel, ins: p.Instruction, prog: RoundProgress) -> TrainedUpdate:
        """This round's update for the instruction's model payload: trained once, then reused."""
        done = prog.trained.get(ins.model_id)
        if done is not None:
            return done
        backend, tail = await self.tail(ch, ins, prog)
        t = time.monotonic()
        result = await asyncio.to_thread(backend.train, tail, self.device.y, self.train_config(ins))
        prog.timings["train_s"] += time.monotonic() - t
        deltas: Tensors = dict(result.deltas)
        for name, idx in tail.rows.items():
            deltas[name] = p.RowSparse(idx, deltas[name], tail.state[name].num_rows)
        losses = {"loss_before": result.loss_before, "loss_after": result.loss_after, "loss_steps": result.loss_steps}
        assert self.welcome is not None
        done = TrainedUpdate(deltas, result.num_samples, (ins.split, self.welcome.num_blocks),
                             {**{k: v for k, v in losses.items() if math.isfinite(v)},  # a loss not scored is left out
                              "steps": result.steps, "backend": backend.name})
        prog.trained[ins.model_id] = done
        return done

    async def evaluate(self, ch: Channel, ins: p.Instruction, prog: RoundProgress) -> dict[str, p.Scalar]:
        """Loss (and accuracy) of the received model on the local data, without training."""
        backend, tail = await self.tail(ch, ins, prog)
        t = time.monotonic()
        metrics = await asyncio.to_thread(backend.evaluate, tail, self.device.y, self.train_config(ins, evaluating=True))
        prog.timings["eval_s"] = prog.timings.get("eval_s", 0.0) + time.monotonic() - t
        return dict(metrics)

    def train_config(self, ins: p.Instruction, *, evaluating: bool = False):
        from edge_sdk.training import TrainConfig

        welcome = self.welcome
        assert welcome is not None
        # Samples of the loss a train report carries, before and after training: one batch, two
        # forward passes, a fraction of the training step's cost (a pass over 512 samples cost more
        # than 5 local steps of 32 train: a device's round time nearly doubled). The server averages
        # the reports, so its round loss still covers many batches. An evaluate phase scores 512.
        # A strategy may ask for another count (config "eval_samples").
        default = 512 if evaluating else welcome.batch_size
        return TrainConfig(
            local_steps=ins.local_steps, batch_size=welcome.batch_size, lr=ins.lr if ins.lr > 0 else 1e-3,
            momentum=float(welcome.config.get("momentum", 0.9)), weight_decay=float(welcome.config.get("weight_decay", 1e-4)),
            seed=device_seed(int(ins.config.get("seed", 0)), self.device.device_id), threads=self.device.threads,
            prox_mu=float(ins.config.get("prox_mu", 0.0)),
            eval_samples=max(1, int(ins.config.get("eval_samples", default))),
            loss_after=ins.config.get("loss_after", True) is not False,
        )


class _Phase:
    """The device as a phase handler sees it (:class:`edge_sdk.phases.PhaseContext`): one
    instruction on one connection, with the round's progress, so each step is done once per round."""

    def __init__(self, work: RoundWork, ch: Channel, ins: p.Instruction, prog: RoundProgress) -> None:
        self._work, self._ch, self._prog = work, ch, prog
        self.instruction = ins

    @property
    def device_id(self) -> str:
        return self._work.device.device_id

    @property
    def x(self) -> np.ndarray:
        return self._work.device.x

    @property
    def y(self) -> np.ndarray:
        return self._work.device.y

    @property
    def notes(self) -> dict[str, p.Scalar]:
        return self._prog.notes

    async def trained(self) -> TrainedUpdate:
        return await self._work.trained(self._ch, self.instruction, self._prog)

    async def evaluate(self) -> dict[str, p.Scalar]:
        return await self._work.evaluate(self._ch, self.instruction, self._prog)

    async def fetch_tensors(self, payload_id: str) -> Tensors:
        data = await self._work.fetch(self._ch, self.instruction, self._prog, payload_id)
        return p.decode_tensors(data, self._work.limits)

    def usage(self) -> dict[str, p.Scalar]:
        return {**{k: round(v, 6) for k, v in self._prog.timings.items()}, "peak_rss_bytes": peak_rss_bytes(),
                "storage": self._prog.storage}

    def event(self, kind: str, data: Mapping[str, object]) -> None:
        self._work.on_event(kind, dict(data))


class _TailSource:
    """What the instruction's backend prepares its tail from (:class:`edge_sdk.backends.TailInputs`)."""

    def __init__(self, work: RoundWork, ch: Channel, ins: p.Instruction, prog: RoundProgress, *, graph: bool) -> None:
        self._work, self._ch, self._prog, self._graph = work, ch, prog, graph
        self.instruction = ins
        self.limits = work.limits
        assert work.welcome is not None
        self.model = work.welcome.model

    def model_options(self) -> dict[str, float]:
        return self._work.device.registry.selection(self.instruction.selection).model_options(self.instruction)

    async def forward(self) -> np.ndarray:
        return await self._work.forward(self._ch, self.instruction, self._prog, graph=self._graph)

    async def fetch(self, payload_id: str) -> memoryview:
        return await self._work.fetch(self._ch, self.instruction, self._prog, payload_id)

    async def state(self) -> dict[str, np.ndarray | p.RowSparse]:
        return p.decode_tensors(await self.fetch(self.instruction.model_id), self.limits)
