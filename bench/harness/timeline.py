"""Accuracy over wall-clock time, from a server's round events: the time-to-target benchmarks' one recorder."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping


class AccuracyTimeline:
    """Each evaluated round's accuracy against the seconds since the first round opened (``round_start``),
    printed as it lands (``describe``: what else the line says of a round's event)."""

    def __init__(self, label: str, describe: Callable[[Mapping], str] | None = None) -> None:
        self.label, self.describe = label, describe
        self.points: list[tuple[float, float]] = []
        self._start: float | None = None

    def on_event(self, kind: str, data: Mapping) -> None:
        if kind == "round_start" and self._start is None:
            self._start = time.monotonic()
        if kind == "round_end" and "accuracy" in data and self._start is not None:
            self.points.append((time.monotonic() - self._start, float(data["accuracy"])))
            more = f", {self.describe(data)}" if self.describe else ""
            print(f"{self.label}: round {data['round']} at {self.points[-1][0]:.1f} s, accuracy "
                  f"{self.points[-1][1]:.4f}{more}", flush=True)



def time_to_target(points: Iterable[tuple[float, float]], target: float) -> float | None:
    """The first time in ``points`` (seconds, accuracy) the accuracy reached ``target`` (None: never)."""
    return next((t for t, acc in points if acc >= target), None)
