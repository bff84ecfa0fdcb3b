"""Planning: the server's one owner of budget arithmetic, over :mod:`profiles.planner`.

Every hello is planned here (once per distinct profile, :mod:`orchestrator.server.plancache`), on the
runtime its hello names (:data:`profiles.runtime.RUNTIMES`: a hello naming none is refused), and
every instruction that asks a device for more than its plan (a longer tail, more rows, another
model such as width reduction's) is checked here against the device's budget with the planner's
own footprint count for the device's runtime (:func:`profiles.planner.tail_footprint`), a chunk's
delta download rebuilt on the device counted where the server sends them
(:meth:`profiles.accounting.TrainingMemory.with_deltas`), and the update codec's encoding workspace
(:meth:`profiles.accounting.TrainingMemory.with_update_codec`: EDEN's fixed slice and signs). It also
keeps which splits have a training graph that exports and verifies (:attr:`Planning.graph_splits`).
A secure run's devices are planned with their secure round's memory
(:meth:`profiles.accounting.TrainingMemory.secured`: the masked words and the secure round's own
libraries), so a device that fits its plan fits its secure rounds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

from edge_sdk import protocol as p
from edge_sdk.models import LayeredModel
from exporters.train_export import TrainGraphCache, train_graph_refusal
from orchestrator.config import ServerConfig
from orchestrator.server.download_deltas import delta_bits
from orchestrator.server.plancache import PlanCache
from profiles.accounting import ModelCost, TrainingMemory
from profiles.planner import Plan, PlanError, plan_at, plan_split, tail_footprint
from profiles.runtime import Runtime, UnknownRuntime, device_runtime

__all__ = ["Planning"]

log = logging.getLogger("edgetrain.server")


class Planning:
    """Plans hellos, checks what strategies ask against budgets, tracks the shippable graph splits."""

    def __init__(self, config: ServerConfig, model: LayeredModel, cost: ModelCost, train_graphs: TrainGraphCache,
                 table_rows: Mapping[str, int], *, selects_rows: bool,
                 emit: Callable[[str, dict], None]) -> None:
        self.config = config
        self.model = model  # read only: block count and names; graph exports copy it
        self.cost = cost
        self.train_graphs = train_graphs
        self.table_rows = dict(table_rows)  # sparse table entry -> rows, for row-selecting strategies
        self.selects_rows = selects_rows
        self.emit = emit
        #: How the devices train, as far as memory goes: every plan and budget check counts with it.
        memory = TrainingMemory().with_deltas(delta_bits(config.download_delta)).with_update_codec(config.update_codec)
        self.memory = memory.secured() if config.secure_aggregation else memory
        # Splits with no static refusal, less those whose graph the export check refused (found on
        # first use and remembered on disk): a plan never names a graph that cannot be shipped.
        self.graph_splits = frozenset(k for k in range(len(model)) if train_graph_refusal(model, k) is None
                                      and train_graphs.known_refusal(model, k) is None)
        self.plans = PlanCache()  # hello profile -> plan: each distinct profile is planned once
        self._planning = asyncio.Lock()

    @staticmethod
    def runtime(hello: p.Hello) -> Runtime:
        """The runtime the device trains with; a hello naming no known runtime is refused."""
        try:
            return device_runtime(hello.runtimes)
        except UnknownRuntime as exc:
            raise p.ProtocolError("refused", str(exc)) from None

    def planned_rows(self, hello: p.Hello) -> dict[str, int]:
        """Rows per sparse table the device will hold, for a strategy that sends row selections
        (``selects_rows``, FedSubAvg): the rows it declared. Empty (whole tables) otherwise, since
        a strategy that sends tails sends every row."""
        if not self.selects_rows:
            return {}
        out: dict[str, int] = {}
        for entry, column in getattr(self.model, "sparse_inputs", {}).items():
            values = hello.rows.get(str(column))
            if values is not None:
                out[entry] = min(len(values), self.table_rows[entry])
        return out

    def plan_key(self, hello: p.Hello) -> tuple:
        """What a hello's plan depends on (:mod:`orchestrator.server.plancache`): equal keys, equal plans."""
        forced = hello.labels.get("force_split") if self.config.allow_forced_split else None
        return (self.config.model, self.config.planner_batch, hello.budget_bytes, hello.cores,
                self.runtime(hello).name, hello.num_samples, tuple(sorted(self.planned_rows(hello).items())), forced)

    async def shippable_plan(self, hello: p.Hello) -> Plan:
        """The device's plan, whose training graph (a graph runtime) exports and verifies.

        Planned once per profile (:meth:`plan_key`): a hello whose profile was planned before
        takes the cached plan (or refusal) without planning or checking a graph again.

        A split whose graph the export check refuses (ResNet20's stem: a weight gradient 1e-3 off)
        is dropped from :attr:`graph_splits` and the device planned again, so it gets the largest
        split with a shippable graph; when none fits its budget it is refused with the reasons.
        Exports run in a worker thread (seconds, once per split; cached on disk). Authenticated
        hellos only: planning may export.
        """
        key = self.plan_key(hello)
        if self.plans.peek(key) is None:
            # Off the event loop, one profile at a time: a burst of hellos of new profiles (a flood
            # of made-up budgets) waits here, not every connection's messages; hellos of a profile
            # planned while they waited take its plan, a hit (the miss is the hello that planned it).
            async with self._planning:
                cached = self.plans.get(key)
                if cached is None:
                    cached = await self._plan_shippable(hello)
                    self.plans.put(key, cached)
        else:
            cached = self.plans.get(key)
        if isinstance(cached, str):
            raise p.ProtocolError("refused", cached)
        return cached

    async def _plan_shippable(self, hello: p.Hello) -> Plan | str:
        """A new profile's plan, or why it is refused."""
        refused: list[str] = []
        while True:
            try:
                plan = await asyncio.to_thread(self._plan, hello)
            except PlanError as exc:
                return "; ".join([str(exc), *refused])
            if self.runtime(hello).needs_graph:
                reason = await asyncio.to_thread(self.train_graphs.refusal, self.model, plan.split, plan.adapters)
                if reason is not None:
                    self.refuse_graph(plan.split, reason)
                    refused.append(f"split {plan.split}: {reason}")
                    continue
            return plan

    def refuse_graph(self, split: int, reason: str) -> None:
        """Never plan a graph runtime's device at ``split`` again (its graph failed the export check)."""
        if split in self.graph_splits:
            self.graph_splits = self.graph_splits - {split}
            self.plans.clear()  # plans made with the split, and refusals made without it, are stale
            log.warning("training graph of split %d refused: %s", split, reason)
            self.emit("train_graph_refused", {"split": split, "reason": reason[:512]})

    def _plan(self, hello: p.Hello) -> Plan:
        """The planner's choice for this budget, or a split the device asked for where allowed.

        ``labels["force_split"]`` is honoured only when the server's configuration allows it
        (``allow_forced_split``: emulation and tests, e.g. make a weak device train the whole model
        to show that it cannot); otherwise the planner decides.
        """
        batch, rows, runtime = self.config.planner_batch, self.planned_rows(hello), self.runtime(hello)
        forced = hello.labels.get("force_split")
        if forced is None or not self.config.allow_forced_split:
            return plan_split(self.cost, hello.budget_bytes, batch, local_samples=hello.num_samples,
                              backends=(runtime.name,), graph_splits=self.graph_splits, rows=rows,
                              memory=self.memory)
        try:
            k = int(forced)
        except ValueError:
            raise p.ProtocolError("malformed", f"force_split must be an integer, not {forced!r}") from None
        if not 0 <= k < len(self.model):
            raise p.ProtocolError("malformed", f"force_split {k} outside [0, {len(self.model)})")
        if not runtime.can_train(k, self.graph_splits):
            raise p.ProtocolError("refused", f"split {k} of {self.cost.model} has no training graph and the device "
                                             "has no torch")
        return plan_at(self.cost, k, hello.budget_bytes, batch, backend=runtime.name,
                       local_samples=hello.num_samples, rows=rows, memory=self.memory)

    def fits(self, device_id: str, hello: p.Hello, plan: Plan, split: int, chunks: Sequence[tuple[int, int]],
             rows: Mapping[str, int] | None = None, cost: ModelCost | None = None, adapters: bool = False) -> bool:
        """Whether a longer tail than the plan's, more table rows, or another model's tail (``cost``:
        e.g. width reduction's narrow model) fits the device's budget, counted for the runtime the
        device was planned on (the server enforces budgets: a strategy may ask for more, e.g.
        FedAvg for the whole model, but a device is never sent more than it can hold)."""
        footprint = tail_footprint(cost or self.cost, split, self.config.planner_batch, backend=plan.backend,
                                   chunks=chunks, local_samples=hello.num_samples, rows=rows, memory=self.memory,
                                   adapters=adapters)
        if footprint.total <= hello.budget_bytes:
            return True
        self.emit("over_budget", {"device": device_id, "split": split, "planned_split": plan.split,
                                  "footprint_bytes": footprint.total, "budget_bytes": hello.budget_bytes})
        return False
