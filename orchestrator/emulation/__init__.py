"""Device emulation: emulated devices as OS processes under their class's memory cap, from fleet files.

- :mod:`orchestrator.emulation.capping`: one process under a hard memory cap (cgroup v2/v1, or RLIMIT_AS
  plus an RSS watchdog), with its measured peak and how it ended.
- :mod:`orchestrator.emulation.fleet`: fleet files (which model, data and device mix to emulate) and their
  expansion into individual devices.

Importing this package imports neither torch nor onnx.
"""

from orchestrator.emulation.capping import (
    MEMORY_EXIT_CODE,
    CapError,
    CappedProcess,
    CapResult,
    apply_self_limit,
    available_mechanisms,
    cleanup_stale,
    cpu_throttle_status,
    find_cgroups,
    is_out_of_memory,
    mechanism_status,
)
from orchestrator.emulation.fleet import (
    Behaviour,
    DeviceGroup,
    DeviceSpec,
    EmulationSettings,
    Fleet,
    FleetError,
    Partition,
    TrainingSettings,
    fleet_names,
    load_fleet,
    parse_fleet,
)

__all__ = [
    "MEMORY_EXIT_CODE",
    "Behaviour",
    "CapError",
    "CapResult",
    "CappedProcess",
    "DeviceGroup",
    "DeviceSpec",
    "EmulationSettings",
    "Fleet",
    "FleetError",
    "Partition",
    "TrainingSettings",
    "apply_self_limit",
    "available_mechanisms",
    "cleanup_stale",
    "cpu_throttle_status",
    "find_cgroups",
    "fleet_names",
    "is_out_of_memory",
    "load_fleet",
    "mechanism_status",
    "parse_fleet",
]
