"""Keep a device's resident memory close to what it actually holds (glibc's allocator).

A device streams large buffers one after another: ONNX chunks, activations, the tail, the update.
By default glibc raises its mmap threshold after the first large free, so later large buffers come
from the heap, and memory freed there stays in the process: the RSS ratchets up round after round
(measured: +40 MiB after one 16 MiB chunk session was closed) and a capped device dies of memory it
no longer uses. Fixing the threshold makes every large buffer its own mapping, returned to the OS
when freed; trimming after a phase hands back what is left in the heap. On other C libraries both
are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_MMAP_THRESHOLD = -3  # mallopt parameters (malloc.h)
_M_ARENA_MAX = -8


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


def tune_allocator(mmap_threshold: int = 1 << 20, arenas: int = 2) -> bool:
    """Serve allocations of ``mmap_threshold`` bytes or more from their own mappings, and let the
    threads share ``arenas`` malloc arenas (glibc reserves 64 MiB of address space per arena, and
    scatters freed memory across them). True if applied."""
    libc = _libc()
    return bool(
        libc
        and libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(mmap_threshold))
        and libc.mallopt(_M_ARENA_MAX, ctypes.c_int(arenas))
    )


def release_memory() -> bool:
    """Return free heap memory to the OS (after a chunk session closes, after a round). True if any was."""
    libc = _libc()
    return bool(libc and libc.malloc_trim(ctypes.c_size_t(0)))
