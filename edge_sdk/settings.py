"""A device's settings, declared once: each is a command-line option, a config-file key, a row of the
key table the JavaScript device reads, and where the API, the emulator's launch record and the
docs have the same setting, their default.

:class:`DeviceSettings` is the declaration: ``name: Type = setting(default, "help", ...)``. The type
carries the constraint (``Annotated[int, Range(1)]``, ``Literal[...]``, a size), checked by the one
converter of every setting, device and server (:mod:`edge_sdk.values`), and a bad value is the one
:class:`~edge_sdk.values.SettingError`, named as the user gave it (``--budget``, ``device.toml:
budget``). From it follow:

- ``python -m edge_sdk``'s and ``edgetrain device``'s options (:mod:`edge_sdk.cli`); a config file's
  keys are the options' names without their dashes (``data-root = "/data"``; ``data_root`` works
  too), an option on the command line wins over the file, the file over the default;
- ``edge_sdk/device_settings.json``, the key table (:func:`settings_table`): the JavaScript device
  parses the same file with it, and ``sdks`` says which device honours each key (a key the reading
  device does not honour is accepted with a warning); ``python -m edge_sdk.settings`` rewrites it;
- the defaults of :class:`DeviceConfig` (the API) and of the emulator's ``DeviceLaunch`` for the
  settings they share, and their checks (:func:`check_setting`);
- the key table of docs/device-guide.md (a test holds it equal to the declaration).

The reconnect policy is one for every way a device starts: a device is a service, so it retries
forever (``reconnect-retries = -1``), waiting 0.2 s doubling up to ``reconnect-max-delay`` (30 s),
with jitter.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from edge_sdk import protocol as p
from edge_sdk.algorithms import DEFAULT_REGISTRY
from edge_sdk.backends import backend_class, backend_names
from edge_sdk.phases import DeviceRegistry
from edge_sdk.privacy import PrivateHeat
from edge_sdk.values import ByteSize, Range, SettingError, convert, split_annotated

__all__ = ["DEVICE_ID_PATTERN", "FOREVER", "SDKS", "TABLE_FILE", "DeviceConfig", "DeviceSettings",
           "SettingError", "check_setting", "device_id_problem", "load_settings", "option_flag", "setting", "setting_default",
           "setting_key", "settings_fields", "settings_json", "settings_table"]

#: ``reconnect-retries`` that never gives up (the default: a device is a service).
FOREVER = -1
#: The device SDKs a key may be honoured by (``sdks`` of the key table).
SDKS = ("python", "javascript")
PYTHON, BOTH, JAVASCRIPT = ("python",), SDKS, ("javascript",)
#: The key table the JavaScript device reads, generated from :class:`DeviceSettings`.
TABLE_FILE = Path(__file__).resolve().with_name("device_settings.json")
TABLE_VERSION = 1

Size = Annotated[int, Range(1), ByteSize()]
Count = Annotated[int, Range(1)]
Index = Annotated[int, Range(0)]
_URL = re.compile(r"^wss?://[^/\s]+", re.IGNORECASE)


def setting(default: Any, help: str, *, key: str = "", metavar: str = "", sdks: tuple[str, ...] = PYTHON,
            wrapper: bool = False, check: Callable[[Any], None] | None = None) -> Any:
    """One setting: its default and help; ``key`` its name if not the field's (``id``); ``sdks`` the
    device SDKs that honour it; ``wrapper`` an option only ``edgetrain device`` offers; ``check``
    what its type cannot say (raises ValueError with the problem)."""
    meta = {"help": help, "key": key, "metavar": metavar, "sdks": sdks, "wrapper": wrapper, "check": check}
    if isinstance(default, list):
        return field(default_factory=list, metadata=meta)
    return field(default=default, metadata=meta)


def _websocket_url(url: str) -> None:
    if not _URL.match(url):
        raise ValueError(f"{url!r} is not a websocket URL; write ws://HOST:PORT (or wss://HOST:PORT for TLS)")


def _backend(name: str) -> None:
    backend_class(name)  # a name of the table, auto, or a reference that loads (ValueError otherwise)


def _image_size(text: str) -> None:
    if text and not re.fullmatch(r"\d+x\d+", text):
        raise ValueError(f"expected WIDTHxHEIGHT such as 32x32, got {text!r}")


@dataclass
class DeviceSettings:
    """Everything a device process is told; field order is the order of ``--help``."""

    server: str = setting("ws://127.0.0.1:8765", "orchestrator URL: ws://HOST:PORT, or wss://HOST:PORT for TLS",
                          metavar="URL", sdks=BOTH, check=_websocket_url)
    device_id: str = setting("", "this device's id (required)", key="id", metavar="ID", sdks=BOTH)
    budget: Size | None = setting(None, "memory budget the device declares, e.g. 300MiB (default: what this "
                                        "machine offers)", metavar="SIZE", sdks=BOTH)
    backend: str = setting("auto", f"training backend: {', '.join(backend_names())} (auto: the first this machine "
                                   "has, torch before onnxruntime; onnxruntime trains from training graphs without "
                                   "torch), or package.module:Class for a backend of your own", metavar="BACKEND",
                           check=_backend)
    data: str = setting("digits", "local data: a folder of images in label subfolders, a .csv/.npz/.npy table, "
                                  "package.module:function returning batches or a source, or a research dataset "
                                  "name (split by --client/--num-clients, for emulation)", metavar="SOURCE", sdks=BOTH)
    label_column: str = setting("-1", "for a .csv/.npy table: the label column, an index or a header name",
                                metavar="COLUMN", sdks=BOTH)
    image_size: str = setting("", "for an image folder: resize every image to WIDTHxHEIGHT (default: the first "
                                  "image's size)", metavar="WxH", check=_image_size)
    image_mode: Literal["RGB", "L"] = setting("RGB", "for an image folder: RGB (3 channels) or L (grey, 1 channel)")
    flatten: bool = setting(False, "for an image folder: one flat row of pixels per image (for an MLP)")
    data_root: str = setting("", "folder holding the research datasets (default: $EDGETRAIN_DATA)", metavar="DIR")
    data_limit: Count | None = setting(None, "use only the research dataset's first N training samples", metavar="N")
    partition: str = setting("iid", "research dataset split: iid, dirichlet:ALPHA or natural")
    client: Index = setting(0, "this device's index in the research dataset's split")
    num_clients: Count = setting(1, "how many devices the research dataset is split across")
    seed: int = setting(0, "split seed (the same on every device)")
    bundle: str = setting("", "a bundle provisioned offline (edgetrain bundle): its chunks and training graph are "
                              "used instead of downloads wherever the server's have the same bytes", metavar="FILE")
    payload_cache: str = setting("auto", "folder where downloaded payloads (chunks, training graphs, weights) are kept "
                                          "by sha256, so that a payload held from an earlier round or connection is "
                                          "never downloaded again and a changed one comes as a delta from the version "
                                          "held; auto: a folder of this device's own under the user's cache "
                                          "($EDGETRAIN_PAYLOAD_CACHE, else ~/.cache/edgetrain/payloads), one per "
                                          "server and device id; off: not kept", metavar="DIR", sdks=BOTH)
    payload_cache_size: Size = setting(256 << 20, "the most bytes --payload-cache keeps (least recently used "
                                                  "dropped first)", metavar="SIZE", sdks=BOTH)
    secret_file: str = setting("", "file holding this device's enrolled credential (edgetrain device enroll); "
                                   "each hello proves it without sending it", metavar="FILE", sdks=BOTH)
    token: str = setting("", "shared token the server expects (a lab setting)", sdks=BOTH)
    tls_ca: str = setting("", "for wss://: trust only this PEM file (a private CA or the server's self-signed "
                              "certificate); default: the system's", metavar="FILE", sdks=BOTH)
    threads: Count = setting(1, "threads for ONNX Runtime and torch", sdks=BOTH)
    storage: Literal["auto", "memory", "disk"] = setting("auto", "where cached activations live")
    work_dir: str = setting("", "folder for activations kept on disk (default: a temporary folder)", metavar="DIR")
    labels: list[str] = setting([], "a label sent in the hello, for the server's strategy (e.g. priority=1); "
                                    "repeatable", key="label", metavar="KEY=VALUE", sdks=BOTH)
    private_heat: float | None = setting(  # epsilon > 0, checked by edge_sdk.privacy.PrivateHeat
        None, "report which table rows the data touches as randomized-response bits with this epsilon > 0 "
              "(FedSubAvg's private heat)", metavar="EPSILON")
    table_rows: list[str] = setting([], "for --private-heat: rows of the sparse table input column COLUMN indexes; "
                                        "repeatable", metavar="COLUMN=ROWS")
    registry: str = setting("", "the phases and selections this device runs: an edge_sdk.phases.DeviceRegistry "
                                "(edge_sdk.algorithms.DEFAULT_REGISTRY extended with an algorithm's device-side "
                                "steps)", metavar="PACKAGE.MODULE:NAME")
    log_format: Literal["text", "json"] = setting("text", "log lines as human text or one JSON object each")
    log_file: str = setting("", "append the log to this file (default: standard error)", metavar="FILE")
    log_level: Literal["debug", "info", "warning", "error"] = setting("info", "least severe log level written")
    json_events: bool = setting(False, "events as JSON lines on standard output (for a supervisor)", sdks=BOTH)
    reconnect_retries: Annotated[int, Range(FOREVER)] = setting(
        FOREVER, "reconnect attempts in a row before giving up; -1: never give up (a service)", metavar="N",
        sdks=BOTH)
    reconnect_max_delay: Annotated[float, Range(0.1)] = setting(
        30.0, "longest wait between reconnect attempts, in seconds (the wait doubles from 0.2 s, with jitter)",
        metavar="SECONDS", sdks=BOTH)
    once: bool = setting(False, "exit when the server ends the run instead of waiting for the next one", sdks=BOTH)
    debug: bool = setting(False, "show the traceback of an error", sdks=BOTH)
    device_class: str = setting("", "a device class (profiles/devices), sent in the hello; edgetrain device "
                                    "declares its budget unless --budget is given", metavar="CLASS", sdks=BOTH,
                                wrapper=True)
    runtime: Literal["node", "web"] = setting("node", "the JavaScript device's ONNX Runtime: onnxruntime-node, or "
                                                      "onnxruntime-web for boards without a native build",
                                              sdks=JAVASCRIPT)
    pending: str = setting("", "the JavaScript device keeps an update the server has not acknowledged in this file, "
                               "to finish its round after a restart", metavar="FILE", sdks=JAVASCRIPT)


_FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(DeviceSettings)}
_HINTS: dict[str, Any] = get_type_hints(DeviceSettings, include_extras=True)


def settings_fields(*, wrapper: bool = False, sdk: str | None = None) -> list[dataclasses.Field]:
    """The settings a command offers as options: ``wrapper`` adds those only ``edgetrain device``
    knows; ``sdk`` keeps those that SDK honours (None: all)."""
    return [f for f in _FIELDS.values()
            if (wrapper or not f.metadata["wrapper"]) and (sdk is None or sdk in f.metadata["sdks"])]


def setting_key(f: dataclasses.Field | str) -> str:
    """A setting's key in a config file and the key table (``data-root``, ``id``)."""
    f = _FIELDS[f] if isinstance(f, str) else f
    return (f.metadata["key"] or f.name).replace("_", "-")


def option_flag(f: dataclasses.Field | str) -> str:
    """The command-line name of a setting (``--data-root``)."""
    return "--" + setting_key(f)


def setting_default(name: str) -> Any:
    """The declared default of setting ``name`` (the API and the launch record take theirs from here)."""
    f = _FIELDS[name]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def check_setting(name: str, value: Any, where: str | None = None, *, text: bool = False) -> Any:
    """``value`` of setting ``name`` converted and checked as the declaration says (``text``: parse
    strings, as a command line or a config file gives them). SettingError naming ``where`` (the
    setting's key by default) otherwise."""
    f, hint = _FIELDS[name], _HINTS[name]
    base = _base(hint)
    if _kind(hint) == "list" and not isinstance(value, (list, tuple)):
        value = [value]  # a single label in a config file
    elif base is str and isinstance(value, (int, float)) and not isinstance(value, bool) and text:
        value = str(value)  # label-column = 3
    try:
        out = convert(value, hint, text=text)
        if f.metadata["check"] is not None and out is not None:
            f.metadata["check"](out)
    except ValueError as exc:
        raise SettingError(where or setting_key(f), str(exc)) from None
    return list(out) if isinstance(out, tuple) else out


def _inner(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    """A hint's type and constraints, ``None`` left out (``Size | None`` is a size)."""
    base, extras = split_annotated(hint)
    if get_origin(base) in (Union, types.UnionType):
        base, extras = split_annotated(next(a for a in get_args(base) if a is not type(None)))
    return base, extras


def _base(hint: Any) -> Any:
    """The type of a hint without its constraint and without ``None``."""
    return _inner(hint)[0]


def _kind(hint: Any) -> str:
    """The key table's type of a hint: str, int, float, bool, size or list."""
    base, extras = _inner(hint)
    if any(isinstance(e, ByteSize) for e in extras):
        return "size"
    if get_origin(base) in (list, tuple):
        return "list"
    if get_origin(base) is Literal:
        return "str"
    return {bool: "bool", int: "int", float: "float"}.get(base, "str")


def _low(hint: Any) -> float | None:
    """The least value a hint accepts (None: unbounded, or an open bound)."""
    r = next((e for e in _inner(hint)[1] if isinstance(e, Range)), None)
    return None if r is None or r.low is None or r.low_open else r.low


def setting_kind(f: dataclasses.Field) -> str:
    """The key table's type of a setting: str, int, float, bool, size or list."""
    return _kind(_HINTS[f.name])


def setting_choices(f: dataclasses.Field) -> tuple[str, ...]:
    """The values a setting takes when it is one of a few (``Literal``); empty otherwise."""
    base = _base(_HINTS[f.name])
    return tuple(str(c) for c in get_args(base)) if get_origin(base) is Literal else ()


def settings_table() -> dict[str, Any]:
    """The key table (``edge_sdk/device_settings.json``): every setting as the JavaScript device parses it."""
    rows = []
    for f in _FIELDS.values():
        default = setting_default(f.name)
        rows.append({"key": setting_key(f), "field": f.name, "type": setting_kind(f),
                     "default": list(default) if isinstance(default, (list, tuple)) else default,
                     "choices": list(setting_choices(f)), "min": _low(_HINTS[f.name]), "help": f.metadata["help"],
                     "sdks": list(f.metadata["sdks"])})
    return {"version": TABLE_VERSION, "settings": rows}


def table_text() -> str:
    return json.dumps(settings_table(), indent=2, ensure_ascii=False) + "\n"


def settings_markdown() -> str:
    """The key table as docs/device-guide.md shows it (a test holds the two equal)."""
    def shown(value: Any) -> str:
        if value in (None, "", []):
            return ""
        return f"`{json.dumps(value) if isinstance(value, bool) else value}`"

    lines = ["| key (`--option`) | type | default | devices | what |", "|---|---|---|---|---|"]
    for row in settings_table()["settings"]:
        kind = ", ".join(row["choices"]) if row["choices"] else row["type"]
        where = "Python" if row["sdks"] == ["python"] else "JavaScript" if row["sdks"] == ["javascript"] else "both"
        help_text = row["help"].replace("|", "\\|")
        lines.append(f"| `{row['key']}` | {kind} | {shown(row['default'])} | {where} | {help_text} |")
    return "\n".join(lines) + "\n"


def settings_json(s: DeviceSettings) -> dict[str, Any]:
    """The resolved settings keyed by the table's keys (``--print-settings``)."""
    return {setting_key(f): getattr(s, f.name) for f in _FIELDS.values()}


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


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def load_settings(given: Mapping[str, Any], config: str | Path | None = None, *,
                  warn: Callable[[str], None] = _warn) -> DeviceSettings:
    """The settings from command-line values ``given`` (by field name; None: not given) over the
    config file's over the defaults, each converted and checked. A key of the table this device
    does not honour (the JavaScript device's) is accepted with a ``warn``ing."""
    by_key = {setting_key(f): f for f in _FIELDS.values()}
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    if config:
        path = Path(config)
        for key, value in _read_toml(path).items():
            f = by_key.get(str(key).replace("_", "-"))
            if f is None:
                raise SettingError(f"{path}", f"unknown key {key!r}; known: {', '.join(sorted(by_key))}")
            if "python" not in f.metadata["sdks"]:
                warn(f"{path}: {key}: a setting of the {' and '.join(f.metadata['sdks'])} device only; "
                     "this device ignores it")
            where[f.name] = f"{path}: {key}"
            values[f.name] = check_setting(f.name, value, where[f.name], text=True)
    for name, value in given.items():
        if value is not None and not (isinstance(value, (list, tuple)) and not value):
            where[name] = option_flag(name)
            values[name] = check_setting(name, value, where[name], text=True)
    settings = DeviceSettings(**values)
    _check(settings, where)
    return settings


#: The characters a device id may use (docs/protocol.md, "Device ids"): ASCII letters and digits, then
#: also ``. _ - : @ + =``, 1-128 characters, starting with a letter or digit. An id is journaled, shown on
#: the status page and names files, so no control character (NUL), no bidi control (U+202E), no space
#: and no path piece ("/", "\\", a leading ".") can be part of one.
DEVICE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}")


def device_id_problem(device_id: str) -> str | None:
    """Why ``device_id`` is not a device id (:data:`DEVICE_ID_PATTERN`), naming it safely; None if it is."""
    if DEVICE_ID_PATTERN.fullmatch(device_id):
        return None
    return (f"device id {ascii(device_id[:64])} is not 1-128 of A-Z a-z 0-9 . _ - : @ + = "
            "starting with a letter or digit")


def _check(s: DeviceSettings, where: Mapping[str, str]) -> None:
    """What one value alone cannot say: a missing id, a CA file without TLS."""
    def name(field_name: str) -> str:
        return where.get(field_name, option_flag(field_name))

    if not s.device_id.strip():
        raise SettingError(name("device_id"), "every device needs an id (--id, or id = \"...\" in the config file)")
    if (problem := device_id_problem(s.device_id)) is not None:
        raise SettingError(name("device_id"), problem)
    if s.tls_ca and not s.server.lower().startswith("wss://"):
        raise SettingError(name("tls_ca"), f"is for a wss:// server, and {s.server!r} is not one")


@dataclass
class DeviceConfig:
    """A device as an app configures it (``DeviceClient(config, data)``): the settings it shares with
    the command line take their defaults and checks from :class:`DeviceSettings`."""

    server: str
    device_id: str
    budget_bytes: int
    cores: int = 1
    device_class: str = setting_default("device_class")
    token: str = setting_default("token")  # the server's shared token (a lab setting), or:
    secret: str = ""  # this device's enrolled credential: each hello carries a fresh proof of it, not the secret
    labels: dict[str, str] = field(default_factory=dict)
    storage: str = setting_default("storage")  # where cached activations live: memory, disk, or auto (disk for weak devices)
    work_dir: Path | None = None
    threads: int = setting_default("threads")
    forward_batch: int = 0  # batch of the multi-step forward pass; 0: the planned batch size
    reconnect: bool = True  # False: the first lost connection ends the device (as reconnect_retries = 0)
    reconnect_retries: int = setting_default("reconnect_retries")  # in a row; -1 (FOREVER): a service
    reconnect_max_delay: float = setting_default("reconnect_max_delay")  # the longest wait between two attempts, s
    frame_size: int = p.DEFAULT_FRAME_SIZE
    tls_ca: str | None = None  # for a wss:// server: trust only this PEM file (private CA, self-signed)
    #: Training backend: a name of edge_sdk.backends.BACKENDS ("torch"; "onnxruntime": training graphs,
    #: never imports torch), "auto" (torch if it is installed, else onnxruntime), a reference
    #: "package.module:Class", or a TrainingBackend subclass. Its runtimes go in the hello.
    backend: Any = setting_default("backend")
    # Private row heat (FedSubAvg): send randomized-response bits and a decoy-padded download set
    # instead of the true rows (edge_sdk.privacy). None: declare the rows themselves.
    private_heat: PrivateHeat | None = None
    #: Extension fields sent in the hello as they are (``Hello.ext``: ``namespace.name`` -> value), for
    #: a strategy that declares them (``Strategy.hello_fields``).
    hello_ext: dict[str, object] = field(default_factory=dict)
    #: The phases, report hooks and selection kinds this device knows (edge_sdk.phases): the
    #: built-in ones and every algorithm's of edge_sdk.algorithms, unless extended or replaced.
    registry: DeviceRegistry = DEFAULT_REGISTRY
    #: Built tails kept between rounds (:class:`edge_sdk.warm_tails.WarmTails`), shared by the devices
    #: of a process (an emulator's worker); None: the tail is built every round and freed after it.
    warm_tails: Any = None
    #: Return freed heap to the OS after each chunk and report (malloc_trim), and give every large
    #: buffer its own mapping unless the plan leaves room to keep them (edge_sdk.memory_policy).
    #: A process running many devices (an emulator's worker) reuses the heap and keeps it.
    trim_memory: bool = True
    #: A device that keeps its freed buffers trims its heap once it has been idle this long after a
    #: report, not at the report itself: back-to-back rounds reuse the buffers (a trim and the page
    #: faults after it cost an emulated mnist_cnn device about a tenth of its round's CPU), and an
    #: idle device still hands them back.
    idle_trim_s: float = 2.0
    #: A bundle (edge_sdk.bundle) provisioned offline: its chunks and training graph are used instead
    #: of downloads whenever the server's payloads have the same bytes (sha256).
    bundle: Path | None = None
    #: Where payloads downloaded are kept by sha256 (edge_sdk.payload_store), so that none the
    #: device holds is downloaded again; None: not kept. ``payload_cache_bytes`` bounds it.
    payload_cache: Path | None = None
    payload_cache_bytes: int = setting_default("payload_cache_size")

    def __post_init__(self) -> None:
        for name in ("server", "device_class", "token", "storage", "threads", "reconnect_retries",
                     "reconnect_max_delay"):
            setattr(self, name, check_setting(name, getattr(self, name), name))
        if isinstance(self.backend, str):
            check_setting("backend", self.backend, "backend")
        self.payload_cache_bytes = check_setting("payload_cache_size", self.payload_cache_bytes, "payload_cache_bytes")
        if (problem := device_id_problem(self.device_id)) is not None:
            raise SettingError("device_id", problem)


def main(argv: list[str] | None = None) -> int:
    """``python -m edge_sdk.settings [--check | --markdown]``: rewrite edge_sdk/device_settings.json
    from the declaration (``--check``: exit 1 if it differs instead; ``--markdown``: print the key
    table of docs/device-guide.md)."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--markdown"]:
        print(settings_markdown(), end="")
        return 0
    if args == ["--check"]:
        same = TABLE_FILE.is_file() and TABLE_FILE.read_text() == table_text()
        print(f"{TABLE_FILE.name} {'matches' if same else 'differs from'} the declaration", file=sys.stderr)
        return 0 if same else 1
    TABLE_FILE.write_text(table_text())
    print(f"wrote {TABLE_FILE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
