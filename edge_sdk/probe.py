"""A probe of the machine the SDK runs on: memory, a container's memory limit, usable cores.

A device reports this in its hello (its budget when none is declared); the planner turns it into
a role and split. Imports psutil only (no torch, no onnx), so it runs on the leanest device.

A process in a container or a capped cgroup sees the host's memory in ``/proc/meminfo`` but is
killed at its cgroup's limit, so the budget is the smaller of the two. cgroup v2 keeps the limit
in ``memory.max`` and v1 in ``memory.limit_in_bytes``; a limit set on an ancestor cgroup applies
too, so the probe walks up to the root and keeps the smallest. "max" (v2) and v1's page-rounded
2^63 mean no limit.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

__all__ = ["MachineProfile", "cgroup_memory_limit", "probe", "usable_cores"]

# Limits at or above this mean "unlimited" (cgroup v1 writes 2^63 rounded down to a page).
_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class MachineProfile:
    """What this machine offers a training process, in bytes and cores."""

    total_bytes: int  # physical memory
    available_bytes: int  # memory available without swapping (psutil's "available")
    cgroup_limit_bytes: int | None  # the tightest cgroup memory limit on this process, if any
    budget_bytes: int  # min(available, cgroup limit)
    cores: int  # logical cores this process may run on

    def to_dict(self) -> dict[str, int | None]:
        return asdict(self)


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 < value < _UNLIMITED else None


def _walk_limits(leaf: Path, root: Path, filename: str) -> list[int]:
    """Limits in ``filename`` from ``leaf`` up to ``root`` (both included), where set."""
    limits = []
    current = leaf
    while True:
        limit = _read_limit(current / filename)
        if limit is not None:
            limits.append(limit)
        if current == root or root not in current.parents:
            break
        current = current.parent
    return limits


def cgroup_memory_limit(
    *,
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
) -> int | None:
    """The tightest memory limit on this process's cgroup and its ancestors, or None.

    ``proc_cgroup`` and ``cgroup_root`` point at ``/proc/self/cgroup`` and the cgroup mount; both
    v1 (``N:memory:/path``, mounted at ``<root>/memory``) and v2 (``0::/path``, mounted at
    ``<root>`` or ``<root>/unified``) are read.
    """
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        relative = path.lstrip("/")
        if hierarchy == "0" and controllers == "":
            for mount in (cgroup_root, cgroup_root / "unified"):
                if (mount / "cgroup.controllers").exists():
                    limits += _walk_limits(mount / relative, mount, "memory.max")
        elif "memory" in controllers.split(","):
            mount = cgroup_root / "memory"
            limits += _walk_limits(mount / relative, mount, "memory.limit_in_bytes")
    return min(limits) if limits else None


def usable_cores() -> int:
    """Logical cores this process may run on (its CPU affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, psutil.cpu_count(logical=True) or 1)


def probe(
    *,
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
) -> MachineProfile:
    """Probe memory, the cgroup limit and cores of the machine this process runs on."""
    memory = psutil.virtual_memory()
    limit = cgroup_memory_limit(proc_cgroup=proc_cgroup, cgroup_root=cgroup_root)
    budget = memory.available if limit is None else min(memory.available, limit)
    return MachineProfile(
        total_bytes=memory.total,
        available_bytes=memory.available,
        cgroup_limit_bytes=limit,
        budget_bytes=budget,
        cores=usable_cores(),
    )
