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
import sys
import numpy as np
from edge_sdk.client import DeviceClient, DeviceConfig
from edge_sdk.memory import rss_bytes
config = DeviceConfig(server="ws://127.0.0.1:9", device_id="d", budget_bytes=1 << 30, trim_memory={trim})
DeviceClient(config, np.zeros((4, 3), dtype=np.float32), np.zeros(4, dtype=np.int64))
released = []
for _ in range(6):  # a 4 MiB tensor allocated, written and freed, as every training step does
    a = np.ones(1 << 19)
    held = rss_bytes()
    del a
    released.append(held - rss_bytes())
print(min(released[2:]))
"""


def _released(trim: bool) -> int:
    """Bytes a freed 4 MiB buffer gives back to the OS at once (after two warm-up rounds)."""
    out = subprocess.run([sys.executable, "-c", _CODE.format(trim=trim)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(_libc() is None, reason="no glibc-style allocator controls on this C library")
def test_a_device_maps_large_buffers_and_a_worker_reuses_them() -> None:
    # Read as resident memory, not page faults: with transparent huge pages a fresh 4 MiB mapping
    # faults in as two pages, so a fault count says little about which policy ran.
    assert _released(True) >= 3 << 20  # its own mapping: unmapped when freed, out of the budget at once
    assert _released(False) < 1 << 20  # from the heap: stays resident, reused by the next step
