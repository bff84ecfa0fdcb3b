"""A device's settings, one record: each is a field of :class:`DeviceSettings` under one name, which
is a command-line option, a config-file key, a row of the key table the JavaScript device reads, and
an attribute of the API (``DeviceClient(DeviceSettings(...), data)``); the emulator's launch record
is a typed subset of it.

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
- the API: an app builds the same record (``DeviceSettings(server, device_id, budget_bytes, ...)``),
  checked field by field when it is made; the API's own fields (an app's objects and tuning knobs:
  ``secret``, ``warm_tails``, ``hello_ext``...) are marked ``api=True`` and are neither options nor
  keys, and a few settings also take the object their text names (``registry``: a ``DeviceRegistry``
  for a reference; ``private_heat``: a ``PrivateHeat`` for an epsilon; a path for a file's text);
  ``DeviceConfig``, the API's record before this one, is the same class under its old name (with a
  DeprecationWarning);
- the emulator's ``DeviceLaunch``: :func:`settings_subset` derives it from the settings it holds (their
  types, defaults and checks), never declared twice;
- the key table of docs/device-guide.md (a test holds it equal to the declaration).

A field's name is its key with underscores (``data_root``, ``data-root``) unless the key is declared
(``device_id``: ``id``; ``labels``: ``label``; ``budget_bytes``: ``budget``; ``payload_cache_bytes``:
``payload-cache-size``), so config files and options keep their names. ``threads`` (the runtimes'
threads) and ``cores`` (the cores the hello declares to the planner) are two settings; ``budget_bytes``
and ``cores`` left unset are what this machine offers (:meth:`DeviceSettings.resolved`).

The reconnect policy is one for every way a device starts: a device is a service, so it retries
forever (``reconnect-retries = -1``), waiting 0.2 s doubling up to ``reconnect-max-delay`` (30 s),
with jitter.
"""

from __future__ import annotations

import dataclasses
import json
import os
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

__all__ = ["DEVICE_ID_PATTERN", "FOREVER", "MOVIELENS_TABLES", "SDKS", "TABLE_FILE", "DeviceSettings", "Pairs",
           "SettingError", "check_setting", "device_id_problem", "load_registry", "load_settings", "option_flag",
           "private_heat_of", "setting", "setting_default", "setting_key", "settings_fields", "settings_json",
           "check_subset", "settings_subset", "settings_table", "subset_settings"]

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
            wrapper: bool = False, check: Callable[[Any], None] | None = None, api: bool = False,
            resolved: tuple[type, ...] = (), repr: bool = True) -> Any:
    """One setting: its default and help; ``key`` its name if not the field's (``id``); ``sdks`` the
    device SDKs that honour it; ``wrapper`` an option only ``edgetrain device`` offers; ``check``
    what its type cannot say (raises ValueError with the problem); ``api`` a setting of the API
    only (an app's object, a tuning knob: no option, no key, no row of the key table);
    ``resolved`` the objects an app may hand instead of the text form (a ``DeviceRegistry`` for a
    reference to one), taken as they are."""
    meta = {"help": help, "key": key, "metavar": metavar, "sdks": sdks, "wrapper": wrapper, "check": check,
            "api": api, "resolved": resolved}
    if isinstance(default, (list, dict)):
        return field(default_factory=type(default), metadata=meta, repr=repr)
    return field(default=default, metadata=meta, repr=repr)


@dataclass(frozen=True)
class Pairs:
    """A ``dict[str, str]`` that text gives as a list of ``KEY=VALUE`` (``--label priority=1``)."""

    what: str = "KEY=VALUE"

    def parse(self, items: list[str]) -> dict[str, str]:
        out = {}
        for text in items:
            key, eq, value = text.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"expected {self.what}, got {text!r}")
            out[key.strip()] = value.strip()
        return out

    @staticmethod
    def show(pairs: Mapping[str, str]) -> list[str]:
        return [f"{k}={v}" for k, v in pairs.items()]


def _websocket_url(url: str) -> None:
    if not _URL.match(url):
        raise ValueError(f"{url!r} is not a websocket URL; write ws://HOST:PORT (or wss://HOST:PORT for TLS)")


def _backend(name: str) -> None:
    backend_class(name)  # a name of the table, auto, or a reference that loads (ValueError otherwise)


def _image_size(text: str) -> None:
    if text and not re.fullmatch(r"\d+x\d+", text):
        raise ValueError(f"expected WIDTHxHEIGHT such as 32x32, got {text!r}")


Labels = Annotated[dict[str, str], Pairs()]
#: A file or folder: text, or a path an app hands (``None``: not set).
FilePath = Union[str, None]
PATHS = (os.PathLike,)


@dataclass
class DeviceSettings:
    """Everything a device is told, one record for the command line, a config file and the API
    (``DeviceClient(DeviceSettings(...), data)``); field order is the order of ``--help``.

    Each field is one setting under one name: a config key and ``--option`` (its ``key``, or its
    name with dashes), a row of the key table, and an attribute of the API. Fields marked
    ``api=True`` belong to the API only. ``budget_bytes`` and ``cores`` left at None are what this
    machine offers (:meth:`budget`, :meth:`declared_cores`); ``threads`` are the runtimes' threads
    and ``cores`` the cores declared to the planner, two settings."""

    server: str = setting("ws://127.0.0.1:8765", "orchestrator URL: ws://HOST:PORT, or wss://HOST:PORT for TLS",
                          metavar="URL", sdks=BOTH, check=_websocket_url)
    device_id: str = setting("", "this device's id (required)", key="id", metavar="ID", sdks=BOTH)
    budget_bytes: Size | None = setting(None, "memory budget the device declares, e.g. 300MiB (default: what this "
                                              "machine offers)", key="budget", metavar="SIZE", sdks=BOTH)
    backend: str = setting("auto", f"training backend: {', '.join(backend_names())} (auto: the first this machine "
                                   "has, torch before onnxruntime; onnxruntime trains from training graphs without "
                                   "torch), or package.module:Class for a backend of your own", metavar="BACKEND",
                           check=_backend, resolved=(type,))
    data: str = setting("digits", "local data: a folder of images in label subfolders, a .csv/.npz/.npy table, "
                                  "a UTF-8 .txt file (next-character windows), "
                                  "package.module:function returning batches or a source, or a research dataset "
                                  "name (split by --client/--num-clients, for emulation)", metavar="SOURCE", sdks=BOTH)
    label_column: str = setting("-1", "for a .csv/.npy table: the label column, an index or a header name",
                                metavar="COLUMN", sdks=BOTH)
    vocabulary: str = setting("tinyshakespeare", "for a .txt file: the model's characters, a named vocabulary "
                                                 "(tinyshakespeare) or a UTF-8 file holding them", metavar="CHARS",
                              sdks=BOTH)
    text_context: Count = setting(40, "for a .txt file: characters per sample, the model's input length",
                                  metavar="N", sdks=BOTH)
    text_stride: Count = setting(8, "for a .txt file: a sample starts every N characters", metavar="N", sdks=BOTH)
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
    bundle: FilePath = setting(None, "a bundle provisioned offline (edgetrain bundle): its chunks and training graph "
                                     "are used instead of downloads wherever the server's have the same bytes",
                               metavar="FILE", resolved=PATHS)
    payload_cache: FilePath = setting("auto", "folder where downloaded payloads (chunks, training graphs, weights) "
                                              "are kept by sha256, so that a payload held from an earlier round or "
                                              "connection is never downloaded again and a changed one comes as a delta "
                                              "from the version held; auto: a folder of this device's own under the "
                                              "user's cache ($EDGETRAIN_PAYLOAD_CACHE, else "
                                              "~/.cache/edgetrain/payloads), one per server and device id; off: not "
                                              "kept", metavar="DIR", sdks=BOTH, resolved=PATHS)
    payload_cache_bytes: Size = setting(256 << 20, "the most bytes --payload-cache keeps (least recently used "
                                                   "dropped first)", key="payload-cache-size", metavar="SIZE", sdks=BOTH)
    secret_file: str = setting("", "file holding this device's enrolled credential (edgetrain device enroll); "
                                   "each hello proves it without sending it", metavar="FILE", sdks=BOTH)
    token: str = setting("", "shared token the server expects (a lab setting)", sdks=BOTH)
    secure_min_survivors: Annotated[int, Range(3)] = setting(
        3, "in secure rounds: the fewest devices whose sum of a block this device lets be unmasked; it refuses a "
           "round whose threshold is lower, and any unmasking request that would leave a block below it",
        metavar="N", sdks=BOTH)
    tls_ca: FilePath = setting(None, "for wss://: trust only this PEM file (a private CA or the server's self-signed "
                                     "certificate); default: the system's", metavar="FILE", sdks=BOTH, resolved=PATHS)
    threads: Count = setting(1, "threads for ONNX Runtime and torch", sdks=BOTH)
    cores: Count | None = setting(None, "CPU cores the device declares in its hello, for the server's planner "
                                        "(default: the cores this process may run on)", metavar="N", sdks=BOTH)
    storage: Literal["auto", "memory", "disk"] = setting("auto", "where cached activations live")
    work_dir: FilePath = setting(None, "folder for activations kept on disk (default: a temporary folder)",
                                 metavar="DIR", resolved=PATHS)
    labels: Labels = setting({}, "a label sent in the hello, for the server's strategy (e.g. priority=1); "
                                 "repeatable", key="label", metavar="KEY=VALUE", sdks=BOTH)
    private_heat: float | None = setting(  # epsilon > 0, checked by edge_sdk.privacy.PrivateHeat
        None, "report which table rows the data touches as randomized-response bits with this epsilon > 0 "
              "(FedSubAvg's private heat)", metavar="EPSILON", resolved=(PrivateHeat,))
    table_rows: list[str] = setting([], "for --private-heat: rows of the sparse table input column COLUMN indexes; "
                                        "repeatable", metavar="COLUMN=ROWS")
    registry: str = setting("", "the phases and selections this device runs: an edge_sdk.phases.DeviceRegistry "
                                "(edge_sdk.algorithms.DEFAULT_REGISTRY extended with an algorithm's device-side "
                                "steps)", metavar="PACKAGE.MODULE:NAME", resolved=(DeviceRegistry,))
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
    # -- the API's only ---------------------------------------------------------------------------
    secret: str = setting("", "this device's enrolled credential (--secret-file's content): each hello carries a "
                              "fresh proof of it, never the secret", api=True, repr=False)
    forward_batch: Annotated[int, Range(0)] = setting(0, "batch of the multi-step forward pass; 0: the planned "
                                                         "batch size", api=True)
    reconnect: bool = setting(True, "False: the first lost connection ends the device (as reconnect_retries = 0)",
                              api=True)
    frame_size: Count = setting(p.DEFAULT_FRAME_SIZE, "size of the frames this device sends", api=True)
    hello_ext: Any = setting({}, "extension fields sent in the hello as they are (Hello.ext: namespace.name -> "
                                 "value), for a strategy that declares them (Strategy.hello_fields)", api=True)
    warm_tails: Any = setting(None, "built tails kept between rounds (edge_sdk.warm_tails.WarmTails), shared by the "
                                    "devices of a process (an emulator's worker); None: built every round, freed "
                                    "after it", api=True)
    trim_memory: bool = setting(True, "return freed heap to the OS after each chunk and report (malloc_trim), and "
                                      "give every large buffer its own mapping unless the plan leaves room to keep "
                                      "them (edge_sdk.memory_policy); a process running many devices keeps its heap",
                                api=True)
    idle_trim_s: Annotated[float, Range(0)] = setting(
        2.0, "a device that keeps its freed buffers trims its heap once idle this long after a report, not at the "
             "report: back-to-back rounds reuse the buffers, an idle device still hands them back", api=True)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, f.metadata["resolved"] or ()):
                setattr(self, f.name, check_setting(f.name, value, f.name))
        _check(self, str, api=True)

    def resolved(self) -> DeviceSettings:
        """This record as a client runs it, what was left to the machine or named by text resolved:
        the budget and cores this machine offers, the registry loaded, private heat built from its
        epsilon, files as paths. ValueError naming what does not resolve."""
        def path(value: Any) -> Path | None:
            return None if value is None else Path(value)

        return dataclasses.replace(self, budget_bytes=self.declared_budget(), cores=self.declared_cores(),
                                   registry=self.device_registry(), private_heat=self.heat(),
                                   bundle=path(self.bundle), payload_cache=self.payload_folder(),
                                   work_dir=path(self.work_dir))

    def payload_folder(self) -> Path | None:
        """The folder this device keeps its payloads in: ``payload_cache`` as a path, ``auto`` a folder of its
        own per server and device id (:func:`edge_sdk.payload_store.payload_folder`), None for ``off``."""
        if isinstance(self.payload_cache, os.PathLike):
            return Path(self.payload_cache)
        from edge_sdk.payload_store import payload_folder

        return payload_folder(self.payload_cache or "", self.server, self.device_id)

    def declared_budget(self) -> int:
        """The budget this device declares: ``budget_bytes``, else what this machine offers."""
        if self.budget_bytes is not None:
            return self.budget_bytes
        from edge_sdk.probe import probe

        return probe().budget_bytes

    def declared_cores(self) -> int:
        """The cores this device declares: ``cores``, else those this process may run on."""
        if self.cores is not None:
            return self.cores
        from edge_sdk.probe import usable_cores

        return usable_cores()

    def device_registry(self) -> DeviceRegistry:
        """The phases and selections this device runs: ``registry`` (loaded where it is a reference)."""
        if isinstance(self.registry, DeviceRegistry):
            return self.registry
        return load_registry(self.registry)

    @property
    def budget(self) -> int | None:
        """``budget_bytes``, by the name this record's field had before the API joined it."""
        _renamed("budget", "budget_bytes")
        return self.budget_bytes

    @property
    def payload_cache_size(self) -> int:
        """``payload_cache_bytes``, by the name this record's field had before the API joined it."""
        _renamed("payload_cache_size", "payload_cache_bytes")
        return self.payload_cache_bytes

    def heat(self) -> PrivateHeat | None:
        """Private heat as the client runs it: ``private_heat`` (an epsilon, with ``table_rows``, or
        the PrivateHeat an app hands); None without it."""
        if self.private_heat is None or isinstance(self.private_heat, PrivateHeat):
            return self.private_heat
        return private_heat_of(self.private_heat, self.table_rows, self.data)


def _renamed(old: str, new: str) -> None:
    import warnings

    warnings.warn(f"DeviceSettings.{old} is DeviceSettings.{new} now (its config key and option keep their name)",
                  DeprecationWarning, stacklevel=3)


def load_registry(reference: str) -> DeviceRegistry:
    """The registry a reference names ("": :data:`edge_sdk.algorithms.DEFAULT_REGISTRY`); ValueError
    when it does not load or is no :class:`~edge_sdk.phases.DeviceRegistry`."""
    if not reference:
        return DEFAULT_REGISTRY
    from edge_sdk.references import load_reference

    registry = load_reference(reference, "--registry")
    if not isinstance(registry, DeviceRegistry):
        raise ValueError(f"--registry {reference!r} is a {type(registry).__name__}, not an "
                         "edge_sdk.phases.DeviceRegistry")
    return registry


#: Sparse tables by input column for data indexed like MovieLens latest-small (user, movie): the
#: zoo recommender's tables, so --private-heat needs no --table-rows there.
MOVIELENS_TABLES: dict[str, int] = {"0": 611, "1": 9_742}
_DATASET_TABLES: dict[str, dict[str, int]] = {"movielens": MOVIELENS_TABLES, "synthetic_ratings": MOVIELENS_TABLES}


def private_heat_of(epsilon: float | None, table_rows: list[str], data: str) -> PrivateHeat | None:
    """Private heat from ``--private-heat`` and ``--table-rows`` (None without them).

    The bit vector of a table has one bit per row, so the device must know each table's size: given,
    or the recommender's for MovieLens-indexed data. ValueError naming what is missing."""
    given: dict[str, int] = {}
    try:
        pairs = Pairs("COLUMN=ROWS").parse(list(table_rows))
    except ValueError as e:
        raise ValueError(f"--table-rows: {e}") from None
    for column, rows in pairs.items():
        if not column.isdigit() or not rows.isdigit() or int(rows) < 1:
            raise ValueError(f"--table-rows: expected COLUMN=ROWS with a column number and a row count, "
                             f"not {column}={rows}")
        given[str(int(column))] = int(rows)
    if epsilon is None:
        if given:
            raise ValueError("--table-rows is for --private-heat")
        return None
    tables = given or _DATASET_TABLES.get(data)
    if not tables:
        raise ValueError(f"--private-heat needs --table-rows COLUMN=ROWS for {data!r} data "
                         "(the sizes of the model's sparse tables)")
    try:
        return PrivateHeat(float(epsilon), tables)
    except ValueError as e:
        raise ValueError(f"--private-heat: {e}") from None


_FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(DeviceSettings)}
_HINTS: dict[str, Any] = get_type_hints(DeviceSettings, include_extras=True)
#: The settings with a key (every one but the API's own), by field name.
_KEYED: dict[str, dataclasses.Field] = {n: f for n, f in _FIELDS.items() if not f.metadata["api"]}


def _field(name: str) -> dataclasses.Field:
    """The setting a field name or a key names (``budget_bytes`` or ``budget``)."""
    if name in _FIELDS:
        return _FIELDS[name]
    key = name.replace("_", "-")
    for f in _KEYED.values():
        if setting_key(f) == key:
            return f
    raise KeyError(f"no setting {name!r}")


def settings_fields(*, wrapper: bool = False, sdk: str | None = None) -> list[dataclasses.Field]:
    """The settings a command offers as options (the API's own left out): ``wrapper`` adds those
    only ``edgetrain device`` knows; ``sdk`` keeps those that SDK honours (None: all)."""
    return [f for f in _KEYED.values()
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
    """``value`` of setting ``name`` (a field or its key) converted and checked as the declaration says (``text``: parse
    strings, as a command line or a config file gives them). SettingError naming ``where`` (the
    setting's key by default) otherwise."""
    f = _field(name)
    hint = _HINTS[f.name]
    base, extras = _inner(hint)
    pairs = next((e for e in extras if isinstance(e, Pairs)), None)
    if pairs is not None:
        hint = list[str]
    if pairs is not None and isinstance(value, Mapping):
        value = pairs.show(value)  # the API's dict, checked as the text it stands for
    elif _kind(hint) == "list" and not isinstance(value, (list, tuple)):
        value = [value]  # a single label in a config file
    elif base is str and isinstance(value, (int, float)) and not isinstance(value, bool) and text:
        value = str(value)  # label-column = 3
    try:
        out = convert(value, hint, text=text)
        if pairs is not None:
            out = pairs.parse(list(out))
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
    if get_origin(base) in (list, tuple) or any(isinstance(e, Pairs) for e in extras):
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
    for f in _KEYED.values():
        rows.append({"key": setting_key(f), "field": f.name, "type": setting_kind(f),
                     "default": _as_text(setting_default(f.name)),
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


def _as_text(value: Any) -> Any:
    """A setting's value as the key table and ``--print-settings`` write it (labels as KEY=VALUE, a
    path as its text)."""
    if isinstance(value, Mapping):
        return Pairs.show(value)
    if isinstance(value, (list, tuple)):
        return list(value)
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def settings_json(s: DeviceSettings) -> dict[str, Any]:
    """The resolved settings keyed by the table's keys (``--print-settings``)."""
    return {setting_key(f): _as_text(getattr(s, f.name)) for f in _KEYED.values()}


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
    """The settings from command-line values ``given`` (by field name or key; None: not given) over
    the config file's over the defaults, each converted and checked. A key of the table this device
    does not honour (the JavaScript device's) is accepted with a ``warn``ing."""
    by_key = {setting_key(f): f for f in _KEYED.values()}
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
        if name not in _KEYED:
            if str(name).replace("_", "-") not in by_key:
                raise SettingError(str(name), f"no such setting; known: {', '.join(sorted(by_key))}")
            name = by_key[str(name).replace("_", "-")].name
        if value is not None and not (isinstance(value, (list, tuple)) and not value):
            where[name] = option_flag(name)
            values[name] = check_setting(name, value, where[name], text=True)
    merged = types.SimpleNamespace(**{n: values.get(n, setting_default(n)) for n in _FIELDS})
    _check(merged, lambda n: where.get(n, option_flag(n)))
    return DeviceSettings(**values)


def settings_subset(*names: str, required: tuple[str, ...] = (), frozen: bool = True) -> Callable[[type], type]:
    """A class decorator: the class becomes a dataclass whose first fields are the settings `names`
    of :class:`DeviceSettings` (their types, defaults, help and repr, in that order; those of
    `required`, which lead `names`, without their defaults), followed by its own. A typed subset of the one record, derived, never declared twice: the emulator's
    launch record (:class:`emulator.launch.DeviceLaunch`) is one. The class's ``SETTINGS`` holds
    `names`; :func:`check_subset` checks them as the record does, :func:`subset_settings` gives
    them back for a :class:`DeviceSettings`."""
    unknown = [n for n in names if n not in _FIELDS]
    if unknown:
        raise ValueError(f"not settings of DeviceSettings: {unknown}")
    if tuple(names[:len(required)]) != tuple(required):
        raise ValueError(f"the required settings {required} must lead {names}")

    def derive(cls: type) -> type:
        own = dict(cls.__dict__.get("__annotations__", {}))
        clash = sorted(set(own) & set(names))
        if clash:
            raise TypeError(f"{cls.__name__} declares {clash} again: they are DeviceSettings' settings")
        cls.__annotations__ = {**{n: _HINTS[n] for n in names}, **own}
        for n in names:
            f = _FIELDS[n]
            kwargs: dict[str, Any] = {"metadata": f.metadata, "repr": f.repr}
            if n in required:
                pass
            elif f.default_factory is not dataclasses.MISSING:
                kwargs["default_factory"] = f.default_factory
            else:
                kwargs["default"] = f.default
            setattr(cls, n, field(**kwargs))
        cls.SETTINGS = tuple(names)  # type: ignore[attr-defined]
        return dataclass(frozen=frozen)(cls)

    return derive


def check_subset(record: Any, prefix: str) -> None:
    """Convert and check the settings of a :func:`settings_subset` record in place, as
    :class:`DeviceSettings` does; SettingError named ``<prefix>: <setting>``."""
    for name in type(record).SETTINGS:
        value = getattr(record, name)
        if not isinstance(value, _FIELDS[name].metadata["resolved"] or ()):
            object.__setattr__(record, name, check_setting(name, value, f"{prefix}: {name}"))


def subset_settings(record: Any) -> dict[str, Any]:
    """The settings a :func:`settings_subset` record holds, by name (``DeviceSettings(**these)``)."""
    return {name: getattr(record, name) for name in type(record).SETTINGS}


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


def _check(s: Any, name: Callable[[str], str], *, api: bool = False) -> None:
    """What one value alone cannot say: a missing id, a CA file without TLS; each named as the user
    gave it (``name``: a field's name to the option or key)."""
    if not api and not s.device_id.strip():
        raise SettingError(name("device_id"), "every device needs an id (--id, or id = \"...\" in the config file)")
    if s.device_id and (problem := device_id_problem(s.device_id)) is not None:  # the API may leave it unset
        raise SettingError(name("device_id"), problem)
    if s.tls_ca and not s.server.lower().startswith("wss://"):
        raise SettingError(name("tls_ca"), f"is for a wss:// server, and {s.server!r} is not one")


def __getattr__(name: str) -> Any:
    if name == "DeviceConfig":  # the API's record before the one record; kept for apps that import it
        import warnings

        warnings.warn("edge_sdk DeviceConfig is DeviceSettings now (one record for the API, the command line and "
                      "the config file; budget_bytes, cores, threads and the rest keep their names): import "
                      "DeviceSettings", DeprecationWarning, stacklevel=2)
        return DeviceSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
