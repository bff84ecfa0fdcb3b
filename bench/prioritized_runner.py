"""One prioritized-FL run through the real system, for the prioritized benchmarks.

The real orchestrator (``Orchestrator``, the strategy chosen by name with typed options) and the real
device client (``DeviceClient``), every device with its own websocket on 127.0.0.1, all in this one
process (in-process clients, not the emulator). After every round the global model is scored on a
held-out set of the priority devices' data by a task's ``score`` (a plain torch forward of the
zoo model loaded with the round's state).

Algorithms (FedALIGN Section 4's and VaRSeL Section 5's comparisons):

- ``fedavg-priority``: FedAvg, only the priority (internal) devices connect;
- ``fedavg-all``: FedAvg, every device;
- ``fedalign``: FedALIGN, priority devices labelled ``priority=1``;
- ``varsel``: VaRSeL, the same devices labelled ``internal=1``.

Every strategy runs at ``make_strategy(name)``'s defaults (the settings ``bench/validated.toml``
records; :func:`strategy_options` adds only the run's seed, and what a command line asks for).
By default every run aggregates as the papers do: the server's norm bound and validation before
commit are off (``norm_bound`` 0, ``max_loss_rise`` 0) and FedAvg is the plain sample-weighted mean
(its weight cap off, ``max_weight_share`` 1), so the numbers measure the algorithms, not the
server's defences; ``server_defaults=True`` runs with the settings ``edgetrain serve`` has (the
defences on), to measure what they do to a prioritized round.

Each run keeps the final model's per-example results on the held-out set (``final_detail``:
correctness, or risks for the C-index), from which ``bench/prioritized_report.py`` computes the
bootstrap intervals of ``bench/intervals.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from edge_sdk.client import DeviceClient, DeviceSettings
from edge_sdk.models import build_model
from orchestrator.config import ServerConfig
from orchestrator.server import Orchestrator

ALGORITHMS = ("fedavg-priority", "fedavg-all", "fedalign", "varsel")
STRATEGY = {"fedavg-priority": "fedavg", "fedavg-all": "fedavg", "fedalign": "fedalign", "varsel": "varsel"}
# The papers' aggregation (module docstring): options a run's own options may override.
PAPERS_OPTIONS: dict[str, dict[str, object]] = {"fedavg": {"max_weight_share": 1.0}}
KEPT = ("round", "included", "excluded", "declined", "external_weight_sum", "sampled", "priority_loss",
        "internal_loss", "epsilon", "internal_spread", "externals_skipped", "zero_updates")


@dataclass(frozen=True)
class Device:
    """One device's local data and whether it is a priority (internal) device."""

    device_id: str
    kind: str  # what the report groups it by (its play, its region, aligned / noisy ...)
    x: np.ndarray
    y: np.ndarray
    priority: bool = False


@dataclass(frozen=True)
class Training:
    """The server's training settings for every algorithm of a benchmark."""

    model: str
    rounds: int
    local_steps: int
    batch_size: int
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    eval_data: str = "digits"  # the orchestrator's own test set; eval_every 0 skips it
    eval_every: int = 0
    eval_limit: int | None = 2000


@dataclass
class Scorer:
    """The priority objective's held-out score of a global state: ``metric(outputs, y)``; the last
    scored state's per-example results are :meth:`detail` (what the intervals resample)."""

    model: str
    x: np.ndarray
    y: np.ndarray
    metric: Callable[[np.ndarray, np.ndarray], float]
    batch: int = 512
    _net: torch.nn.Module | None = field(default=None, repr=False)
    _last: np.ndarray | None = field(default=None, repr=False)

    def __call__(self, state: Mapping[str, np.ndarray]) -> float:
        if self._net is None:
            self._net = build_model(self.model, seed=0)
        self._net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
        self._net.eval()
        with torch.no_grad():
            out = [self._net(torch.from_numpy(np.ascontiguousarray(self.x[i: i + self.batch]))).numpy()
                   for i in range(0, len(self.x), self.batch)]
        self._last = np.concatenate(out)
        return float(self.metric(self._last, self.y))

    def detail(self) -> dict | None:
        """The last scored model per example: ``correct`` (a string of 0/1, for accuracy) or ``risk``
        and the patients' ``y`` (event, time) for the C-index."""
        if self._last is None:
            return None
        if self.metric is accuracy:
            # test_set: which held-out set (seeds scored on the same one are resampled together)
            return {"correct": "".join("1" if c else "0" for c in np.argmax(self._last, axis=1) == self.y),
                    "test_set": hashlib.sha256(np.ascontiguousarray(self.x).tobytes()).hexdigest()[:16]}
        return {"risk": [float(r) for r in self._last.reshape(-1)], "y": np.asarray(self.y).tolist()}


def accuracy(outputs: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(outputs, axis=1) == y))


def strategy_options(algorithm: str, seed: int, **given: object) -> dict[str, object]:
    """The options a benchmark run gives ``algorithm``'s strategy: none but the run's seed (VaRSeL
    samples with it) and those a command line gave (``given`` entries that are not None), so every
    strategy runs at ``make_strategy``'s defaults unless a command asks otherwise."""
    out: dict[str, object] = {"seed": seed} if STRATEGY[algorithm] == "varsel" else {}
    out.update({k: v for k, v in given.items() if v is not None})
    return out


async def run_algorithm(algorithm: str, devices: Sequence[Device], training: Training, options: Mapping[str, object],
                        seed: int, store: Path, score: Scorer, *, server_defaults: bool = False) -> dict:
    """Run ``algorithm`` on ``devices``; the score after every round and what the strategy reported.
    ``server_defaults``: the server's defences as ``edgetrain serve`` has them, instead of the papers'
    aggregation."""
    # One intra-op thread in this thread too (the devices' training threads set theirs): two OpenMP
    # threads spinning on a loaded 2-core machine made an LSTM forward 50 times slower.
    torch.set_num_threads(1)
    fleet = [d for d in devices if d.priority] if algorithm == "fedavg-priority" else list(devices)
    papers = {} if server_defaults else PAPERS_OPTIONS.get(STRATEGY[algorithm], {})
    defences = {} if server_defaults else {"norm_bound": 0.0, "max_loss_rise": 0.0}
    config = ServerConfig(model=training.model, strategy=STRATEGY[algorithm], strategy_options={**papers, **options},
                          **defences, rounds=training.rounds, min_devices=len(fleet),
                          local_steps=training.local_steps,
                          batch_size=training.batch_size, lr=training.lr, momentum=training.momentum,
                          weight_decay=training.weight_decay, seed=seed, store_dir=store / algorithm,
                          eval_data=training.eval_data, eval_every=training.eval_every,
                          eval_limit=training.eval_limit, deadline_s=600)
    curve: list[float] = []
    orch: Orchestrator | None = None

    def on_event(kind: str, data: dict) -> None:
        if kind == "round_end" and orch is not None:
            curve.append(score(orch.global_state))

    orch = Orchestrator(config, on_event=on_event)
    ready = asyncio.Event()
    started = time.monotonic()
    server = asyncio.create_task(orch.run(ready=ready))
    await ready.wait()
    url = f"ws://127.0.0.1:{orch.port}"
    clients = []
    for d in fleet:
        labels = {"priority": "1", "internal": "1"} if d.priority else {}
        cfg = DeviceSettings(server=url, device_id=d.device_id, budget_bytes=4 << 30, labels=labels, backend="torch")
        clients.append(DeviceClient(cfg, d.x, d.y).run())
    history = (await asyncio.gather(server, *clients))[0]
    rounds = [{k: h.get(k) for k in KEPT if k in h} for h in history]
    return {"algorithm": algorithm, "seed": seed, "devices": len(fleet), "options": dict(options),
            "server_defaults": server_defaults, "priority_score": curve, "final": curve[-1] if curve else None,
            "final_detail": score.detail() if isinstance(score, Scorer) else None, "seconds": time.monotonic() - started, "rounds": rounds,
            "defences": defences_seen(store / algorithm, history, {d.device_id for d in fleet if d.priority})}


def defences_seen(store: Path, history: Sequence[Mapping], priority: set[str]) -> dict[str, int]:
    """What the server's defences did in a run: train updates folded, those the norm bound clipped
    (of them, the priority devices'), and rounds not committed at first (validation) or at all."""
    from bench.harness.journal import updates

    trains = [u for u in updates(store) if u["phase"] == "train" and u.get("accepted", True)]
    clipped = [u for u in trains if (u.get("bounded") or {}).get("clipped")]
    return {"train_updates": len(trains), "clipped": len(clipped),
            "clipped_priority": sum(u["device_id"] in priority for u in clipped),
            "retried_rounds": sum(bool(h.get("retried")) for h in history),
            "failed_rounds": sum("failed" in h for h in history)}


def included_kinds(run: dict, devices: Sequence[Device]) -> dict[str, float]:
    """Mean number of non-priority devices of each kind folded per round (FedALIGN's and VaRSeL's ``included``)."""
    kind = {d.device_id: d.kind for d in devices}
    counts: dict[str, float] = {}
    for r in run["rounds"]:
        for d in (r.get("included") or {}):
            counts[kind[d]] = counts.get(kind[d], 0.0) + 1
    return {k: v / max(1, len(run["rounds"])) for k, v in sorted(counts.items())}
