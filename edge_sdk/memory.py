"""Keep a device's resident memory close to what it actually holds (glibc's allocator).

A device streams large buffers one after another: ONNX chunks, activations, the tail, the update.
By default glibc raises its mmap threshold after the first large free, so later large buffers come
from the heap, and memory freed there stays in the process: the RSS ratchets up round after round
(measured: +40 MiB after one 16 MiB chunk session was closed) and a capped device dies of memory it
no longer uses. Fixing the threshold makes every large buffer its own mapping, returned to the OS
when freed; trimming after a phase hands back what is left in the heap. On other C libraries both
are no-ops.

Mapping every large buffer has a price: each activation and gradient of every training step is
faulted in anew (a ResNet20 round of 5 steps takes 267,000 minor faults and 1.7x the CPU it takes
with its buffers reused; mnist_cnn 1.3x). A device whose budget leaves room over its planned
footprint (:func:`may_keep_freed_buffers`) therefore keeps freed buffers in the heap for the next
step (:func:`keep_freed_buffers`), still trimmed after every phase; a device planned close to its
budget keeps the mappings. A server, whose memory must stay flat over a long run, keeps the
mappings too, except while it evaluates or trains a model itself (:class:`KeptHeap`): a ResNet20
evaluation of 2,000 images took 5.5 s with a mapping per buffer against 1.8 s with them reused.

It is also the one place where a process's memory and CPU are read (:func:`rss_bytes`,
:func:`peak_rss_bytes`, :func:`process_memory`, :func:`cpu_seconds`): through psutil, except the
resident high-water mark, which psutil has no accessor for.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import resource
import threading
from dataclasses import dataclass

import psutil

__all__ = ["KeptHeap", "ProcessMemory", "cpu_seconds", "peak_rss_bytes", "process_memory", "release_memory", "rss_bytes",
           "keep_freed_buffers", "may_keep_freed_buffers", "tune_allocator"]

_M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_MAPPED_THRESHOLD = 1 << 20  # every buffer of 1 MiB or more its own mapping
_DEFAULT_TRIM = 128 * 1024  # glibc's DEFAULT_TRIM_THRESHOLD: the heap's top shrinks on free past this
_KEPT_THRESHOLD = 32 << 20  # glibc's largest mmap threshold on 64 bits (DEFAULT_MMAP_THRESHOLD_MAX)
_KEPT_TRIM = 1 << 30  # the heap's top is kept until release_memory()

#: Room over the planned footprint, as a fraction of it, that a device needs before it keeps freed
#: buffers. Reusing them costs resident memory where freed buffers cannot be fitted again exactly: the
#: most measured is ResNet20's strong tail (split 0, 5 steps of 32, one training thread), whose peak
#: rose by 23 MiB, 6% of its 396 MiB footprint; mnist_cnn's by 1.4 MiB.
KEEP_HEADROOM = 0.25


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt  # noqa: B018  (glibc and a few others have it)
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def tune_allocator(mmap_threshold: int = _MAPPED_THRESHOLD, arenas: int = 2) -> bool:
    """Serve allocations of ``mmap_threshold`` bytes or more from their own mappings, and let the
    threads share ``arenas`` malloc arenas (glibc reserves 64 MiB of address space per arena, and
    scatters freed memory across them). True if applied."""
    libc = _libc()
    return bool(
        libc
        and libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(mmap_threshold))
        and libc.mallopt(_M_ARENA_MAX, ctypes.c_int(arenas))
    )


def may_keep_freed_buffers(budget_bytes: int, footprint_bytes: int) -> bool:
    """Whether a device with this budget and planned footprint (runtime included) has the room to
    keep freed buffers for reuse (:data:`KEEP_HEADROOM`)."""
    return footprint_bytes > 0 and budget_bytes - footprint_bytes >= KEEP_HEADROOM * footprint_bytes


def keep_freed_buffers(keep: bool) -> bool:
    """Keep large freed buffers in the heap for the next allocation (``keep``: no page faults on
    the next step's tensors, resident until :func:`release_memory`), or give each large buffer its
    own mapping, returned to the OS when freed (what :func:`tune_allocator` sets). True if applied."""
    libc = _libc()
    threshold, trim = (_KEPT_THRESHOLD, _KEPT_TRIM) if keep else (_MAPPED_THRESHOLD, _DEFAULT_TRIM)
    return bool(
        libc
        and libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(threshold))
        and libc.mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(trim))
    )


def release_memory() -> bool:
    """Return free heap memory to the OS (after a chunk session closes, after a round). True if any was."""
    libc = _libc()
    return bool(libc and libc.malloc_trim(ctypes.c_size_t(0)))


class KeptHeap:
    """Freed buffers kept for reuse while a burst of tensor work runs (``with kept_heap: ...``), in a
    process that otherwise maps every large buffer apart (:func:`tune_allocator`); when the last
    burst ends, each large buffer is its own mapping again and the heap is trimmed. Bursts may run
    in several threads at once and nest; enter each in the thread that does the work, which must
    still be alive when the trim runs (a pool's worker is)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0

    def __enter__(self) -> KeptHeap:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Start keeping freed buffers (or go on keeping them: one more holder)."""
        with self._lock:
            if self._depth == 0:
                keep_freed_buffers(True)
            self._depth += 1

    def release(self) -> None:
        """One holder less; the last one maps large buffers apart again and trims the heap."""
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                keep_freed_buffers(False)
                release_memory()

    @property
    def held(self) -> bool:
        return self._depth > 0


# -- what a process holds ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessMemory:
    """One reading of a process's memory, in bytes."""

    rss_bytes: int  # resident now
    vms_bytes: int  # virtual size (what RLIMIT_AS caps)
    peak_rss_bytes: int  # resident high-water mark


def _process(pid: int | None) -> psutil.Process:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        raise ProcessLookupError(f"no process {pid}") from None


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of process ``pid`` (default: this one). ProcessLookupError once it is gone."""
    try:
        return int(_process(pid).memory_info().rss)
    except psutil.NoSuchProcess:
        raise ProcessLookupError(f"no process {pid}") from None


def peak_rss_bytes(pid: int | None = None) -> int:
    """Peak resident set size of process ``pid`` (default: this one) so far.

    Linux's VmHWM belongs to the process's own address space. ``ru_maxrss`` is not used where
    VmHWM exists: it survives fork and exec, so a device started by a large parent would report
    the parent's peak as its own. Where there is no VmHWM, this process falls back to
    ``ru_maxrss`` and another process to its current RSS (the most that is known of its peak).
    A process that has ended (a zombie included) reads 0 if its RSS can no longer be read.
    """
    status = f"/proc/{'self' if pid is None else pid}/status"
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        if pid is not None:
            raise ProcessLookupError(f"no process {pid}") from None
    except (OSError, ValueError, IndexError):
        pass
    if pid is None or pid == os.getpid():
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    try:
        return rss_bytes(pid)
    except psutil.Error:  # AccessDenied: nothing is known
        return 0


def process_memory(pid: int | None = None) -> ProcessMemory:
    """RSS, virtual size and resident peak of process ``pid`` (default: this one) in one reading.

    ProcessLookupError once the process is gone. The peak is at least the RSS read with it."""
    try:
        info = _process(pid).memory_info()
    except psutil.NoSuchProcess:
        raise ProcessLookupError(f"no process {pid}") from None
    peak = peak_rss_bytes(pid)
    return ProcessMemory(int(info.rss), int(info.vms), max(peak, int(info.rss)))


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system, all threads) process ``pid`` (default: this one) has used so far.

    ProcessLookupError once the process is gone."""
    try:
        times = _process(pid).cpu_times()
    except psutil.NoSuchProcess:
        raise ProcessLookupError(f"no process {pid}") from None
    return float(times.user + times.system)
