"""What a round costs the devices in bytes, summed from the round's metrics.

The round loop records, per device and round, the bytes sent down and received up by payload
kind, and the bytes of payloads the device held and was not sent (``metrics["bytes"]``, from
:class:`orchestrator.parts.Traffic`). The status page, the run summary (``metrics.json``,
``rounds.csv``) and the benchmarks read them through these two functions, so that "bytes per
device-round" means one thing everywhere: the bytes down plus up of one device in one round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["device_bytes", "round_bytes", "run_bytes"]


def device_bytes(by: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """One device's round: bytes down, up and held, over every payload kind."""
    return {d: int(sum((by.get(d) or {}).values())) for d in ("down", "up", "held")}


def round_bytes(metrics: Mapping[str, object] | None) -> dict[str, float] | None:
    """A round's bytes down, up and held over its devices, and the mean bytes (down + up) per
    device; None for a round whose metrics have no per-device bytes."""
    per = (metrics or {}).get("bytes")
    if not isinstance(per, Mapping) or not per:
        return None
    rows = [device_bytes(by) for by in per.values()]
    out: dict[str, float] = {d: sum(r[d] for r in rows) for d in ("down", "up", "held")}
    out["devices"] = len(rows)
    out["per_device"] = (out["down"] + out["up"]) / len(rows)
    return out


def run_bytes(history: Sequence[Mapping[str, object]]) -> dict[str, float] | None:
    """A run's bytes: totals down, up and held, device-rounds, and the mean bytes per device-round."""
    rounds = [r for r in map(round_bytes, history) if r is not None]
    if not rounds:
        return None
    out: dict[str, float] = {d: sum(r[d] for r in rounds) for d in ("down", "up", "held")}
    out["device_rounds"] = sum(r["devices"] for r in rounds)
    out["per_device_round"] = (out["down"] + out["up"]) / out["device_rounds"]
    return out
