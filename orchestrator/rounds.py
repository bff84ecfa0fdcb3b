"""Round bookkeeping without I/O: who was selected, who reported, who vanished, when it closes.

DESIGN.md "One round, as data flows", steps 3-5: the scheduler samples devices, collects their
updates, and closes the round at quorum or deadline, treating late or vanished devices as
stragglers so that one slow phone never stalls the fleet.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np


def sample_devices(candidates: Iterable[str], fraction: float, round: int, seed: int, *, minimum: int = 1) -> list[str]:
    """Sample ``ceil(fraction * n)`` (at least ``minimum``) of the idle devices, reproducibly per round."""
    pool = sorted(candidates)
    if not pool:
        return []
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    k = min(len(pool), max(minimum, math.ceil(fraction * len(pool))))
    rng = np.random.default_rng([seed, round])
    picked = rng.choice(len(pool), size=k, replace=False)
    return [pool[i] for i in sorted(picked)]


@dataclass
class RoundState:
    """One round's membership. ``quorum`` is the share of selected devices whose reports close it early."""

    round: int
    selected: frozenset[str]
    deadline: float
    quorum: float = 1.0
    reported: set[str] = field(default_factory=set)
    rejected: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not 0 < self.quorum <= 1:
            raise ValueError(f"quorum must be in (0, 1], got {self.quorum}")

    @property
    def needed(self) -> int:
        return max(1, math.ceil(self.quorum * len(self.selected)))

    def expects(self, device_id: str) -> bool:
        """True while this device's update would still count in this round."""
        return device_id in self.selected and device_id not in self.reported | self.rejected

    def on_report(self, device_id: str, accepted: bool) -> None:
        if not self.expects(device_id):
            raise KeyError(f"{device_id} is not expected in round {self.round}")
        (self.reported if accepted else self.rejected).add(device_id)
        self.gone.discard(device_id)

    def on_gone(self, device_id: str) -> None:
        if self.expects(device_id):
            self.gone.add(device_id)

    def on_back(self, device_id: str) -> None:
        self.gone.discard(device_id)

    @property
    def outstanding(self) -> set[str]:
        """Selected devices still connected that have not answered."""
        return set(self.selected) - self.reported - self.rejected - self.gone

    def done(self, now: float) -> bool:
        """Closed at quorum, when nobody is left to wait for, or at the deadline."""
        return len(self.reported) >= self.needed or not self.outstanding or now >= self.deadline

    def stragglers(self) -> set[str]:
        return set(self.selected) - self.reported - self.rejected
