"""Each device's measured pace, and the share of a round's local steps that fits what its cohort takes.

A synchronous round under the straggler grace (:func:`orchestrator.server.roundloop.closing`) stops
waiting at ``t_q + max(grace, t_q)``, ``t_q`` being when ``straggler_quorum`` of its instructions were
answered. A device much slower than its cohort (a GPU tab on a software renderer: 189-223 s a round
against 10-18 s for its WebAssembly peers) never answers inside that window, so its work is thrown
away every round it is selected. With ``straggler_pacing`` on, the server sends such a device fewer
local steps, as many as fit the window by its own measured speed (at least one), so its update is
folded instead of cut.

What is measured, per device, from what the server already sees (no protocol addition): the seconds
from a train instruction's send to its report's arrival (``wall``), and the device's own training
seconds and step count in the report's metrics (``train_s``, ``steps``; both SDKs send them,
docs/protocol.md, "Phases"). A round's time is modelled as ``overhead + steps * step_s``: ``step_s =
train_s / steps`` scales with the steps asked; ``overhead = wall - train_s`` (downloads, the forward
pass of the frozen chunks, waiting) does not. A report without usable timings is all steps
(``step_s = wall / steps``, no overhead). A late report (the round had closed) is measured too: that
is how a device cut as a straggler gets the share that fits at its next selection. Each new
measurement moves the estimate half way (an exponential average), so one odd round does not decide.

What a smaller share means: the device takes fewer SGD steps from the same global state and its
update is weighted as before (FedAvg: by its samples), so it pulls the mean less far along its own
local objective than a device that ran every step; nothing else in the round changes. A device that
claims to be slow only gets less work to do.

Before its first round is timed, a device is seeded from its hello's ``probe_step_s``: the seconds one
SGD step of the SDKs' fixed probe (a dense layer on a batch of 32, ``edge_sdk.backends.base.probe_sgd_step``)
took there with its training backend. The seed is ``DevicePace(0, probe_step_s * c)``, ``c`` the
median ratio of measured ``step_s`` to probe step over the devices already measured that ran the same
probe (the same hello runtimes: SDK and backend; 1 while there are none: the probe is then taken as one
of the model's steps); the first measurement replaces it,
it is never blended in. The claim is checked (finite, in ``(0, PROBE_STEP_MAX_S]``, else no seed) and
only ever asks a device for fewer steps than the round's, never more; like any predicted time it
moves the round's expected close only as one of its cohort (:func:`round_budget`), never below the
grace after the quorum.

Without I/O; the round loop owns it (:class:`~orchestrator.server.roundloop.RoundLoop` ``pace``) and
journals each new measurement (``store.paces``), so a resumed server starts from the paces it had.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from edge_sdk import protocol as p
from orchestrator.config import ServerConfig
from orchestrator.parts import Session
from orchestrator.store import Store
from orchestrator.strategies import Instruction

__all__ = ["PACE_MARGIN", "DevicePace", "Paces", "fit_steps", "measure", "probe_seed", "round_budget"]

#: A paced device is asked for the steps that take this share of the round's expected close: the
#: rest is slack for the estimate's error (the cohort's and its own time vary round to round).
PACE_MARGIN = 0.7
#: Weight of a new measurement in a device's estimate (an exponential moving average).
PACE_SMOOTHING = 0.5


@dataclass(frozen=True)
class DevicePace:
    """A device's round time as ``overhead_s + steps * step_s`` (seconds)."""

    overhead_s: float
    step_s: float

    def seconds(self, steps: int) -> float:
        return self.overhead_s + steps * self.step_s

    def blend(self, new: DevicePace, weight: float = PACE_SMOOTHING) -> DevicePace:
        return DevicePace((1 - weight) * self.overhead_s + weight * new.overhead_s,
                          (1 - weight) * self.step_s + weight * new.step_s)


def _seconds(value: object) -> float | None:
    """A device-claimed duration, if it is one (a finite number >= 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def measure(wall_s: float, steps: int, metrics: Mapping[str, p.Scalar]) -> DevicePace | None:
    """One round's pace: ``wall_s`` from the instruction's send to the report, ``steps`` asked, and the
    report's ``train_s`` and ``steps``. The device's claims are checked: a ``train_s`` that is not a
    duration, or a ``steps`` other than those asked, is ignored (all of ``wall_s`` is then steps);
    ``train_s`` is held within ``wall_s``. None when nothing can be learnt (no steps were asked)."""
    if steps < 1 or not math.isfinite(wall_s) or wall_s < 0:
        return None
    train_s = _seconds(metrics.get("train_s"))
    reported_steps = metrics.get("steps")
    if train_s is None or isinstance(reported_steps, bool) or reported_steps != steps:
        return DevicePace(0.0, wall_s / steps)
    train_s = min(train_s, wall_s)
    return DevicePace(wall_s - train_s, train_s / steps)


def probe_seed(probe_step_s: object, calibration: float = 1.0) -> DevicePace | None:
    """A device's pace before it is timed, from its hello's probe step (seconds): all of a round taken
    as steps of ``probe_step_s * calibration`` each. None for a claim that is not a probe step (not a
    finite number in ``(0, PROBE_STEP_MAX_S]``, a bool) or a calibration that is not a finite positive
    ratio: such a device is not seeded."""
    probe = _seconds(probe_step_s)
    if probe is None or not 0 < probe <= p.PROBE_STEP_MAX_S:
        return None
    if not (math.isfinite(calibration) and calibration > 0):
        return None
    return DevicePace(0.0, probe * calibration)


def round_budget(times: Sequence[float | None], config: ServerConfig) -> float:
    """When the round is expected to stop waiting (seconds after its instructions go out), from the
    predicted times of its train instructions at full steps (None: a device not measured yet, taken as
    never answering, so a cohort the server knows too little of is not paced). Straggler policy grace:
    ``t_q + max(grace, t_q)``, ``t_q`` the time of the ``ceil(straggler_quorum * n)``-th answer, as
    :func:`~orchestrator.server.roundloop.closing` closes it; at most the deadline. Policy deadline: the
    deadline."""
    if config.straggler_policy != "grace" or not times:
        return config.deadline_s
    ordered = sorted(math.inf if t is None else t for t in times)
    t_q = ordered[max(1, math.ceil(config.straggler_quorum * len(ordered))) - 1]
    return min(config.deadline_s, t_q + max(config.straggler_grace_s, t_q))


def fit_steps(pace: DevicePace, steps: int, budget: float, margin: float = PACE_MARGIN) -> int:
    """The local steps to ask of a device of ``pace``: all ``steps`` while they fit ``budget``, else
    those that take ``margin`` of it, at least 1 (a device too slow even for one still trains one:
    its late report keeps its measurement current)."""
    if pace.seconds(steps) <= budget or steps <= 1:
        return steps
    if pace.step_s <= 0:
        return steps
    fit = math.floor((margin * budget - pace.overhead_s) / pace.step_s)
    return max(1, min(steps, fit))


class Paces:
    """Every device's measured pace (the one owner of it) and the pacing of a round's instructions."""

    def __init__(self, config: ServerConfig, known: Mapping[str, DevicePace] | None = None,
                 probe: Callable[[str], float | None] = lambda device_id: None,
                 keep: Callable[[str, DevicePace], None] = lambda device_id, pace: None,
                 kind: Callable[[str], str] = lambda device_id: "") -> None:
        """``known``: the paces measured before a restart; ``probe``: a connected device's hello's
        ``probe_step_s`` (None or 0: none); ``keep``: called with each new estimate (to journal it);
        ``kind``: which probe a device ran (its hello's runtimes: the SDK and backend that timed it),
        so a probe is calibrated only against devices that ran the same one."""
        self.config = config
        self._pace: dict[str, DevicePace] = dict(known or {})
        self._probe, self._keep, self._kind = probe, keep, kind
        self._out: dict[str, tuple[int, int, float]] = {}  # device -> (round, steps, sent at) of its train instruction

    @classmethod
    def kept(cls, config: ServerConfig, store: Store, sessions: Mapping[str, Session]) -> Paces:
        """The round loop's: the paces ``store.paces`` kept (a resumed run starts from them), each new
        one journaled there, and the seeds read from the connected devices' hellos."""
        def probe(device_id: str) -> float | None:
            session = sessions.get(device_id)
            return None if session is None else session.hello.probe_step_s

        def kind(device_id: str) -> str:
            session = sessions.get(device_id)
            return "" if session is None else ",".join(session.hello.runtimes)

        known = {d: DevicePace(*pace) for d, pace in store.paces.all().items()}
        return cls(config, known, probe, lambda d, pace: store.paces.record(d, pace.overhead_s, pace.step_s), kind)

    def of(self, device_id: str) -> DevicePace | None:
        """The device's measured pace."""
        return self._pace.get(device_id)

    def calibration(self, kind: str = "") -> float:
        """Seconds of the model's step per second of probe step: the median over the connected devices
        of probe ``kind`` both measured and probed (1.0 while there are none: the same arithmetic
        takes several times longer in one SDK than in another, so kinds are not mixed)."""
        ratios = [pace.step_s / probe for d, pace in self._pace.items()
                  if (probe := _seconds(self._probe(d))) is not None and 0 < probe <= p.PROBE_STEP_MAX_S
                  and pace.step_s > 0 and self._kind(d) == kind]
        return statistics.median(ratios) if ratios else 1.0

    def estimate(self, device_id: str, calibrations: dict[str, float] | None = None) -> DevicePace | None:
        """The device's measured pace, else its seed from its hello's probe (:func:`probe_seed`);
        ``calibrations``: by kind, filled as they are computed (one round's plan shares them)."""
        pace = self._pace.get(device_id)
        if pace is not None:
            return pace
        kind, known = self._kind(device_id), {} if calibrations is None else calibrations
        if kind not in known:
            known[kind] = self.calibration(kind)
        return probe_seed(self._probe(device_id), known[kind])

    def sent(self, device_id: str, wire: p.Instruction, now: float) -> None:
        """A train instruction went out (the first send counts: a resend after a reconnect keeps it)."""
        if wire.phase != "train":
            return
        out = self._out.get(device_id)
        if out is None or out[0] != wire.round:
            self._out[device_id] = (wire.round, wire.local_steps, now)

    def reported(self, device_id: str, msg: p.Report, now: float) -> DevicePace | None:
        """A report arrived, in time or late: the pace of the instruction it answers, blended in."""
        out = self._out.get(device_id)
        if msg.phase != "train" or out is None or out[0] != msg.round:
            return None
        del self._out[device_id]
        new = measure(now - out[2], out[1], msg.metrics)
        if new is None:
            return None
        old = self._pace.get(device_id)
        self._pace[device_id] = new if old is None else old.blend(new)  # a seed is replaced, never blended
        self._keep(device_id, self._pace[device_id])
        return self._pace[device_id]

    def plan(self, instructions: Sequence[Instruction]) -> tuple[list[Instruction], dict[str, int]]:
        """The round's instructions with a paced share of local steps for the devices whose measured
        (or, not timed yet, seeded) time would overrun the round's expected close
        (:func:`round_budget`), and those shares by device. Only train instructions at the server's
        own step count are paced: a strategy that asks for its own steps keeps them."""
        steps = self.config.local_steps
        calibrations: dict[str, float] = {}
        train = {ins.device_id: self.estimate(ins.device_id, calibrations) for ins in instructions
                 if ins.phase == "train" and ins.local_steps is None}
        budget = round_budget([None if pc is None else pc.seconds(steps) for pc in train.values()], self.config)
        paced: dict[str, int] = {}
        out: list[Instruction] = []
        for ins in instructions:
            pace = train.get(ins.device_id) if ins.phase == "train" and ins.local_steps is None else None
            k = steps if pace is None else fit_steps(pace, steps, budget)
            if k < steps:
                paced[ins.device_id] = k
                ins = replace(ins, local_steps=k)
            out.append(ins)
        return out, paced
