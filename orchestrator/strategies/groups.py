"""What FedALIGN and VaRSeL share: the group of devices whose objective is trained (priority /
internal devices), and the small helpers their options and round reports need."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from types import MappingProxyType

from orchestrator.strategies.base import DeviceInfo, ServerSetting

__all__ = ["PRIORITIZED_SERVER_SETTINGS", "PriorityRule", "flag_option", "json_ready", "number_option", "parse_ids",
           "weighted_metrics"]

#: What a prioritized round needs of the server (``Strategy.server_settings``): the norm bound and direction
#: trust (:mod:`orchestrator.aggregation.trust`, against the same reference) off.
#: Its reference is the whole fleet's, not the priority group's: the server's own update on its
#: held-out data, or the median norm of every device's earlier updates. A priority group's data differs
#: from the rest (that is why it is one), so its updates are the ones over that reference, and the bound
#: clips them before the strategy weighs them: the selection's result is undone before it is made.
PRIORITIZED_SERVER_SETTINGS = MappingProxyType({"norm_bound": ServerSetting(
    0.0, "the norm bound's reference is the whole fleet's, not the priority group's, so it clips the priority "
         "devices' own updates before the strategy weighs them (BENCHMARKS.md, \"under the server's defaults\")"),
    "direction_trust": ServerSetting(
        False, "direction trust weighs updates by their agreement with the whole fleet's reference, so it "
               "down-weighs the priority devices, whose data differs from it, before the strategy weighs them")})

_TRUE = frozenset({"1", "true", "yes", "on"})


def parse_ids(ids: str | Iterable[str] | None) -> tuple[str, ...]:
    """Device ids or globs from a comma-separated string (command line, fleet file) or a sequence."""
    if ids is None:
        return ()
    items = ids.split(",") if isinstance(ids, str) else list(ids)
    out = tuple(str(i).strip() for i in items if str(i).strip())
    return out


@dataclass(frozen=True)
class PriorityRule:
    """Which devices belong to the group whose objective is trained (FedALIGN's priority devices,
    VaRSeL's internal ones): a device id matching one of ``ids`` (globs such as ``prio-*``), or the
    hello label ``label`` set to a true value (1, true, yes, on), or ``label`` written ``key=value``
    and that label equal to the value."""

    ids: tuple[str, ...] = ()
    label: str = "priority"

    def __post_init__(self) -> None:
        key = self.label.partition("=")[0]
        if self.label and not key:
            raise ValueError(f"label rule {self.label!r} needs a label name before '='")

    def matches(self, device: DeviceInfo) -> bool:
        if any(fnmatch.fnmatchcase(device.device_id, pattern) for pattern in self.ids):
            return True
        if not self.label:
            return False
        key, eq, value = self.label.partition("=")
        got = device.tags.get(key)
        if got is None:
            return False
        return got == value if eq else got.strip().lower() in _TRUE

    def split(self, devices: Iterable[str], infos: Mapping[str, DeviceInfo]) -> tuple[list[str], list[str]]:
        """(members, others), each sorted."""
        members, others = [], []
        for d in sorted(devices):
            (members if self.matches(infos[d]) else others).append(d)
        return members, others


def number_option(name: str, value: object, *, minimum: float = 0.0, allow_inf: bool = False) -> float:
    """A float option (command-line options arrive as strings) with a clear error."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(x) or (math.isinf(x) and not allow_inf) or x < minimum:
        raise ValueError(f"{name} must be {'a' if allow_inf else 'a finite'} number >= {minimum}, got {value!r}")
    return x


def flag_option(name: str, value: bool | str) -> bool:
    """A true/false option (command-line options arrive as strings) with a clear error."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def weighted_metrics(evaluated: Mapping[str, tuple[float, float, int]],
                     devices: Iterable[str]) -> tuple[float | None, float | None]:
    """Sample-weighted mean (loss, accuracy) over ``devices``' evaluate reports, given as
    ``device -> (loss, accuracy, samples)``; None where no device reported a finite value."""
    rows = [evaluated[d] for d in devices if d in evaluated]
    n = sum(r[2] for r in rows if math.isfinite(r[0]))
    loss = sum(r[0] * r[2] for r in rows if math.isfinite(r[0])) / n if n else None
    n_acc = sum(r[2] for r in rows if math.isfinite(r[1]))
    acc = sum(r[1] * r[2] for r in rows if math.isfinite(r[1])) / n_acc if n_acc else None
    return loss, acc


def json_ready(value: object) -> object:
    """Journal-ready: NaN and infinities become None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
