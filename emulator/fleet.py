"""Fleet files: which model and data to train, and the mix of emulated devices that trains it.

A fleet is a TOML file (shipped ones live in ``profiles/fleets/``)::

    [fleet]
    name = "tiny-capped"                 # default: the file's stem
    description = "..."
    model = "digits_mlp"                 # a zoo model
    dataset = "digits"                   # a registered dataset (edge_sdk.data.DATASETS); default: the model's
    data_root = "../datasets"            # the folder holding the datasets, beside this file if relative
                                         # (default: $EDGETRAIN_DATA; edgetrain emulate --data-root wins)
    seed = 0

    [training]                           # settings of orchestrator.config.ServerConfig (TRAINING_SETTINGS)
    strategy = "embracingfl"
    rounds = 5
    fraction = 1.0                       # share of the devices sampled per round
    local_steps = 10
    batch_size = 32
    lr = 0.05
    lr_decay_at = [800, 900]             # lr times lr_decay after each of these rounds (default: none)
    lr_decay = 0.1
    momentum = 0.9
    weight_decay = 1e-4
    eval_source = "holdout.npz"          # the server's held-out set: a .npz/.npy/.csv file, package.module:function,
                                         # or "none" (default: the dataset's test split)
    norm_bound = 1.0                     # the server's checks (docs/security.md); 0 turns each off
    direction_trust = true               # weigh updates by their direction's agreement with the server's
    max_loss_rise = 1.0
    validation_samples = 1024            # held-out samples each round's validation scores (0: all)
    loss_after = true                    # devices score their loss after training (false: one pass less a round)

    [strategy]                           # the strategy's options (ServerConfig.strategy_options)
    epsilon = 0.3                        # e.g. fedalign's; varsel takes budget, internal_label, ...

    [partition]
    scheme = "dirichlet"                 # iid | dirichlet | natural
    alpha = 0.1                          # dirichlet only
    seed = 0                             # default: the fleet seed

    [emulation]
    mode = "processes"                   # processes (one capped OS process each) | lightweight
    memory_cap = "auto"                  # auto | cgroup-v2 | cgroup-v1 | rlimit-as+watchdog | none
    timeout_s = 600                      # per device process
    throttle_cpu = true                  # cpu_share = class speed x cpu_scale, at most the class's cores
    cpu_scale = 1.0

    [behaviour]                          # defaults for every group
    dropout = 0.0                        # probability of vanishing mid-round, per round a device is in
    drop_at = "model"                    # when it vanishes: "model" (once it holds the round's model) |
                                         # "upload" (trained, and in a secure round keys and shares sent)
    latency_ms = 0                       # extra network delay per message
    jitter_ms = 0                        # plus a uniform extra delay in [0, jitter_ms]
    rejoin_after_s = 30                  # reconnect this long after vanishing; absent: never

    [[groups]]
    name = "weak-pi-zero"                # default: the class name; device ids are <name>-<index>
    class = "pi-zero-2w"                 # a device class of profiles/devices/
    count = 112
    expect_role = "weak"                 # the role the planner should give (checked by the tests)
    budget = "256MiB"                    # override of the class's budget, or "runtime+30MiB": the
                                         # training runtime's memory on this machine plus that much
    force_split = 0                      # train blocks [k, L) whatever the planner says (0: full model)
    backend = "onnxruntime"              # the devices' training backend, as a device's --backend (default auto)
    priority = false                     # FedALIGN's priority devices (hello label priority=1)
    tags = ["internal"]                  # free labels, each sent as the hello label <tag>=1 (VaRSeL's
                                         # internal=1), or key:value as the label key=value
    classes = [0, 1, 2]                  # keep only these classes of each device's shard
    samples = 60                         # at most this many samples per device (a seeded subset)
    label_noise = 0.8                    # replace each label with a random class with this probability
    dropout = 0.1                        # any [behaviour] key, for this group only

:func:`load_fleet` validates every key and value and names the file and key in its errors;
:meth:`Fleet.devices` expands the groups into devices with stable ids and per-device seeds.
"""

from __future__ import annotations

import hashlib
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_sdk.data import DATASETS, dataset_spec
from edge_sdk.references import is_reference
from emulator.faults import DROP_POINTS
from orchestrator.config import TRAINING_SETTINGS, ServerConfig, SettingError

if TYPE_CHECKING:
    from profiles.runtime import RuntimeMemory

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "Behaviour",
    "DeviceGroup",
    "DeviceSpec",
    "EmulationSettings",
    "FLEETS_DIR",
    "Fleet",
    "FleetError",
    "Partition",
    "device_labels",
    "fleet_names",
    "fleet_path",
    "load_fleet",
    "parse_fleet",
]

FLEETS_DIR = Path(__file__).resolve().parents[1] / "profiles" / "fleets"
PARTITION_SCHEMES = ("iid", "dirichlet", "natural")
ROLES = ("strong", "moderate", "weak")
MEMORY_CAPS = ("auto", "cgroup-v2", "cgroup-v1", "rlimit-as+watchdog", "none")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_RELATIVE = re.compile(r"^\s*runtime\s*\+\s*(.+)$")
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$")


class FleetError(ValueError):
    """A fleet file that cannot be used; the message names the file and the key."""

    def __init__(self, source: str, key: str, message: str) -> None:
        self.source, self.key, self.message = source, key, message
        where = f"{source}: {key}: " if key else f"{source}: "
        super().__init__(where + message)


@dataclass(frozen=True)
class Behaviour:
    """How a device misbehaves on the network."""

    dropout: float = 0.0
    drop_at: str = "model"  # emulator.faults.DROP_POINTS
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    rejoin_after_s: float | None = None


@dataclass(frozen=True)
class Partition:
    """How the dataset is split across the devices (one shard per device, in fleet order)."""

    scheme: str = "iid"
    alpha: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class EmulationSettings:
    """How the emulator runs the devices."""

    mode: str = "processes"
    memory_cap: str = "auto"
    timeout_s: float = 600.0
    throttle_cpu: bool = True
    cpu_scale: float = 1.0  # cores of this machine per unit of class speed (pi-4-2gb has speed 1.0)


@dataclass(frozen=True)
class DeviceGroup:
    """`count` devices of one device class, with the class's figures already resolved."""

    name: str
    device_class: str
    count: int
    budget_bytes: int | None  # the override if given, else the class's budget; None: runtime-relative
    cores: int
    speed: float
    budget_override: bool = False
    budget_over_runtime: int | None = None  # budget = training runtime + this ("runtime+30MiB")
    runtime_overrides: Mapping[str, int] = field(default_factory=dict)  # the class's own runtime figures
    expect_role: str | None = None
    force_split: int | None = None
    priority: bool = False
    tags: tuple[str, ...] = ()
    behaviour: Behaviour = field(default_factory=Behaviour)
    classes: tuple[int, ...] = ()  # the shard's classes kept (empty: all)
    samples: int | None = None  # at most this many samples per device
    label_noise: float = 0.0  # probability of a random label
    backend: str = "auto"  # training backend (edge_sdk.backends), as a device's --backend


@dataclass(frozen=True)
class DeviceSpec:
    """One emulated device."""

    id: str  # <group>-<index within the group>, e.g. weak-pi-zero-007
    index: int  # position in the fleet; also the index of its data shard
    group: str
    device_class: str
    budget_bytes: int
    cores: int
    speed: float
    cpu_share: float | None  # None: not throttled
    expect_role: str | None
    force_split: int | None
    priority: bool
    tags: tuple[str, ...]
    behaviour: Behaviour
    seed: int
    classes: tuple[int, ...] = ()
    samples: int | None = None
    label_noise: float = 0.0
    backend: str = "auto"


@dataclass(frozen=True)
class Fleet:
    """A validated fleet file."""

    name: str
    description: str
    model: str
    dataset: str
    seed: int
    training: ServerConfig  # the [training] table: settings named in orchestrator.config.TRAINING_SETTINGS
    partition: Partition
    emulation: EmulationSettings
    groups: tuple[DeviceGroup, ...]
    path: Path | None = None
    strategy_options: Mapping[str, Any] = field(default_factory=dict)  # the [strategy] table
    data_root: str | None = None  # [fleet] data_root, resolved beside the file (None: not set)

    @property
    def num_devices(self) -> int:
        return sum(g.count for g in self.groups)

    def counts(self) -> dict[str, int]:
        """Devices per group name."""
        return {g.name: g.count for g in self.groups}

    def devices(self, runtime: RuntimeMemory | int | None = None) -> list[DeviceSpec]:
        """Every device, group by group; ids and seeds depend only on the fleet seed, the group name
        and the index in the group, so adding a group does not change the others' ids or seeds.

        `runtime` resolves ``budget = "runtime+..."`` groups: the runtimes' memory figures (the class's
        overrides applied), or the training runtime in bytes; by default measured on this machine
        (cached by :mod:`profiles.runtime`), and only when a group needs it."""
        out: list[DeviceSpec] = []
        for g in self.groups:
            budget = g.budget_bytes
            if budget is None:
                assert g.budget_over_runtime is not None
                if runtime is None:
                    from profiles.runtime import runtime_memory

                    runtime = runtime_memory()
                if isinstance(runtime, int):
                    budget = runtime + g.budget_over_runtime
                else:
                    from profiles.runtime import backend_runtime

                    figures = runtime.with_overrides(g.runtime_overrides)
                    budget = figures.for_backend(backend_runtime(g.backend).name) + g.budget_over_runtime
            width = max(3, len(str(g.count - 1)))
            share = None
            if self.emulation.throttle_cpu:
                share = min(g.speed * self.emulation.cpu_scale, float(g.cores))
            for i in range(g.count):
                device_id = f"{g.name}-{i:0{width}d}"
                out.append(
                    DeviceSpec(
                        id=device_id,
                        index=len(out),
                        group=g.name,
                        device_class=g.device_class,
                        budget_bytes=budget,
                        cores=g.cores,
                        speed=g.speed,
                        cpu_share=share,
                        expect_role=g.expect_role,
                        force_split=g.force_split,
                        priority=g.priority,
                        tags=g.tags,
                        behaviour=g.behaviour,
                        seed=device_seed(self.seed, device_id),
                        classes=g.classes,
                        samples=g.samples,
                        label_noise=g.label_noise,
                        backend=g.backend,
                    )
                )
        return out


def device_seed(fleet_seed: int, device_id: str) -> int:
    """A 31-bit seed from the fleet seed and the device id (stable across Python versions and runs)."""
    digest = hashlib.blake2b(f"{fleet_seed}/{device_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


# -- loading ---------------------------------------------------------------------------------------
def fleet_names() -> list[str]:
    """Names of the shipped fleets (``profiles/fleets/*.toml``)."""
    return sorted(p.stem for p in FLEETS_DIR.glob("*.toml"))


def fleet_path(name_or_path: str | Path) -> Path:
    """A fleet file's path: an existing path as is, else a shipped fleet's name."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    shipped = FLEETS_DIR / f"{p.name}.toml" if p.suffix != ".toml" else FLEETS_DIR / p.name
    if shipped.is_file() and len(p.parts) == 1:
        return shipped
    raise FleetError(str(name_or_path), "", f"no such fleet file; shipped fleets: {', '.join(fleet_names())}")


def load_fleet(path: str | Path) -> Fleet:
    """Read and validate a fleet file (a path, or the name of a shipped fleet such as ``tiny-capped``)."""
    p = fleet_path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise FleetError(str(p), "", f"not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise FleetError(str(p), "", f"cannot read: {e}") from None
    return parse_fleet(data, source=str(p), default_name=p.stem, path=p)


def parse_fleet(
    data: Mapping[str, Any], *, source: str = "<fleet>", default_name: str = "fleet", path: Path | None = None
) -> Fleet:
    """Validate a fleet already parsed from TOML (or built in code)."""
    r = _Reader(source)
    r.keys(data, "", {"fleet", "training", "strategy", "partition", "emulation", "behaviour", "groups"})
    head = r.table(data, "fleet", required=True)
    r.keys(head, "fleet", {"name", "description", "model", "dataset", "data_root", "seed"})
    name = r.string(head, "fleet.name", default_name)
    if not _NAME.match(name):
        r.fail("fleet.name", f"{name!r} must be lowercase letters, digits, '-' or '_'")
    model = r.string(head, "fleet.model", None)
    dataset = _check_model(r, model, head.get("dataset"))
    seed = r.integer(head, "fleet.seed", 0, minimum=0)
    root = r.string(head, "fleet.data_root", "") or None

    training = _training(r, r.table(data, "training"))
    if path is not None:
        training.eval_source = _beside(training.eval_source, path.parent)
        root = root and _beside(root, path.parent)
    strategy_options = _strategy_options(r, training.strategy, r.table(data, "strategy"))
    partition = _partition(r, r.table(data, "partition"), dataset, seed)
    emulation = _emulation(r, r.table(data, "emulation"))
    defaults = _behaviour(r, r.table(data, "behaviour"), "behaviour", Behaviour())

    raw_groups = data.get("groups")
    if not isinstance(raw_groups, list) or not raw_groups:
        r.fail("groups", "a fleet needs at least one [[groups]] table (class and count)")
    groups = tuple(_group(r, g, f"groups[{i}]", defaults) for i, g in enumerate(raw_groups))
    seen: dict[str, int] = {}
    for i, g in enumerate(groups):
        if g.name in seen:
            r.fail(
                f"groups[{i}].name",
                f"{g.name!r} is also the name of groups[{seen[g.name]}]; give each group a distinct name",
            )
        seen[g.name] = i
    return Fleet(
        name=name,
        description=r.string(head, "fleet.description", ""),
        model=model,
        dataset=dataset,
        seed=seed,
        training=training,
        partition=partition,
        emulation=emulation,
        groups=groups,
        path=path,
        strategy_options=strategy_options,
        data_root=root,
    )


def _strategy_options(r: _Reader, strategy: str, t: Mapping[str, Any]) -> dict[str, Any]:
    """The [strategy] table typed and checked against the strategy's constructor signature (not built)."""
    from orchestrator.strategies import strategy_options
    from orchestrator.strategies.options import StrategyOptionError

    try:
        return strategy_options(strategy, t)
    except StrategyOptionError as e:
        r.fail(f"strategy.{e.option}", e.problem)
    except ValueError as e:
        r.fail("training.strategy", str(e))


def device_labels(spec: DeviceSpec) -> dict[str, str]:
    """The hello labels a fleet gives a device: ``priority=1`` for a priority group, ``<tag>=1`` per
    tag, ``key=value`` for a tag written ``key:value``."""
    labels = {"priority": "1"} if spec.priority else {}
    for tag in spec.tags:
        key, sep, value = tag.partition(":")
        labels[key] = value if sep else "1"
    return labels


def _check_model(r: _Reader, model: str, dataset: Any) -> str:
    """The model is a zoo name or ``package.module:factory``; the dataset defaults to (and must be)
    the one the model trains on, must be given for a model that names none, and must be registered
    (``edge_sdk.data.DATASETS``: what a device can load)."""
    from edge_sdk.models.zoo import model_spec

    try:
        expected = model_spec(model).dataset
    except ValueError as exc:
        r.fail("fleet.model", str(exc))
    if dataset is None:
        if not expected:
            r.fail("fleet.dataset", f"model {model!r} names no dataset: give one")
        return expected
    if not isinstance(dataset, str):
        r.fail("fleet.dataset", f"must be a string, got {dataset!r}")
    if expected and dataset != expected:
        r.fail("fleet.dataset", f"model {model!r} trains on {expected!r}, not {dataset!r}")
    try:
        dataset_spec(dataset)
    except ValueError as exc:
        r.fail("fleet.dataset", str(exc))
    return dataset


def _training(r: _Reader, t: Mapping[str, Any]) -> ServerConfig:
    """The [training] table as the ServerConfig it sets (its values typed as TOML gives them: no text parsing)."""
    r.keys(t, "training", set(TRAINING_SETTINGS))
    try:
        return ServerConfig(**t)
    except SettingError as e:
        r.fail(f"training.{e.name}", e.problem)


def _beside(source: str, folder: Path) -> str:
    """A relative file named by a fleet file, as a path beside that file: the fleet runs the same
    from any working directory. References (``module:function``), ``none`` and absolute paths stay."""
    given = source.strip()
    if not given or given.lower() == "none" or is_reference(given) or Path(given).is_absolute():
        return source
    return str(folder / given)


def _partition(r: _Reader, t: Mapping[str, Any], dataset: str, fleet_seed: int) -> Partition:
    r.keys(t, "partition", {"scheme", "alpha", "seed"})
    scheme = r.string(t, "partition.scheme", "iid")
    if scheme not in PARTITION_SCHEMES:
        r.fail("partition.scheme", f"unknown scheme {scheme!r}; known: {', '.join(PARTITION_SCHEMES)}")
    alpha = None
    if scheme == "dirichlet":
        alpha = r.number(t, "partition.alpha", None, minimum=0.0)
        if alpha == 0.0:
            r.fail("partition.alpha", "must be positive (0.1 is EmbracingFL's non-IID setting)")
    elif "alpha" in t:
        r.fail("partition.alpha", f"only the dirichlet scheme takes alpha, not {scheme!r}")
    if scheme == "natural" and not dataset_spec(dataset).groups:
        natural = [d.name for d in DATASETS.values() if d.groups]
        r.fail("partition.scheme", f"dataset {dataset!r} has no natural clients; natural works with {', '.join(natural)}")
    return Partition(scheme, alpha, r.integer(t, "partition.seed", fleet_seed, minimum=0))


def _emulation(r: _Reader, t: Mapping[str, Any]) -> EmulationSettings:
    d = EmulationSettings()
    r.keys(t, "emulation", set(EmulationSettings.__dataclass_fields__))
    # A mode of the backend table (emulator.backends), which sits above this module: checked, with
    # the modes there are, where the fleet is matched to its backend, before anything starts.
    mode = r.string(t, "emulation.mode", d.mode)
    cap = r.string(t, "emulation.memory_cap", d.memory_cap)
    if cap not in MEMORY_CAPS:
        r.fail("emulation.memory_cap", f"unknown mechanism {cap!r}; known: {', '.join(MEMORY_CAPS)}")
    timeout = r.number(t, "emulation.timeout_s", d.timeout_s, minimum=0.0)
    if timeout == 0.0:
        r.fail("emulation.timeout_s", "must be positive: a capped process near its limit can thrash for minutes")
    scale = r.number(t, "emulation.cpu_scale", d.cpu_scale, minimum=0.0)
    if scale == 0.0:
        r.fail("emulation.cpu_scale", "must be positive (set throttle_cpu = false to turn throttling off)")
    return EmulationSettings(mode, cap, timeout, r.boolean(t, "emulation.throttle_cpu", d.throttle_cpu), scale)


_BEHAVIOUR_KEYS = set(Behaviour.__dataclass_fields__)


def _behaviour(r: _Reader, t: Mapping[str, Any], where: str, base: Behaviour) -> Behaviour:
    dropout = r.number(t, f"{where}.dropout", base.dropout, minimum=0.0)
    if dropout > 1.0:
        r.fail(f"{where}.dropout", f"is a probability in [0, 1], got {dropout}")
    rejoin = base.rejoin_after_s
    if "rejoin_after_s" in t:
        rejoin = r.number(t, f"{where}.rejoin_after_s", None, minimum=0.0)
    drop_at = r.string(t, f"{where}.drop_at", base.drop_at)
    if drop_at not in DROP_POINTS:
        r.fail(f"{where}.drop_at", f"is one of {', '.join(DROP_POINTS)}, got {drop_at!r}")
    return Behaviour(
        dropout=dropout, drop_at=drop_at,
        latency_ms=r.number(t, f"{where}.latency_ms", base.latency_ms, minimum=0.0),
        jitter_ms=r.number(t, f"{where}.jitter_ms", base.jitter_ms, minimum=0.0),
        rejoin_after_s=rejoin,
    )


def _group(r: _Reader, g: Any, where: str, defaults: Behaviour) -> DeviceGroup:
    if not isinstance(g, Mapping):
        r.fail(where, "must be a table ([[groups]])")
    r.keys(
        g,
        where,
        {"name", "class", "count", "budget", "expect_role", "force_split", "priority", "tags", "classes", "samples",
         "label_noise", "backend"} | _BEHAVIOUR_KEYS,
    )
    class_name = r.string(g, f"{where}.class", None)
    device_class = _device_class(r, class_name, f"{where}.class")
    name = r.string(g, f"{where}.name", class_name)
    if not _NAME.match(name):
        r.fail(f"{where}.name", f"{name!r} must be lowercase letters, digits, '-' or '_' (it starts device ids)")
    count = r.integer(g, f"{where}.count", None, minimum=1)
    budget: int | None = device_class.budget_bytes
    over_runtime = None
    if "budget" in g:
        raw = g["budget"]
        relative = _RELATIVE.match(raw) if isinstance(raw, str) else None
        if relative:
            budget, over_runtime = None, _size(r, relative.group(1), f"{where}.budget")
        else:
            try:
                budget = _size(r, raw, f"{where}.budget")
            except FleetError as e:
                r.fail(e.key, f"{e.message}; or write \"runtime+<size>\" for the runtime's memory plus a size")
    role = g.get("expect_role")
    if role is not None and role not in ROLES:
        r.fail(f"{where}.expect_role", f"unknown role {role!r}; known: {', '.join(ROLES)}")
    force_split = None
    if "force_split" in g:
        force_split = r.integer(g, f"{where}.force_split", None, minimum=0)
    tags = g.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) and _TAG.match(t) for t in tags):
        r.fail(f"{where}.tags", f"must be a list of short labels (letters, digits, '_.:-'), got {tags!r}")
    if len(set(tags)) != len(tags):
        r.fail(f"{where}.tags", f"has duplicates: {tags!r}")
    classes = g.get("classes", [])
    if (not isinstance(classes, list) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                                   for c in classes) or len(set(classes)) != len(classes)):
        r.fail(f"{where}.classes", f"must be a list of distinct class indices >= 0, got {classes!r}")
    samples = r.integer(g, f"{where}.samples", None, minimum=1) if "samples" in g else None
    noise = g.get("label_noise", 0.0)
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not 0.0 <= float(noise) <= 1.0:
        r.fail(f"{where}.label_noise", f"must be a probability in [0, 1], got {noise!r}")
    return DeviceGroup(
        name=name,
        device_class=device_class.name,
        count=count,
        budget_bytes=budget,
        cores=int(device_class.cores),
        speed=float(device_class.speed),
        budget_override="budget" in g,
        budget_over_runtime=over_runtime,
        runtime_overrides=dict(device_class.runtime_overrides),
        expect_role=role,
        force_split=force_split,
        priority=r.boolean(g, f"{where}.priority", False),
        tags=tuple(tags),
        behaviour=_behaviour(r, g, where, defaults),
        classes=tuple(classes),
        samples=samples,
        label_noise=float(noise),
        backend=_backend(r, g, f"{where}.backend"),
    )


def _backend(r: _Reader, g: Mapping[str, Any], key: str) -> str:
    """A group's training backend, checked as a device's --backend is (edge_sdk.settings)."""
    from edge_sdk.settings import check_setting, setting_default

    try:
        return check_setting("backend", g.get("backend", setting_default("backend")))
    except SettingError as e:
        r.fail(key, e.problem)


def _device_class(r: _Reader, name: str, key: str) -> Any:
    from profiles.devices import load_device_class

    try:
        return load_device_class(name)
    except (KeyError, ValueError, LookupError) as e:
        r.fail(key, str(e.args[0]) if e.args else f"unknown device class {name!r}")


def _size(r: _Reader, value: Any, key: str) -> int:
    from profiles.units import parse_size

    if isinstance(value, float) or isinstance(value, bool):
        r.fail(key, f"write a size such as \"512MiB\" or a whole number of bytes, got {value!r}")
    try:
        size = parse_size(value)
    except ValueError as e:
        r.fail(key, str(e))
    if size <= 0:
        r.fail(key, f"must be positive, got {value!r}")
    return size


class _Reader:
    """Typed reads of TOML values that fail with the file and the dotted key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, message: str) -> Any:
        raise FleetError(self.source, key, message)

    def keys(self, table: Mapping[str, Any], where: str, allowed: set[str]) -> None:
        for k in table:
            if k not in allowed:
                key = f"{where}.{k}" if where else k
                self.fail(key, f"unknown key; expected one of: {', '.join(sorted(allowed))}")

    def table(self, data: Mapping[str, Any], key: str, *, required: bool = False) -> Mapping[str, Any]:
        if key not in data:
            if required:
                self.fail(key, f"missing [{key}] table")
            return {}
        value = data[key]
        if not isinstance(value, Mapping):
            self.fail(key, f"must be a table ([{key}]), got {type(value).__name__}")
        return value

    def _get(self, t: Mapping[str, Any], key: str, default: Any) -> Any:
        leaf = key.rsplit(".", 1)[-1]
        if leaf in t:
            return t[leaf]
        if default is None:
            self.fail(key, "is required")
        return default

    def string(self, t: Mapping[str, Any], key: str, default: str | None) -> str:
        v = self._get(t, key, default)
        if not isinstance(v, str) or not v and default != "":
            self.fail(key, f"must be a non-empty string, got {v!r}")
        return v

    def integer(self, t: Mapping[str, Any], key: str, default: int | None, *, minimum: int) -> int:
        v = self._get(t, key, default)
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(key, f"must be an integer, got {v!r}")
        if v < minimum:
            self.fail(key, f"must be >= {minimum}, got {v}")
        return v

    def number(self, t: Mapping[str, Any], key: str, default: float | None, *, minimum: float) -> float:
        v = self._get(t, key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            self.fail(key, f"must be a finite number, got {v!r}")
        if v < minimum:
            self.fail(key, f"must be >= {minimum}, got {v}")
        return float(v)

    def boolean(self, t: Mapping[str, Any], key: str, default: bool) -> bool:
        v = self._get(t, key, default)
        if not isinstance(v, bool):
            self.fail(key, f"must be true or false, got {v!r}")
        return v
