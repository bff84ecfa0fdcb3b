"""A device keeps glibc's large-buffer policy only where it returns its heap (DeviceConfig.trim_memory).

A device process (trim_memory, the default) gives every large buffer its own mapping, so a freed
tensor goes back to the OS at once, at the price of page faults on each large tensor of every step.
An emulator's worker runs many devices and keeps its heap: its large buffers are reused, not faulted
in again, for every training step of every device.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from edge_sdk.memory import _libc

_CODE = """
import resource, sys
import numpy as np
from edge_sdk.client import DeviceClient, DeviceConfig
config = DeviceConfig(server="ws://127.0.0.1:9", device_id="d", budget_bytes=1 << 30, trim_memory={trim})
DeviceClient(config, np.zeros((4, 3), dtype=np.float32), np.zeros(4, dtype=np.int64))
faults = []
for _ in range(6):  # a 4 MiB tensor allocated, written and freed, as every training step does
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(1 << 19)
    del a
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(min(faults[2:]))
"""


def _faults(trim: bool) -> int:
    out = subprocess.run([sys.executable, "-c", _CODE.format(trim=trim)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(_libc() is None, reason="no glibc-style allocator controls on this C library")
def test_a_device_maps_large_buffers_and_a_worker_reuses_them() -> None:
    pages = (4 << 20) // 4096
    assert _faults(True) >= pages // 2  # its own mapping, faulted in every time
    assert _faults(False) < pages // 8  # from the heap, already resident
