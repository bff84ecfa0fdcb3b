"""Fleets as objects: the benchmarks build :class:`emulator.fleet.Fleet` values, and one function
writes a fleet file.

:func:`build_fleet` takes the tables of a fleet file as keyword arguments and validates them with the
emulator's own reader (``emulator.fleet.parse_fleet``: every key and value checked as in a file), so a
benchmark's fleet is exactly a fleet a user could write. :func:`derive` changes a fleet (a shipped
one, or one built here) the same way: its tables with some keys set or, given None, back to their
defaults. :func:`fleet_toml` is the one writer of fleet files: the tables of :func:`fleet_tables`,
which hold the workload's settings and what the reader would not fill in by itself (the class's
figures and other defaults are left out), so that ``parse_fleet(tomllib.loads(fleet_toml(f)))`` is
``f`` again.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from emulator.fleet import Fleet

__all__ = ["build_fleet", "derive", "fleet_tables", "fleet_toml", "group", "same_fleet", "write_fleet"]

MiB = 1 << 20
#: The settings a fleet file always states, defaults or not: the workload's own numbers, which a change
#: of a server default must not move under a fleet file.
WORKLOAD = ("strategy", "rounds", "fraction", "local_steps", "batch_size", "lr", "momentum", "weight_decay")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def group(device_class: str, count: int, name: str | None = None, **keys: Any) -> dict[str, Any]:
    """One ``[[groups]]`` table: ``count`` devices of ``device_class`` (a class of profiles/devices),
    and any other group key (``force_split``, ``budget``, ``priority``, ``dropout``, ...)."""
    out: dict[str, Any] = {"name": name} if name else {}
    return {**out, "class": device_class, "count": count, **keys}


def build_fleet(name: str, *, model: str, groups: Sequence[Mapping[str, Any]], seed: int = 0, description: str = "",
                dataset: str | None = None, data_root: str | None = None, training: Mapping[str, Any] | None = None,
                strategy: Mapping[str, Any] | None = None, partition: Mapping[str, Any] | None = None,
                emulation: Mapping[str, Any] | None = None, behaviour: Mapping[str, Any] | None = None) -> Fleet:
    """A fleet from the tables of a fleet file (emulator/fleet.py documents every key), validated."""
    head = {"name": name, "description": description, "model": model, "dataset": dataset, "data_root": data_root,
            "seed": seed}
    data: dict[str, Any] = {"fleet": {k: v for k, v in head.items() if v not in (None, "")}}
    for table, value in (("training", training), ("strategy", strategy), ("partition", partition),
                         ("emulation", emulation), ("behaviour", behaviour)):
        if value:
            data[table] = dict(value)
    data["groups"] = [dict(g) for g in groups]
    return _parse(data, name)


def _parse(data: Mapping[str, Any], name: str) -> Fleet:
    from emulator.fleet import parse_fleet

    return parse_fleet(data, source=f"<fleet {name}>", default_name=name)


def derive(base: Fleet, /, *, groups: Sequence[Mapping[str, Any]] | None = None, **tables: Mapping[str, Any] | None
           ) -> Fleet:
    """``base`` with keys of its tables changed: ``derive(f, fleet={"seed": 1}, training={"norm_bound":
    None})`` sets the seed and puts the norm bound back to its default; ``groups`` replaces the groups.
    A partition seed equal to the fleet's seed (the reader's default) follows a new fleet seed."""
    data = fleet_tables(base)
    for table, changes in tables.items():
        merged = {**data.get(table, {}), **(changes or {})}
        data[table] = {k: v for k, v in merged.items() if v is not None}
    if groups is not None:
        data["groups"] = [dict(g) for g in groups]
    return _parse({k: v for k, v in data.items() if v or k == "fleet"}, data["fleet"]["name"])


def _changed(value: Any, default: Any) -> bool:
    return value != default and not (isinstance(value, float) and isinstance(default, float)
                                     and math.isnan(value) and math.isnan(default))


def _size(n: int) -> str | int:
    return f"{n // MiB}MiB" if n % MiB == 0 else n


def _training(fleet: Fleet) -> dict[str, Any]:
    from orchestrator.config import TRAINING_SETTINGS, ServerConfig

    default = ServerConfig()
    return {k: getattr(fleet.training, k) for k in TRAINING_SETTINGS
            if k in WORKLOAD or _changed(getattr(fleet.training, k), getattr(default, k))}


def _group(g: Any) -> dict[str, Any]:
    from edge_sdk.settings import setting_default
    from emulator.fleet import Behaviour

    out: dict[str, Any] = {"name": g.name, "class": g.device_class, "count": g.count}
    if g.budget_over_runtime is not None:
        out["budget"] = f"runtime+{_size(g.budget_over_runtime)}"
    elif g.budget_override:
        out["budget"] = _size(g.budget_bytes)
    optional = {"expect_role": (g.expect_role, None), "force_split": (g.force_split, None),
                "priority": (g.priority, False), "tags": (list(g.tags), []), "classes": (list(g.classes), []),
                "samples": (g.samples, None), "label_noise": (g.label_noise, 0.0),
                "backend": (g.backend, setting_default("backend"))}
    out |= {k: v for k, (v, default) in optional.items() if _changed(v, default)}
    base = Behaviour()
    out |= {f.name: getattr(g.behaviour, f.name) for f in dataclasses.fields(Behaviour)
            if _changed(getattr(g.behaviour, f.name), getattr(base, f.name))}
    return out


def fleet_tables(fleet: Fleet) -> dict[str, Any]:
    """The tables of ``fleet``'s file: what the reader would not fill in by itself, and always the
    workload's settings (:data:`WORKLOAD`) and the emulation mode. Every group's behaviour is written in
    the group (no ``[behaviour]`` table); a budget only where the file set one."""
    from emulator.fleet import EmulationSettings

    head = {"name": fleet.name, "description": fleet.description, "model": fleet.model, "dataset": fleet.dataset,
            "data_root": fleet.data_root, "seed": fleet.seed}
    partition: dict[str, Any] = {"scheme": fleet.partition.scheme}
    if fleet.partition.alpha is not None:
        partition["alpha"] = fleet.partition.alpha
    if fleet.partition.seed != fleet.seed:
        partition["seed"] = fleet.partition.seed
    emulation_default = EmulationSettings()
    emulation = {f.name: getattr(fleet.emulation, f.name) for f in dataclasses.fields(EmulationSettings)
                 if f.name == "mode" or _changed(getattr(fleet.emulation, f.name), getattr(emulation_default, f.name))}
    return {"fleet": {k: v for k, v in head.items() if v not in (None, "")}, "training": _training(fleet),
            "strategy": dict(fleet.strategy_options), "partition": partition, "emulation": emulation,
            "groups": [_group(g) for g in fleet.groups]}


def _value(v: Any) -> str:
    """A TOML value: strings, booleans, numbers, arrays and inline tables."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def _key(k: str) -> str:
    return k if _BARE_KEY.match(k) else json.dumps(k)


def _table(lines: list[str], header: str, table: Mapping[str, Any]) -> None:
    lines += ["", header] + [f"{_key(k)} = {_value(v)}" for k, v in table.items() if v is not None]


def fleet_toml(fleet: Fleet, comment: str = "") -> str:
    """The fleet file of ``fleet`` (``comment``: lines put first, each as a TOML comment)."""
    tables = fleet_tables(fleet)
    lines = [f"# {line}".rstrip() for line in comment.splitlines()]
    for name in ("fleet", "training", "strategy", "partition", "emulation"):
        if tables[name] or name == "fleet":
            _table(lines, f"[{name}]", tables[name])
    for g in tables["groups"]:
        _table(lines, "[[groups]]", g)
    text = "\n".join(lines).lstrip("\n") + "\n"
    tomllib.loads(text)  # the writer's own check: what it wrote is TOML
    return text


def write_fleet(fleet: Fleet, path: Path | str, comment: str = "") -> Path:
    """:func:`fleet_toml` of ``fleet`` written to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(fleet_toml(fleet, comment))
    return path


def same_fleet(a: str, b: str) -> bool:
    """Whether two fleet files' texts describe the same fleet: the same devices, data and settings (their
    names, comments, order and spelling aside: a fleet's name labels it, nothing is drawn from it)."""
    if a == b:
        return True
    try:
        from emulator.fleet import parse_fleet

        fa, fb = (parse_fleet(tomllib.loads(t)) for t in (a, b))
    except Exception:  # noqa: BLE001 - a text that no longer parses is simply not the same fleet
        return False
    return dataclasses.replace(fa, name="") == dataclasses.replace(fb, name="")
