"""What starts one emulated device: a typed record, handed as JSON to the process that runs it.

The local fleet, the capped emulator and the lightweight workers all start devices from a
:class:`DeviceLaunch`: a device process gets it as one JSON argument of
``python -m emulator.device`` (:func:`device_argv`), a lightweight worker inside its
spec file, and both use it as it is, never as a command line parsed back.

A launch is a typed subset of the device's one settings record
(:class:`edge_sdk.settings.DeviceSettings`, through
:func:`~edge_sdk.settings.settings_subset`): the settings it holds (:data:`LAUNCH_SETTINGS`: its
id, budget, data and split, class, threads and cores, backend, hello labels, credential) are that
record's fields, with their types, defaults and checks, never declared again, so a launch refuses
what ``python -m edge_sdk`` refuses and becomes the device's settings as it is
(:meth:`DeviceLaunch.settings`). What only an emulated device has follows: its faults and how its
fleet group shapes its data.

Imports only the device SDK's settings and :mod:`emulator.faults`: device processes load it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import asdict, field, fields
from pathlib import Path
from typing import Any

from edge_sdk.fileio import atomic_write
from edge_sdk.settings import check_subset, settings_subset, subset_settings
from emulator.faults import Faults

__all__ = ["LAUNCH_SETTINGS", "DeviceLaunch", "Faults", "device_argv"]

#: The device's settings a launch holds (edge_sdk.settings.DeviceSettings' fields), in its order:
#: ``DeviceLaunch(device_id, budget_bytes, client, num_clients, ...)``, the first four required.
LAUNCH_SETTINGS = ("device_id", "budget_bytes", "client", "num_clients", "data", "partition", "device_class", "seed",
                   "data_limit", "threads", "cores", "backend", "labels", "secret")
REQUIRED = LAUNCH_SETTINGS[:4]


@settings_subset(*LAUNCH_SETTINGS, required=REQUIRED)
class DeviceLaunch:
    """One emulated device: who it is, its budget, its share of the data and its faults.

    Its first fields are :data:`LAUNCH_SETTINGS` (``client``: the index of its data shard out of
    ``num_clients``; ``seed``: the partition seed, the same on every device, also the seed of drawn
    drops; ``labels``: hello labels from the fleet, which strategies such as FedALIGN and VaRSeL
    read; ``secret``: its enrolled credential, never in a repr or on a command line)."""

    faults: Faults = field(default_factory=Faults)
    # What the fleet group does to the device's shard (shape_data in emulator.device):
    # keep only these classes, at most max_samples of them, labels replaced with probability label_noise.
    classes: tuple[int, ...] = ()
    max_samples: int | None = None
    label_noise: float = 0.0

    def __post_init__(self) -> None:
        if not self.device_id:
            raise ValueError("a device needs an id")
        if isinstance(self.budget_bytes, bool) or int(self.budget_bytes) <= 0:
            raise ValueError(f"{self.device_id}: budget_bytes must be positive, got {self.budget_bytes!r}")
        check_subset(self, self.device_id)
        if not 0 <= self.client < self.num_clients:
            raise ValueError(f"{self.device_id}: client {self.client} outside [0, {self.num_clients})")
        if isinstance(self.faults, Mapping):  # from JSON
            object.__setattr__(self, "faults", Faults.from_dict(self.faults))
        object.__setattr__(self, "classes", tuple(self.classes))  # a list, from JSON
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in self.classes):
            raise ValueError(f"{self.device_id}: classes must be class indices >= 0, got {self.classes!r}")
        if self.max_samples is not None and (isinstance(self.max_samples, bool) or int(self.max_samples) < 1):
            raise ValueError(f"{self.device_id}: max_samples must be at least 1, got {self.max_samples!r}")
        if not 0.0 <= float(self.label_noise) <= 1.0:
            raise ValueError(f"{self.device_id}: label_noise must be in [0, 1], got {self.label_noise!r}")

    def settings(self) -> dict[str, Any]:
        """The device settings it holds, by name: ``DeviceSettings(server=..., **launch.settings())``."""
        return subset_settings(self)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["faults"] = self.faults.to_dict()
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DeviceLaunch:
        """A launch from its :meth:`to_dict` form; anything malformed raises ValueError naming it."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"a device launch is a JSON object, not {type(raw).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown fields in a device launch: {unknown}")
        try:
            return cls(**dict(raw))
        except TypeError as e:
            raise ValueError(f"not a device launch: {e}") from None

    @classmethod
    def from_json(cls, text: str) -> DeviceLaunch:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"a device launch is JSON: {e}") from None
        return cls.from_dict(raw)


def device_argv(launch: DeviceLaunch, server: str, *, data_root: str | None = None,
                python: str = sys.executable, launch_dir: Path | None = None) -> list[str]:
    """The command that runs ``launch`` against ``server`` as its own process, events as JSON lines.

    A launch holding a secret goes through a file in `launch_dir` (the run's directory), written
    by :func:`edge_sdk.fileio.atomic_write` (mode 0600): a command line is readable by every user."""
    given = launch.to_json()
    if launch.secret:
        if launch_dir is None:
            raise ValueError(f"{launch.device_id}: a launch with a secret needs a launch_dir to go through")
        path = Path(launch_dir) / f"{launch.device_id}.launch.json"
        atomic_write(path, given.encode(), durable=False)
        given = str(path)
    argv = [python, "-m", "emulator.device", given, "--server", server, "--json-events"]
    if data_root:
        argv += ["--data-root", str(data_root)]
    return argv
