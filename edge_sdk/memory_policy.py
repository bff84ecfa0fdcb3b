"""How a device keeps to its budget between the steps of a round (docs/architecture.md, "Budgets").

Three choices, made from the plan the server's welcome carries (its ``footprint_bytes``):

- where a chunk's cached activations live: in memory only if the whole cache fits beside the
  planned footprint, else on disk (a tail trained from a training graph reads a disk cache a batch
  at a time without keeping its pages resident, so there the cache goes to disk);
- the allocator (:mod:`edge_sdk.memory`): every large buffer its own mapping, returned when freed,
  unless the budget has room over the footprint (:func:`~edge_sdk.memory.may_keep_freed_buffers`):
  page faults on every large tensor of every step cost a device process a fifth to two fifths of
  its training CPU;
- when freed heap goes back to the OS: after each chunk and report, or, keeping freed buffers, once
  the device has been idle ``idle_trim_s`` after a report, so back-to-back rounds reuse them.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
from pathlib import Path

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.memory import keep_freed_buffers, may_keep_freed_buffers, release_memory, tune_allocator

__all__ = ["MemoryPolicy"]


class MemoryPolicy:
    """One device's memory choices. ``trim_memory`` False (many devices in one process, an emulator's
    worker) keeps the heap as it is and trims nothing."""

    def __init__(self, *, device_id: str, budget_bytes: int, storage: str = "auto", trim_memory: bool = True,
                 idle_trim_s: float = 2.0, work_dir: Path | None = None) -> None:
        self.device_id, self.budget_bytes, self.storage = device_id, budget_bytes, storage
        self.trim_memory, self.idle_trim_s, self._work_dir = trim_memory, idle_trim_s, work_dir
        if trim_memory:
            # Every large buffer its own mapping, returned when freed: what a budget wants until the
            # plan says how much of it the device needs (plan).
            tune_allocator()
        #: Whether freed large buffers stay in the heap for reuse until the next trim (the plan
        #: left room for it, edge_sdk.memory.may_keep_freed_buffers), or go back to the OS at once.
        self.keeps_freed_buffers = not trim_memory
        self.footprint_bytes: int | None = None  # the plan's peak bytes (runtime included), once welcomed
        self._idle_trim: asyncio.TimerHandle | None = None  # the pending trim after a report
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def plan(self, welcome: p.Welcome) -> None:
        """The server's plan arrived: reuse freed buffers where the budget has room over its footprint."""
        given = welcome.config.get("footprint_bytes")
        self.footprint_bytes = None if given is None else int(given)
        if self.trim_memory:
            keep = may_keep_freed_buffers(self.budget_bytes, self.planned_footprint())
            self.keeps_freed_buffers = keep_freed_buffers(keep) and keep

    def planned_footprint(self) -> int:
        """The plan's peak bytes (runtime included); the whole budget before a plan or without one."""
        return self.budget_bytes if self.footprint_bytes is None else self.footprint_bytes

    def activation_storage(self, runner, samples: int, *, graph: bool = False) -> str:
        """Keep a chunk's activations in memory only if they fit beside the plan's footprint.

        The planner counts one batch of cached activations (the rest on disk); the budget left over
        the planned footprint decides whether the whole cache may stay in memory. A tail trained from
        a training graph (``graph``) reads a disk cache a batch at a time (edge_sdk.forward.take_rows)."""
        if self.storage != "auto":
            return self.storage
        if graph or any(d is None for d in runner.output_shape):
            return "disk"
        need = samples * math.prod(runner.output_shape) * np.dtype(runner.output_dtype).itemsize
        return "memory" if need <= self.budget_bytes - self.planned_footprint() else "disk"

    def work_dir(self) -> Path:
        """Where activations kept on disk go: the configured folder, else a temporary one."""
        if self._work_dir is not None:
            self._work_dir.mkdir(parents=True, exist_ok=True)
            return self._work_dir
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"edgetrain-{self.device_id}-")
        return Path(self._tmp.name)

    def release(self) -> None:
        """Return freed heap to the OS now (after a chunk, or a report when not keeping buffers)."""
        if self.trim_memory:
            release_memory()

    def released_after_report(self) -> None:
        """A report is done: trim now, or, keeping freed buffers, once idle for ``idle_trim_s``."""
        if not self.trim_memory:
            return
        if not self.keeps_freed_buffers:
            self.release()
            return
        if self._idle_trim is not None:
            self._idle_trim.cancel()
        self._idle_trim = asyncio.get_running_loop().call_later(self.idle_trim_s, self._trim_when_idle)

    def _trim_when_idle(self) -> None:
        self._idle_trim = None
        self.release()

    def busy(self) -> None:
        """A phase starts: the buffers are about to be used again, no trim under it."""
        if self._idle_trim is not None:
            self._idle_trim.cancel()
            self._idle_trim = None

    def close(self) -> None:
        """Remove the temporary folder of activations, if one was made."""
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
