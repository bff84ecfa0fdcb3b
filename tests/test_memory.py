"""A device's resident memory follows what it holds: freed heap memory goes back to the OS."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from edge_sdk.memory import _libc, cpu_seconds, peak_rss_bytes, process_memory, rss_bytes


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
    code = "from edge_sdk.memory import peak_rss_bytes; print(peak_rss_bytes())"
    child = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert child < 200 << 20 < peak_rss_bytes(), (child, peak_rss_bytes())
    del ballast


def test_memory_and_cpu_of_another_process_and_of_a_gone_one() -> None:
    """The emulator reads its devices' memory and CPU from outside, until they are gone."""
    code = "import sys; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); del b; sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while peak_rss_bytes(child.pid) < 64 << 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = process_memory(child.pid)
        # The 64 MiB were freed: the peak remembers them, the resident set need not.
        assert seen.peak_rss_bytes >= 64 << 20 and seen.peak_rss_bytes >= seen.rss_bytes > 0
        assert seen.vms_bytes >= seen.rss_bytes and rss_bytes(child.pid) > 0
        assert cpu_seconds(child.pid) >= 0.0
    finally:
        child.stdin.close()
        child.wait()
    for read in (rss_bytes, peak_rss_bytes, process_memory, cpu_seconds):
        with pytest.raises(ProcessLookupError):
            read(child.pid)
    assert peak_rss_bytes() >= rss_bytes() > 0 and cpu_seconds() > 0
