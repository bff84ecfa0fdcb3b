"""Device emulation: emulated devices as OS processes under their class's memory cap, from fleet files.

One module per job, each importing only those listed before it:

- :mod:`~orchestrator.emulation.backends`: the emulation backends, one table (capped processes, lightweight
  workers, Ray actors), which a fleet's mode and ``--backend`` choose from.
- :mod:`~orchestrator.emulation.cgroups`: where cgroups live; making, removing and cleaning up a device's.
- :mod:`~orchestrator.emulation.capping`: one process under a hard memory cap (cgroup v2/v1, or RLIMIT_AS
  plus an RSS watchdog), with its measured peak and how it ended.
- :mod:`~orchestrator.emulation.fleet`: fleet files (which model, data and device mix to emulate) and their
  expansion into individual devices.
- :mod:`~orchestrator.emulation.faults`: drops, cut transfers and delays, applied around a device's connection.
- :mod:`~orchestrator.emulation.launch`: :class:`DeviceLaunch`, the typed record that starts one device.
- :mod:`~orchestrator.emulation.schedule`: a fleet's orchestrator settings, launches and drop schedule.
- :mod:`~orchestrator.emulation.device`: an emulated device's process (``python -m orchestrator.emulation.device``).
- :mod:`~orchestrator.emulation.recorder`: what a run learns about its devices, the same in both modes.
- :mod:`~orchestrator.emulation.supervisor`: the process mode (capped processes, RSS guard, restarts).
- :mod:`~orchestrator.emulation.lightweight`: the lightweight mode (many devices per worker process).
- :mod:`~orchestrator.emulation.runner`: a fleet run on the backend its mode and ``--backend`` name.

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
from orchestrator.emulation.faults import DeviceVanished, Faults
from orchestrator.emulation.fleet import (
    Behaviour,
    DeviceGroup,
    DeviceSpec,
    EmulationSettings,
    Fleet,
    FleetError,
    Partition,
    fleet_names,
    load_fleet,
    parse_fleet,
)
from orchestrator.emulation.launch import DeviceLaunch

__all__ = [
    "MEMORY_EXIT_CODE",
    "Behaviour",
    "CapError",
    "CapResult",
    "CappedProcess",
    "DeviceGroup",
    "DeviceLaunch",
    "DeviceSpec",
    "DeviceVanished",
    "EmulationSettings",
    "Faults",
    "Fleet",
    "FleetError",
    "Partition",
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
