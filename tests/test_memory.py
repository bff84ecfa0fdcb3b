"""A device's resident memory follows what it holds: freed heap memory goes back to the OS."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edge_sdk.client import peak_rss_bytes
from edge_sdk.memory import _libc


@pytest.mark.skipif(_libc() is None, reason="no glibc-style allocator controls on this C library")
def test_release_memory_returns_freed_heap_to_the_os() -> None:
    # 256 KiB buffers come from the heap (below the 1 MiB mmap threshold); small live buffers
    # between them pin the heap, so freeing the large ones leaves their pages resident until
    # they are trimmed (as ONNX Runtime's and torch's freed buffers do on a device).
    code = (
        "import psutil\n"
        "from edge_sdk.memory import tune_allocator, release_memory\n"
        "assert tune_allocator()\n"
        "rss = lambda: psutil.Process().memory_info().rss >> 20\n"
        "held, pins = [], []\n"
        "for _ in range(800):\n"
        "    held.append(bytearray(b'x' * (256 << 10))); pins.append(bytearray(b'p' * 1024))\n"
        "del held\n"
        "before = rss(); release_memory(); after = rss()\n"
        "print(before, after)\n"
    )
    before, after = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                            check=True).stdout.split())
    assert before > 120 and before - after > 100, (before, after)


def test_peak_rss_is_this_process_not_its_parent() -> None:
    """ru_maxrss survives fork and exec; a device started by a large parent must not inherit it."""
    ballast = bytearray(300 << 20)  # the parent's peak is now above 300 MiB
    ballast[::4096] = b"x" * len(ballast[::4096])
    code = "from edge_sdk.client import peak_rss_bytes; print(peak_rss_bytes())"
    child = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert child < 200 << 20 < peak_rss_bytes(), (child, peak_rss_bytes())
    del ballast
