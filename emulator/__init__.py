"""Device emulation: emulated devices as OS processes under their class's memory cap, from fleet files.

One module per job, each importing only those listed before it:

- :mod:`~emulator.cgroups`: where cgroups live; making, removing and cleaning up a device's.
- :mod:`~emulator.capgroups`: the cgroups of one capped process (limits, peak, OOM kills).
- :mod:`~emulator.capping`: one process under a hard memory cap (cgroup v2/v1, or RLIMIT_AS
  plus an RSS watchdog), with its measured peak and how it ended.
- :mod:`~emulator.fleet`: fleet files (which model, data and device mix to emulate) and their
  expansion into individual devices.
- :mod:`~emulator.faults`: drops, cut transfers and delays, applied around a device's connection.
- :mod:`~emulator.launch`: :class:`DeviceLaunch`, the typed record that starts one device, a
  subset of the device's settings (:class:`edge_sdk.settings.DeviceSettings`).
- :mod:`~emulator.schedule`: a fleet's orchestrator settings, launches and drop schedule.
- :mod:`~emulator.device`: an emulated device's process (``python -m emulator.device``).
- :mod:`~emulator.recorder`: what a run learns about its devices, the same on every backend.
- :mod:`~emulator.backend`: the emulation backend interface (:class:`EmulationBackend`: start,
  wait, cancel a fleet's devices; the options and requirements it declares).
- :mod:`~emulator.supervisor`: the ``processes`` backend (capped processes, RSS guard, restarts).
- :mod:`~emulator.lightweight`: the ``lightweight`` backend (many devices per worker process)
  and the worker process itself.
- :mod:`~emulator.ray_backend`: the ``ray`` backend (the lightweight workers as Ray actors).
- :mod:`~emulator.backends`: the emulation backends, one table (``EMULATION_BACKENDS``), which a
  fleet's mode and ``--backend`` choose from.
- :mod:`~emulator.runner`: a fleet run on the backend its mode and ``--backend`` name.

Importing this package imports neither torch nor onnx.
"""

from emulator.capping import (
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
from emulator.backend import BackendOption, EmulationBackend, EmulationFailed
from emulator.faults import DeviceVanished, Faults
from emulator.fleet import (
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
from emulator.launch import DeviceLaunch

__all__ = [
    "MEMORY_EXIT_CODE",
    "BackendOption",
    "Behaviour",
    "CapError",
    "CapResult",
    "CappedProcess",
    "DeviceGroup",
    "DeviceLaunch",
    "DeviceSpec",
    "DeviceVanished",
    "EmulationBackend",
    "EmulationFailed",
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
