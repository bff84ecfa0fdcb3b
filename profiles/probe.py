"""The machine probe, for code on the planning side: it lives in the device SDK (:mod:`edge_sdk.probe`),
since a device probes itself before it says hello."""

from __future__ import annotations

from edge_sdk.probe import MachineProfile, cgroup_memory_limit, probe, usable_cores

__all__ = ["MachineProfile", "cgroup_memory_limit", "probe", "usable_cores"]
