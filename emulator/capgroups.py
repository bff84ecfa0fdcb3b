"""The cgroups that hold one capped device process: its limits set, its peak and OOM kills read.

:class:`~emulator.capping.CappedProcess` runs the process and watches it; this module owns the
cgroup side of its cap (:mod:`emulator.cgroups` knows where cgroups live and makes and removes
them):

- ``cgroup-v2``: one child cgroup with ``memory.max`` (``memory.swap.max = 0``, and a CPU share as
  ``cpu.max`` where the cpu controller is delegated); the peak is ``memory.peak`` (kernel 5.19+, else
  the sampled ``memory.current``), an OOM kill the ``oom_kill`` count of ``memory.events``.
- ``cgroup-v1``: a child of this process's memory cgroup with ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes`` so swap cannot dodge it); the peak is
  ``memory.max_usage_in_bytes``, an OOM kill the ``oom_kill`` count of ``memory.oom_control``.
- a CPU share without cgroup v2's ``cpu.max``: a child of the v1 ``cpu`` hierarchy with
  ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (whatever caps the memory, RLIMIT_AS included).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from emulator.cgroups import (
    CFS_PERIOD_US,
    cgroup_pids,
    kv_lines,
    make_cgroup,
    read_file,
    remove_cgroup,
    v1_dir,
    v2_parent,
    write_file,
)

__all__ = ["CapError", "CapGroups"]


class CapError(RuntimeError):
    """A memory cap could not be set up (mechanism unavailable, cgroup not writable, bad budget)."""


class CapGroups:
    """The memory and CPU cgroups of one capped process (none for the RLIMIT_AS mechanism, unless
    a CPU share needs the v1 ``cpu`` hierarchy)."""

    def __init__(self, mechanism: str, budget_bytes: int) -> None:
        self.mechanism, self.budget_bytes = mechanism, budget_bytes
        self.memory: Path | None = None
        self.cpu: Path | None = None
        self.cpu_mechanism = "none"  # "cgroup-v1" | "cgroup-v2" | "none": how the CPU share was applied
        self.cpu_share: float | None = None  # the share applied, None when not applied

    def create(self, cpu_share: float | None) -> list[bytes]:
        """Create the memory (and cpu) cgroups; return the cgroup.procs files the child must join."""
        files: list[bytes] = []
        budget = str(self.budget_bytes)
        if self.mechanism == "cgroup-v1":
            parent = v1_dir("memory")
            if parent is None:
                raise CapError("the cgroup v1 memory hierarchy disappeared")
            # memory.limit_in_bytes first: memsw may never be below it.
            self.memory = make_cgroup(parent, {"memory.limit_in_bytes": budget}, {"memory.memsw.limit_in_bytes": budget})
        elif self.mechanism == "cgroup-v2":
            parent = v2_parent("memory")
            if parent is None:
                raise CapError("the cgroup v2 memory controller disappeared")
            self.memory = make_cgroup(parent, {"memory.max": budget}, {"memory.swap.max": "0", "memory.oom.group": "1"})
            if cpu_share is not None and "cpu" in read_file(parent / "cgroup.subtree_control", "").split():
                self._v2_cpu(cpu_share)
        if self.memory is not None:
            files.append(os.fsencode(self.memory / "cgroup.procs"))
        if cpu_share is not None and self.cpu_mechanism == "none":
            files += self._v1_cpu(cpu_share)
        return files

    def _v2_cpu(self, cpu_share: float) -> None:
        assert self.memory is not None
        quota = max(1000, round(cpu_share * CFS_PERIOD_US))
        try:
            write_file(self.memory / "cpu.max", f"{quota} {CFS_PERIOD_US}")
        except OSError:
            return
        self.cpu_mechanism, self.cpu_share = "cgroup-v2", cpu_share

    def _v1_cpu(self, cpu_share: float) -> list[bytes]:
        parent = v1_dir("cpu")
        if parent is None or not (parent / "cpu.cfs_quota_us").exists():
            return []
        quota = max(1000, round(cpu_share * CFS_PERIOD_US))
        try:
            self.cpu = make_cgroup(parent, {"cpu.cfs_period_us": str(CFS_PERIOD_US), "cpu.cfs_quota_us": str(quota)})
        except OSError:
            self.cpu = None
            return []
        self.cpu_mechanism, self.cpu_share = "cgroup-v1", cpu_share
        return [os.fsencode(self.cpu / "cgroup.procs")]

    def has_peak(self) -> bool:
        """Whether the kernel keeps the memory high-water mark (else it is sampled)."""
        if self.memory is None:
            return False
        return self.mechanism == "cgroup-v1" or (self.memory / "memory.peak").exists()

    def current(self) -> int | None:
        """The memory the cgroup holds now (v2's ``memory.current``), None when unreadable."""
        if self.memory is None:
            return None
        try:
            return int(read_file(self.memory / "memory.current"))
        except (OSError, ValueError):
            return None

    def peak(self) -> int | None:
        """The kernel's high-water mark so far, None when it keeps none (or it is gone)."""
        if self.memory is None:
            return None
        name = "memory.max_usage_in_bytes" if self.mechanism == "cgroup-v1" else "memory.peak"
        text = read_file(self.memory / name, "")
        return int(text) if text.strip().isdigit() else None

    def outcome(self, returncode: int | None) -> tuple[int | None, bool]:
        """(the peak, whether the kernel OOM-killed a member), read once the process has ended."""
        cg = self.memory
        if cg is None:
            return None, False
        try:
            if self.mechanism == "cgroup-v1":
                peak = int(read_file(cg / "memory.max_usage_in_bytes"))
                control = kv_lines(read_file(cg / "memory.oom_control", ""))
                if "oom_kill" in control:
                    return peak, control["oom_kill"] > 0
                # kernels before 4.13: a failed charge and a SIGKILL
                return peak, int(read_file(cg / "memory.failcnt", "0")) > 0 and returncode == -signal.SIGKILL
            events = kv_lines(read_file(cg / "memory.events", ""))
            return self.peak(), events.get("oom_kill", 0) > 0
        except (OSError, ValueError):
            return None, False

    def kill_members(self) -> None:
        """SIGKILL everything in the cgroups: the device's own children share them."""
        for cg in (self.memory, self.cpu):
            if cg is not None:
                for pid in cgroup_pids(cg):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def remove(self) -> None:
        """Remove the cgroups (each kept for another try when it will not go yet)."""
        if self.memory is not None and remove_cgroup(self.memory):
            self.memory = None
        if self.cpu is not None and remove_cgroup(self.cpu):
            self.cpu = None
