"""A device's settings, declared once: each is a command-line option and a config-file key.

``python -m edge_sdk --config device.toml`` reads a TOML file whose keys are the options' names
without the leading dashes (``data-root = "/data"``; ``data_root`` works too); an option given on
the command line wins over the file, the file over the default. :class:`DeviceSettings` holds the
result, checked: a bad value is a :class:`SettingError` that names the option (``--budget``) or the
file's key (``device.toml: budget``), never a traceback.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_sdk.units import parse_size

__all__ = ["FOREVER", "LOG_FORMATS", "LOG_LEVELS", "DeviceSettings", "SettingError", "load_settings",
           "option_flag", "settings_fields"]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
#: ``reconnect-retries`` that never gives up (the default of a service).
FOREVER = -1


class SettingError(ValueError):
    """A setting's value is wrong; ``where`` names it as the user gave it (``--budget``, ``device.toml: budget``)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


def _opt(default: Any, help: str, *, kind: type = str, flag: str = "", choices: tuple[str, ...] = (),
         metavar: str = "", wrapper: bool = False) -> Any:
    """One setting: its default, help, value type, choices, and its name if not the field's."""
    meta = {"help": help, "kind": kind, "flag": flag, "choices": choices, "metavar": metavar, "wrapper": wrapper}
    if isinstance(default, list):
        return field(default_factory=list, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class DeviceSettings:
    """Everything a device process is told; field order is the order of ``--help``."""

    server: str = _opt("ws://127.0.0.1:8765", "orchestrator URL: ws://HOST:PORT, or wss://HOST:PORT for TLS",
                       metavar="URL")
    device_id: str = _opt("", "this device's id (required)", flag="id", metavar="ID")
    budget: int | None = _opt(None, "memory budget the device declares, e.g. 300MiB (default: what this "
                                    "machine offers)", kind=int, metavar="SIZE")
    backend: str = _opt("auto", "training backend: onnxruntime (training graphs, no torch), torch, or auto "
                                "(torch if installed)", choices=("auto", "onnxruntime", "torch"))
    data: str = _opt("digits", "local data: a folder of images in label subfolders, a .csv/.npz/.npy table, "
                               "package.module:function returning batches or a source, or a research dataset "
                               "name (split by --client/--num-clients, for emulation)", metavar="SOURCE")
    label_column: str = _opt("-1", "for a .csv/.npy table: the label column, an index or a header name",
                             metavar="COLUMN")
    image_size: str = _opt("", "for an image folder: resize every image to WIDTHxHEIGHT (default: the first "
                               "image's size)", metavar="WxH")
    image_mode: str = _opt("RGB", "for an image folder: RGB (3 channels) or L (grey, 1 channel)",
                           choices=("RGB", "L"))
    flatten: bool = _opt(False, "for an image folder: one flat row of pixels per image (for an MLP)", kind=bool)
    data_root: str = _opt("", "folder holding the research datasets (default: $EDGETRAIN_DATA)", metavar="DIR")
    data_limit: int | None = _opt(None, "use only the research dataset's first N training samples", kind=int,
                                  metavar="N")
    partition: str = _opt("iid", "research dataset split: iid, dirichlet:ALPHA or natural")
    client: int = _opt(0, "this device's index in the research dataset's split", kind=int)
    num_clients: int = _opt(1, "how many devices the research dataset is split across", kind=int)
    seed: int = _opt(0, "split seed (the same on every device)", kind=int)
    bundle: str = _opt("", "a bundle provisioned offline (edgetrain bundle): its chunks and training graph are used "
                           "instead of downloads wherever the server's have the same bytes", metavar="FILE")
    secret_file: str = _opt("", "file holding this device's enrolled credential (edgetrain device enroll); "
                                "each hello proves it without sending it", metavar="FILE")
    token: str = _opt("", "shared token the server expects (a lab setting)")
    tls_ca: str = _opt("", "for wss://: trust only this PEM file (a private CA or the server's self-signed "
                           "certificate); default: the system's", metavar="FILE")
    threads: int = _opt(1, "threads for ONNX Runtime and torch", kind=int)
    storage: str = _opt("auto", "where cached activations live", choices=("auto", "memory", "disk"))
    work_dir: str = _opt("", "folder for activations kept on disk (default: a temporary folder)", metavar="DIR")
    labels: list[str] = _opt([], "a label sent in the hello, for the server's strategy (e.g. priority=1); "
                                 "repeatable", kind=list, flag="label", metavar="KEY=VALUE")
    private_heat: float | None = _opt(None, "report which table rows the data touches as randomized-response "
                                            "bits with this epsilon (FedSubAvg's private heat)", kind=float,
                                      metavar="EPSILON")
    table_rows: list[str] = _opt([], "for --private-heat: rows of the sparse table input column COLUMN indexes; "
                                     "repeatable", kind=list, metavar="COLUMN=ROWS")
    registry: str = _opt("", "the phases and selections this device runs: an edge_sdk.phases.DeviceRegistry "
                             "(edge_sdk.algorithms.DEFAULT_REGISTRY extended with an algorithm's device-side steps)",
                         metavar="PACKAGE.MODULE:NAME")
    log_format: str = _opt("text", "log lines as human text or one JSON object each", choices=LOG_FORMATS)
    log_file: str = _opt("", "append the log to this file (default: standard error)", metavar="FILE")
    log_level: str = _opt("info", "least severe log level written", choices=LOG_LEVELS)
    json_events: bool = _opt(False, "events as JSON lines on standard output (for a supervisor)", kind=bool)
    reconnect_retries: int = _opt(FOREVER, "reconnect attempts in a row before giving up; -1: never give up",
                                  kind=int, metavar="N")
    reconnect_max_delay: float = _opt(30.0, "longest wait between reconnect attempts, in seconds (the wait "
                                            "doubles from 0.2 s, with jitter)", kind=float, metavar="SECONDS")
    once: bool = _opt(False, "exit when the server ends the run instead of waiting for the next one", kind=bool)
    debug: bool = _opt(False, "show the traceback of an error", kind=bool)
    device_class: str = _opt("", "declare the budget of a device class (profiles/devices) unless --budget is "
                                 "given", wrapper=True, metavar="CLASS")


def settings_fields(*, wrapper: bool = False) -> list[dataclasses.Field]:
    """The settings a command offers: ``wrapper`` adds those only ``edgetrain device`` knows."""
    return [f for f in dataclasses.fields(DeviceSettings) if wrapper or not f.metadata["wrapper"]]


def option_flag(f: dataclasses.Field) -> str:
    """The command-line name of a setting (``--data-root``); its config key drops the dashes."""
    return "--" + (f.metadata["flag"] or f.name).replace("_", "-")


def _convert(f: dataclasses.Field, value: Any, where: str) -> Any:
    kind, choices = f.metadata["kind"], f.metadata["choices"]
    if value is None:
        return None
    if kind is list:
        items = value if isinstance(value, (list, tuple)) else [value]
        if not all(isinstance(v, (str, int, float)) for v in items):
            raise SettingError(where, f"expected a list of KEY=VALUE strings, got {value!r}")
        return [str(v) for v in items]
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise SettingError(where, f"expected true or false, got {value!r}")
    if f.name == "budget":
        try:
            return parse_size(value)
        except ValueError as e:
            raise SettingError(where, str(e)) from None
    if kind in (int, float):
        if isinstance(value, bool):
            raise SettingError(where, f"expected a number, got {value!r}")
        try:
            return kind(value) if not isinstance(value, str) or kind is float else int(value.strip())
        except (TypeError, ValueError):
            raise SettingError(where, f"expected {'a whole number' if kind is int else 'a number'}, "
                                      f"got {value!r}") from None
    text = str(value)
    if choices and text not in choices:
        raise SettingError(where, f"expected one of {', '.join(choices)}, got {text!r}")
    return text


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        text = path.read_text()
    except OSError as e:
        raise SettingError("--config", f"cannot read {path}: {e.strerror or e}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SettingError(str(path), f"not valid TOML: {e}") from None


def load_settings(given: Mapping[str, Any], config: str | Path | None = None, *,
                  wrapper: bool = False) -> DeviceSettings:
    """The settings from command-line values ``given`` (by field name; None: not given) over the
    config file's over the defaults, each converted and checked."""
    fields = {f.name: f for f in settings_fields(wrapper=wrapper)}
    by_key = {option_flag(f)[2:]: f for f in fields.values()}
    values: dict[str, Any] = {}
    if config:
        path = Path(config)
        for key, value in _read_toml(path).items():
            f = by_key.get(str(key).replace("_", "-"))
            if f is None:
                raise SettingError(f"{path}", f"unknown key {key!r}; known: {', '.join(sorted(by_key))}")
            values[f.name] = _convert(f, value, f"{path}: {key}")
    for name, value in given.items():
        if value is not None and not (isinstance(value, (list, tuple)) and not value):
            values[name] = _convert(fields[name], value, option_flag(fields[name]))
    settings = DeviceSettings(**values)
    _check(settings, {n: (option_flag(fields[n]) if given.get(n) not in (None, [], ()) else
                          f"{config}: {option_flag(fields[n])[2:]}") for n in values})
    return settings


_URL = re.compile(r"^wss?://[^/\s]+", re.IGNORECASE)


def _check(s: DeviceSettings, where: Mapping[str, str]) -> None:
    """What a value alone cannot say: a URL's scheme, a missing id, numbers out of range."""
    def name(field_name: str) -> str:
        return where.get(field_name, option_flag(next(f for f in dataclasses.fields(s) if f.name == field_name)))

    if not _URL.match(s.server):
        raise SettingError(name("server"), f"{s.server!r} is not a websocket URL; write ws://HOST:PORT "
                                           "(or wss://HOST:PORT for TLS)")
    if not s.device_id.strip():
        raise SettingError(name("device_id"), "every device needs an id (--id, or id = \"...\" in the config file)")
    if s.budget is not None and s.budget <= 0:
        raise SettingError(name("budget"), f"must be positive, got {s.budget}")
    for field_name, low in (("threads", 1), ("num_clients", 1), ("client", 0), ("reconnect_retries", FOREVER)):
        if getattr(s, field_name) < low:
            raise SettingError(name(field_name), f"must be at least {low}, got {getattr(s, field_name)}")
    if s.reconnect_max_delay <= 0:
        raise SettingError(name("reconnect_max_delay"), f"must be positive, got {s.reconnect_max_delay}")
    if s.tls_ca and not s.server.lower().startswith("wss://"):
        raise SettingError(name("tls_ca"), f"is for a wss:// server, and {s.server!r} is not one")
    if s.image_size and not re.fullmatch(r"\d+x\d+", s.image_size):
        raise SettingError(name("image_size"), f"expected WIDTHxHEIGHT such as 32x32, got {s.image_size!r}")
