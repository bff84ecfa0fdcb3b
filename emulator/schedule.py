"""From a fleet file to what an emulated run starts: the orchestrator's settings and one
:class:`~emulator.launch.DeviceLaunch` per device, with the rounds it vanishes in.

Shared by both emulation modes, so that a fleet runs the same devices whichever mode it names.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from emulator.faults import Faults
from emulator.fleet import DeviceSpec, Fleet, device_labels
from emulator.launch import DeviceLaunch
from orchestrator.config import ServerConfig

__all__ = ["device_launch", "drop_schedule", "server_config"]


def drop_schedule(fleet: Fleet, devices: Iterable[DeviceSpec], rounds: int) -> dict[str, tuple[int, ...]]:
    """The rounds in which each device vanishes mid-round: each round with probability ``dropout``.

    Decided by the emulator (seeded by the fleet seed and the device id), so a run is reproducible and
    a restarted device keeps the same schedule."""
    out: dict[str, tuple[int, ...]] = {}
    for d in devices:
        p = d.behaviour.dropout
        if p <= 0:
            out[d.id] = ()
            continue
        u = np.random.default_rng([fleet.seed, zlib.crc32(d.id.encode())]).random(rounds)
        out[d.id] = tuple(int(r) + 1 for r in np.flatnonzero(u < p))
    return out


def server_config(fleet: Fleet, *, rounds: int | None = None, store_dir: Path, data_root: str | None = None,
                  deadline_s: float = 120.0) -> ServerConfig:
    """The orchestrator's settings for a fleet: its training section, waiting for every device first,
    honouring the forced splits of its groups; a secure fleet's server requires credentials (each
    device is enrolled in the run's store: :mod:`emulator.credentials`)."""
    t = fleet.training
    return dataclasses.replace(
        t, model=fleet.model, strategy_options=dict(fleet.strategy_options), rounds=rounds or t.rounds,
        min_devices=fleet.num_devices, seed=fleet.seed, eval_data=fleet.dataset, data_root=data_root,
        store_dir=store_dir, deadline_s=deadline_s, planner_batch=t.batch_size, port=0,
        wait_devices_s=120.0,  # the emulator starts the devices: a fleet that died is an error, not a wait
        allow_forced_split=True,  # fleet groups may force a split (force_split)
        require_credentials=t.require_credentials or t.secure_aggregation,
    )


def device_launch(fleet: Fleet, spec: DeviceSpec, drop_rounds: Iterable[int] = (), *,
                  data_limit: int | None = None) -> DeviceLaunch:
    """How to start one device of the fleet: its budget, class (and the class's cores, declared in
    its hello), data shard, training backend, hello labels (its group's ``priority`` and ``tags``)
    and misbehaviour."""
    part = fleet.partition
    scheme = f"dirichlet:{part.alpha}" if part.scheme == "dirichlet" else part.scheme
    b = spec.behaviour
    delay_s = 0.0
    if b.latency_ms or b.jitter_ms:
        # One fixed delay per device: its latency plus a seeded share of the jitter.
        jitter = np.random.default_rng([spec.seed, 1]).random() * b.jitter_ms
        delay_s = round((b.latency_ms + jitter) / 1000, 4)
    return DeviceLaunch(
        device_id=spec.id, budget_bytes=spec.budget_bytes, client=spec.index, num_clients=fleet.num_devices,
        data=fleet.dataset, partition=scheme, device_class=spec.device_class, seed=part.seed, data_limit=data_limit,
        cores=spec.cores,
        faults=Faults(drop_rounds=tuple(drop_rounds), delay_s=delay_s, force_split=spec.force_split, drop_at=b.drop_at),
        labels=device_labels(spec), classes=spec.classes, max_samples=spec.samples, label_noise=spec.label_noise,
        backend=spec.backend,
    )
