"""Device classes: what a kind of device brings to training, as data files.

Each class is a TOML file in ``profiles/devices/`` (``pi-zero-2w.toml`` is the class
``pi-zero-2w``)::

    name = "pi-zero-2w"              # must match the file name
    description = "Raspberry Pi Zero 2 W, 512 MiB board"
    ram = "512MiB"                   # total RAM (see profiles.units.parse_size)
    app_share = 0.65                 # the share of RAM one app may use: budget = ram x app_share
    cores = 4
    speed = 0.37                     # compute speed relative to a Raspberry Pi 4 (= 1.0)
    gpu = false                      # optional
    notes = "where the figures come from"

    [runtime]                        # optional: runtime figures measured on the device itself
    torch_onnxruntime = "210MiB"     # keys as in profiles.runtime.RUNTIME_FIELDS

``load_device_class`` also accepts the path of such a file, for classes kept outside the package.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profiles.runtime import RUNTIME_FIELDS
from profiles.units import format_size, parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "DeviceClass",
    "DeviceClassError",
    "device_classes",
    "device_names",
    "devices_dir",
    "load_device_class",
]

_KEYS = {"name", "description", "ram", "app_share", "cores", "speed", "gpu", "notes", "runtime"}
_REQUIRED = ("ram", "app_share", "cores", "speed")


class DeviceClassError(ValueError):
    """A device class that does not exist or whose file is malformed."""


@dataclass(frozen=True)
class DeviceClass:
    """A kind of device, and the memory budget the planner gives it."""

    name: str
    ram_bytes: int
    app_share: float
    cores: int
    speed: float
    description: str = ""
    notes: str = ""
    gpu: bool = False
    runtime_overrides: dict[str, int] = field(default_factory=dict)

    @property
    def budget_bytes(self) -> int:
        """What one app may use: RAM x app share."""
        return int(self.ram_bytes * self.app_share)

    def summary(self) -> str:
        return (
            f"{self.name}: {format_size(self.ram_bytes)} RAM x {self.app_share:g} = "
            f"{format_size(self.budget_bytes)} budget, {self.cores} cores, speed {self.speed:g}"
        )


def devices_dir() -> Path:
    """The folder of the device classes shipped with the package."""
    return Path(__file__).with_name("devices")


def device_names(directory: Path | None = None) -> list[str]:
    """Names of the known device classes, sorted."""
    folder = directory or devices_dir()
    return sorted(p.stem for p in folder.glob("*.toml"))


def load_device_class(name: str, *, directory: Path | None = None) -> DeviceClass:
    """The device class ``name`` (or the class in the TOML file at path ``name``).

    Raises :class:`DeviceClassError` listing the known names when there is no such class.
    """
    if name.endswith(".toml") or "/" in name or "\\" in name:
        return _load_file(Path(name), expected_name=None)
    folder = directory or devices_dir()
    path = folder / f"{name}.toml"
    if not path.is_file():
        known = device_names(folder)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise DeviceClassError(f"unknown device class {name!r}{hint}; known: {', '.join(known) or 'none'}")
    return _load_file(path, expected_name=name)


def device_classes(directory: Path | None = None) -> list[DeviceClass]:
    """Every known device class, smallest budget first."""
    folder = directory or devices_dir()
    classes = [load_device_class(n, directory=folder) for n in device_names(folder)]
    return sorted(classes, key=lambda d: (d.budget_bytes, d.name))


def _load_file(path: Path, *, expected_name: str | None) -> DeviceClass:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise DeviceClassError(f"{path}: no such device class file") from None
    except tomllib.TOMLDecodeError as e:
        raise DeviceClassError(f"{path}: not valid TOML: {e}") from None
    return _parse(data, path, expected_name or path.stem)


def _parse(data: dict[str, Any], path: Path, stem: str) -> DeviceClass:
    def fail(key: str, why: str) -> DeviceClassError:
        return DeviceClassError(f"{path}: {key}: {why}")

    unknown = set(data) - _KEYS
    if unknown:
        raise fail(sorted(unknown)[0], f"unknown key; known keys: {', '.join(sorted(_KEYS))}")
    for key in _REQUIRED:
        if key not in data:
            raise fail(key, "missing")
    name = data.get("name", stem)
    if name != stem:
        raise fail("name", f"{name!r} must match the file name {stem!r}")
    try:
        ram = parse_size(data["ram"])
    except ValueError as e:
        raise fail("ram", str(e)) from None
    if ram <= 0:
        raise fail("ram", "must be positive")
    share = data["app_share"]
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise fail("app_share", f"must be a number in (0, 1], not {share!r}")
    cores = data["cores"]
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise fail("cores", f"must be a positive integer, not {cores!r}")
    speed = data["speed"]
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or speed <= 0:
        raise fail("speed", f"must be a positive number, not {speed!r}")
    for key in ("description", "notes"):
        if not isinstance(data.get(key, ""), str):
            raise fail(key, "must be a string")
    gpu = data.get("gpu", False)
    if not isinstance(gpu, bool):
        raise fail("gpu", f"must be true or false, not {gpu!r}")
    runtime = data.get("runtime", {})
    if not isinstance(runtime, dict):
        raise fail("runtime", "must be a table of runtime figures")
    overrides: dict[str, int] = {}
    for key, value in runtime.items():
        if key not in RUNTIME_FIELDS:
            raise fail(f"runtime.{key}", f"unknown runtime figure; known: {', '.join(RUNTIME_FIELDS)}")
        try:
            overrides[key] = parse_size(value)
        except ValueError as e:
            raise fail(f"runtime.{key}", str(e)) from None
    return DeviceClass(
        name=name,
        ram_bytes=ram,
        app_share=float(share),
        cores=cores,
        speed=float(speed),
        description=data.get("description", ""),
        notes=data.get("notes", "").strip(),
        gpu=gpu,
        runtime_overrides=overrides,
    )
