"""Round bookkeeping without I/O: which instructions are out, who answered, who vanished, when it closes.

docs/architecture.md, "One round, step by step": the scheduler samples devices, collects their
reports, and closes the round at quorum or deadline, treating late or vanished devices as
stragglers so that one slow phone never stalls the fleet. A round may hold several instructions
per device (a strategy's phases: evaluate, then train; train, then compare), each answered once.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["ROUND_DRIVERS", "Attendance", "RoundState", "sample_devices", "OUTSTANDING", "REPORTED", "REFUSED", "GONE", "SKIPPED", "secret_coins",
           "cohort_fraction"]

#: How rounds run (``ServerConfig.round_mode``): the round driver of each mode, chosen once when the server
#: is built. ``synchronous``: a cohort per round, waited for; ``buffered``: FedBuff's asynchronous buffer.
ROUND_DRIVERS: dict[str, str] = {
    "synchronous": "orchestrator.server.roundloop:RoundLoop",
    "buffered": "orchestrator.server.buffered:BufferedLoop",
}

# SKIPPED: never sent (the device could not hold what was asked); not a straggler.
OUTSTANDING, REPORTED, REFUSED, GONE, SKIPPED = "outstanding", "reported", "refused", "gone", "skipped"


def sample_devices(candidates: Iterable[str], fraction: float, round: int, seed: int | None, *, minimum: int = 1,
                   k: int | None = None, poisson: bool = False) -> list[str]:
    """Sample ``k`` (default ``ceil(fraction * n)``, at least ``minimum``) of ``candidates``,
    reproducibly per (seed, round), returned sorted. ``poisson``: each candidate independently with
    probability ``fraction`` instead (no minimum: the sample may be empty), the sampling a DP
    accountant of Poisson rounds assumes.

    ``seed`` None: a secret draw from ``os.urandom`` (:func:`secret_coins`), which nothing public
    predicts. DP's amplification by sampling (Abadi et al., 2016, Theorem 1; the accountant's
    sampled Gaussian) holds only if nobody knows who is in a round: a device known to be drawn is
    accounted at q = 1 for that round. A seed is for plain, reproducible research runs."""
    pool = sorted(candidates)
    if not pool:
        return []
    if poisson and k is None:
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        coins = secret_coins(len(pool)) if seed is None else np.random.default_rng([seed, round]).random(len(pool))
        return [d for d, c in zip(pool, coins) if c < fraction]
    if k is None:
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        k = max(minimum, math.ceil(fraction * len(pool)))
    k = min(len(pool), max(0, k))
    if seed is None:  # the k smallest of n uniform coins: a uniform k-subset
        picked = np.argsort(secret_coins(len(pool)), kind="stable")[:k]
    else:
        picked = np.random.default_rng([seed, round]).choice(len(pool), size=k, replace=False)
    return [pool[i] for i in sorted(picked)]


def cohort_fraction(fraction: float, excluding: bool, pool: int, total: int) -> float:
    """The share of the ``pool`` selectable devices a round samples: ``fraction``, or, while the
    intake leaves devices out (``excluding``: a DP-FTRL tree's participants), the share that keeps
    the cohort at ``fraction`` of the ``total`` connected devices."""
    if not excluding:
        return fraction
    return min(1.0, max(1e-9, fraction * total - 1e-9) / max(1, pool))  # 1e-9: ceil(share x pool) stays fraction x total


def secret_coins(n: int) -> np.ndarray:
    """``n`` uniform numbers in [0, 1) of 53 bits each, from ``os.urandom`` (the OS CSPRNG)."""
    words = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
    return words.astype(np.float64) / float(1 << 53)


@dataclass
class RoundState:
    """One round's instructions, keyed by (device, phase), and their outcome.

    ``quorum`` is the share of a phase's instructions whose accepted reports let the strategy close
    the round early (:meth:`quorum_reached`).
    """

    round: int
    deadline: float
    quorum: float = 1.0
    #: When the straggler grace period ends (monotonic seconds), once it has started.
    grace_end: float | None = None
    #: Set when the round stops waiting (then it aggregates, checks and commits): no report counts any more.
    closed: bool = False
    status: dict[tuple[str, str], str] = field(default_factory=dict)
    #: Devices asked for fewer local steps than configured, for their measured speed (device -> steps;
    #: :mod:`orchestrator.server.pace`).
    paced: dict[str, int] = field(default_factory=dict)
    #: The same statuses by device (phase -> status): a device's questions cost O(its phases), not O(round).
    _by_device: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    #: Kept as statuses change, so that what the server asks after every report (settled? quorum?
    #: how many reported?) costs O(1), not O(instructions): a round may sample thousands of devices.
    _open: set[tuple[str, str]] = field(default_factory=set, repr=False)  # outstanding (device, phase)
    _counts: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)  # (phase, status) -> n
    _reported_phases: dict[str, int] = field(default_factory=dict, repr=False)  # device -> phases reported

    def __post_init__(self) -> None:
        if not 0 < self.quorum <= 1:
            raise ValueError(f"quorum must be in (0, 1], got {self.quorum}")

    def start_grace(self, until: float) -> None:
        """The straggler grace period starts; it ends at ``until`` (monotonic seconds)."""
        self.grace_end = until

    def pace(self, paced: Mapping[str, int]) -> None:
        """These devices are asked for fewer local steps than configured (device -> steps)."""
        self.paced.update(paced)

    def _set(self, device_id: str, phase: str, status: str) -> None:
        key = (device_id, phase)
        old = self.status.get(key)
        if old is not None:
            self._counts[(phase, old)] -= 1
            if old == OUTSTANDING:
                self._open.discard(key)
            elif old == REPORTED:
                left = self._reported_phases[device_id] - 1
                if left:
                    self._reported_phases[device_id] = left
                else:
                    del self._reported_phases[device_id]
        self.status[key] = status
        self._by_device.setdefault(device_id, {})[phase] = status
        self._counts[(phase, status)] = self._counts.get((phase, status), 0) + 1
        if status == OUTSTANDING:
            self._open.add(key)
        elif status == REPORTED:
            self._reported_phases[device_id] = self._reported_phases.get(device_id, 0) + 1

    # -- changes ---------------------------------------------------------------------------------
    def issue(self, device_id: str, phase: str) -> None:
        key = (device_id, phase)
        if key in self.status:
            raise ValueError(f"{device_id} already has a {phase!r} instruction in round {self.round}")
        self._set(device_id, phase, OUTSTANDING)

    def on_report(self, device_id: str, phase: str, accepted: bool) -> None:
        if not self.expects(device_id, phase):
            raise KeyError(f"{device_id} owes no {phase!r} report in round {self.round}")
        self._set(device_id, phase, REPORTED if accepted else REFUSED)

    def on_gone(self, device_id: str) -> list[str]:
        """The device disconnected: its open instructions are no longer waited for. Returns their phases."""
        phases = [ph for ph, s in self._by_device.get(device_id, {}).items() if s == OUTSTANDING]
        for ph in phases:
            self._set(device_id, ph, GONE)
        return phases

    def on_skipped(self, device_id: str, phase: str) -> None:
        """The instruction was not sent (over the device's budget): nothing to wait for."""
        if self.status.get((device_id, phase)) != OUTSTANDING:
            raise KeyError(f"{device_id} has no open {phase!r} instruction in round {self.round}")
        self._set(device_id, phase, SKIPPED)

    def on_back(self, device_id: str) -> list[str]:
        """The device reconnected: its vanished instructions are awaited again. Returns their phases."""
        phases = [ph for ph, s in self._by_device.get(device_id, {}).items() if s == GONE]
        for ph in phases:
            self._set(device_id, ph, OUTSTANDING)
        return phases

    def close(self) -> None:
        """The round stops waiting: a report that lands while it aggregates is late, not folded."""
        self.closed = True

    # -- queries ---------------------------------------------------------------------------------
    def expects(self, device_id: str, phase: str | None = None) -> bool:
        """True while a report of this device (for ``phase``, or any) would still count."""
        if self.closed:
            return False
        phases = self._by_device.get(device_id, {})
        if phase is not None:
            return phases.get(phase) in (OUTSTANDING, GONE)
        return any(s in (OUTSTANDING, GONE) for s in phases.values())

    def devices(self, phase: str | None = None, status: str | None = None) -> set[str]:
        return {d for (d, ph), s in self.status.items()
                if (phase is None or ph == phase) and (status is None or s == status)}

    @property
    def selected(self) -> set[str]:
        """Devices that got any instruction this round."""
        return set(self._by_device)

    @property
    def num_selected(self) -> int:
        """``len(self.selected)``, in O(1)."""
        return len(self._by_device)

    def num_reported(self) -> int:
        """``len(self.reported())``: devices with an accepted report of any phase, in O(1)."""
        return len(self._reported_phases)

    @property
    def outstanding(self) -> set[tuple[str, str]]:
        """Instructions still awaited from connected devices."""
        return set(self._open)

    def reported(self, phase: str | None = None) -> set[str]:
        return self.devices(phase, REPORTED)

    def refused(self, phase: str | None = None) -> set[str]:
        return self.devices(phase, REFUSED)

    def skipped(self, phase: str | None = None) -> set[str]:
        return self.devices(phase, SKIPPED)

    def quorum_reached(self, phase: str = "train") -> bool:
        """At least ``ceil(quorum * n)`` of the ``n`` instructions of ``phase`` sent were reported and accepted."""
        issued = sum(n for (ph, s), n in self._counts.items() if ph == phase and s != SKIPPED)
        if issued == 0:
            return False
        return self._counts.get((phase, REPORTED), 0) >= max(1, math.ceil(self.quorum * issued))

    def answered_share(self) -> float:
        """Share of the instructions sent (all phases) answered, accepted or refused (1.0 if none were sent)."""
        sent = sum(n for (_, s), n in self._counts.items() if s != SKIPPED)
        answered = sum(n for (_, s), n in self._counts.items() if s in (REPORTED, REFUSED))
        return answered / sent if sent else 1.0

    def settled(self) -> bool:
        """Nobody connected is left to wait for."""
        return not self._open

    def stragglers(self) -> set[str]:
        """Devices with an instruction that was never answered."""
        return {d for (d, _), s in self.status.items() if s in (OUTSTANDING, GONE)}


#: The most rounds a device that stalled again and again sits out once it is back (:class:`Attendance`).
MAX_REST_ROUNDS = 15


class Attendance:
    """Who missed a report they were asked for, so that selection remembers (docs/architecture.md,
    "One round, step by step"): a device that was selected and did not answer is *silent*, not
    selectable again until it shows it is alive (it reconnects, or a late report of it arrives), so
    a round's straggler grace is never spent waiting for a device already known to be silent. Each
    miss adds a stall and each accepted report takes one away; a device back from its ``n``-th
    stall in a row sits out ``min(2**(n-1) - 1, MAX_REST_ROUNDS)`` more rounds (none after one
    stall, 1 after two, 3 after three, ...): repeated stalls lower its priority.

    Without I/O: the round loop tells it of each round's close and of each sign of life.
    """

    def __init__(self, first_round: int = 1) -> None:
        """``first_round``: the first round this server process runs (after a resume, the one after
        the last completed)."""
        self._stalls: dict[str, int] = {}  # device -> misses not yet paid off by accepted reports
        self._silent: set[str] = set()  # missed its last report and not seen alive since
        self._rest: dict[str, int] = {}  # device -> rounds it still sits out, once alive again
        self._asked: set[str] = set()  # the open round's selected devices
        self._back: set[str] = set()  # of those, the ones that reconnected during the round
        self._cut: set[str] = set()  # devices whose task of the next round a restart of the server cut
        self._next = first_round  # the round this process opens next, or has open

    def round_opened(self, selected: Iterable[str], round: int | None = None) -> None:
        """A round (number ``round``) asked ``selected`` for their work."""
        self._asked, self._back = set(selected), set()
        self._next = self._next if round is None else round

    def returned(self, device_id: str, resume_round: int) -> None:
        """A device connected, saying it was working in round ``resume_round`` (-1: none). It is alive
        (:meth:`alive`). If that round is the one this process is about to run or runs, and the device
        was not asked for it by this process, the process before a restart (a crash, a kill) asked
        it: the restart, the server's own doing, cut its task, so missing that round's report is no
        miss of the device's (a secure round, say, cannot take back a device whose keys the previous
        process held)."""
        self.alive(device_id)
        if resume_round == self._next and device_id not in self._asked:
            self._cut.add(device_id)

    def round_closed(self, stragglers: Iterable[str], reported: Iterable[str]) -> None:
        """A round stopped waiting: its ``stragglers`` missed a report, ``reported`` answered. A
        straggler that reconnected while the round was open has shown it is alive: its miss counts,
        but it is not silent. A straggler whose task a restart cut (:meth:`returned`) missed nothing."""
        stragglers = set(stragglers) - self._cut
        self._cut, self._next = set(), self._next + 1
        for device_id in list(self._rest):
            left = self._rest[device_id] - 1
            if left > 0:
                self._rest[device_id] = left
            else:
                del self._rest[device_id]
        for device_id in reported:
            left = self._stalls.get(device_id, 0) - 1
            if left > 0:
                self._stalls[device_id] = left
            else:
                self._stalls.pop(device_id, None)
        for device_id in stragglers:
            self._stalls[device_id] = self._stalls.get(device_id, 0) + 1
            self._rest.pop(device_id, None)
            self._silent.add(device_id)
            if device_id in self._back:
                self.alive(device_id)
        self._asked, self._back = set(), set()

    def alive(self, device_id: str) -> None:
        """The device showed it is alive: selectable again, after its rest if it stalled repeatedly."""
        if device_id in self._asked:
            self._back.add(device_id)
        if device_id in self._silent:
            self._silent.discard(device_id)
            rest = min(2 ** (self._stalls.get(device_id, 1) - 1) - 1, MAX_REST_ROUNDS)
            if rest > 0:
                self._rest[device_id] = rest

    def selectable(self, device_id: str) -> bool:
        """True unless the device is silent or sitting out its rest."""
        return device_id not in self._silent and device_id not in self._rest

    def choose(self, devices: Iterable[str]) -> list[str]:
        """Of ``devices`` (connected, free), those a round may select: none silent; none resting, unless
        only resting ones are left. A rest lowers a device's priority and is counted down by rounds: were
        every free device resting, no round would open to count it down (every device of a round that
        closed on them all, a secure round at its deadline say, stalled twice in a row), and the run
        would wait for ever."""
        alive = [d for d in devices if d not in self._silent]
        return [d for d in alive if d not in self._rest] or alive

    def silent(self) -> set[str]:
        """Devices that missed their last report and have not shown they are alive since."""
        return set(self._silent)

    def held_out(self) -> int:
        """How many devices are not selectable now (silent or resting)."""
        return len(self._silent | self._rest.keys())
