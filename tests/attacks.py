"""Attacker devices for tests: the production client trains honestly, then tampers with its update.

:class:`AttackerClient` is :class:`edge_sdk.client.DeviceClient` whose training backend is its own
one's (``edge_sdk.backends``) with ``train`` wrapped (:func:`tampering_backend`): it trains honestly
and returns the tampered deltas. The round work keeps a round's update per model payload and trains
it once, so every use of that update (the train report, a resent report after a reconnect, a
compare phase) sees the tampered deltas. Nothing else of the client changes: hello, downloads,
uploads and acks are the production code's.

:func:`run_fleet` runs a live :class:`~orchestrator.server.Orchestrator` over websockets on
127.0.0.1 with in-process devices (one event loop, training in worker threads) and returns the
round history. An honest device of the fleet is the same client without the wrapper.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.backends import TrainingBackend, backend_class
from edge_sdk.cli import load_shard
from edge_sdk.client import DeviceClient, DeviceSettings
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig

__all__ = ["ATTACKS", "DEMO_HONEST", "DEMO_SHARDS", "PLAIN", "ROUNDS_DEMO", "PLAIN_OPTIONS", "SECURE_ATTACKS", "SECURE_HONEST", "SECURE_SHARDS",
           "Attack", "AttackerClient", "FleetDevice",
           "FleetResult", "run_demo_fleet", "run_fleet", "run_secure_fleet", "secure_honest", "tampering_backend"]


@dataclass(frozen=True)
class Attack:
    """What an attacker does to its honestly trained update before sending it.

    Every float delta becomes ``scale * delta + shift`` (counters are left alone); ``claim`` times
    its samples are claimed (its data repeated ``claim`` times: the hello and every report say so,
    as a device that lies about its data would); ``split`` asks for that split (a budget chosen to
    land there; the server must allow forced splits)."""

    name: str
    scale: float = 1.0
    shift: float = 0.0
    claim: int = 1
    split: int | None = None

    def tamper(self, deltas: Mapping[str, np.ndarray | p.RowSparse]) -> dict[str, np.ndarray | p.RowSparse]:
        out: dict[str, np.ndarray | p.RowSparse] = {}
        for name, d in deltas.items():
            if isinstance(d, p.RowSparse):
                out[name] = p.RowSparse(d.indices, self._apply(d.values), d.num_rows)
            else:
                out[name] = self._apply(d)
        return out

    def _apply(self, d: np.ndarray) -> np.ndarray:
        if d.dtype.kind != "f":
            return d
        return np.asarray(d * self.scale + self.shift, dtype=d.dtype)


#: The attacks of the suite. ``inflated`` sends a sign-flipped update behind a 100-fold sample claim
#: (an inflated claim behind an honest update only shifts weight to honest data). ``lone`` sits
#: alone at split 1 (blocks fc2..head of digits_mlp) and boosts its update tenfold. ``free_rider``
#: sends 0.01 of its honest update: the right direction, next to no step, full weight.
ATTACKS: dict[str, Attack] = {a.name: a for a in (
    Attack("boost10", scale=10.0),
    Attack("boost100", scale=100.0),
    Attack("sign_flip", scale=-1.0),
    Attack("constant", shift=1.0),
    Attack("inflated", scale=-1.0, claim=100),
    Attack("lone", scale=10.0, split=1),
    Attack("free_rider", scale=0.01),
)}


def tampering_backend(attack: Attack, base: type[TrainingBackend]) -> type[TrainingBackend]:
    """``base``, training honestly and returning ``attack``'s tampered deltas (under its own name)."""

    class Tampering(base):  # type: ignore[valid-type, misc]
        def train(self, tail, y, config):  # type: ignore[no-untyped-def]
            result = super().train(tail, y, config)
            return dataclasses.replace(result, deltas=attack.tamper(result.deltas))

    return Tampering


class AttackerClient(DeviceClient):
    """The production client, tampering with each round's update (see the module docstring)."""

    def __init__(self, config: DeviceSettings, x: np.ndarray, y: np.ndarray, attack: Attack, **kwargs) -> None:
        if attack.claim > 1:  # the repeated data must fit the budget it declares, or the planner refuses the hello
            extra = (x.nbytes + y.nbytes) * (attack.claim - 1)
            x, y = np.concatenate([x] * attack.claim), np.concatenate([y] * attack.claim)
            config = dataclasses.replace(config, budget_bytes=config.budget_bytes + 4 * extra)
        if attack.split is not None:
            config = dataclasses.replace(config, labels={**config.labels, "force_split": str(attack.split)})
        config = dataclasses.replace(config, backend=tampering_backend(attack, backend_class(config.backend)))
        super().__init__(config, x, y, **kwargs)
        self.attack = attack


@dataclass(frozen=True)
class FleetDevice:
    """One device of a test fleet: its id, its shard of the digits training split, an optional
    forced split, and an optional attack."""

    device_id: str
    shard: int
    split: int | None = None
    attack: Attack | None = None


@dataclass
class FleetResult:
    history: list[dict]
    errors: dict[str, str]  # device -> what ended it, if not the server's goodbye

    @property
    def accuracy(self) -> float:
        return float(self.history[-1]["accuracy"])

    def mean_accuracy(self, last: int = 5) -> float:
        """The mean accuracy of the last ``last`` rounds (one round's is noisy at a few hundred samples)."""
        return float(sum(h["accuracy"] for h in self.history[-last:]) / len(self.history[-last:]))


async def _fleet(config: ServerConfig, devices: Sequence[FleetDevice], shards: int, budget: int,
                 secrets: Mapping[str, str]) -> FleetResult:
    orch, server = await start_orchestrator(config, lambda kind, data: None)
    url = f"ws://127.0.0.1:{orch.port}"
    clients = []
    for d in devices:
        x, y = load_shard("digits", client=d.shard, num_clients=shards, partition="iid", seed=config.seed)
        labels = {} if d.split is None else {"force_split": str(d.split)}
        cfg = DeviceSettings(url, d.device_id, budget, labels=labels, reconnect=False,
                           secret=secrets.get(d.device_id, ""))
        clients.append(DeviceClient(cfg, x, y) if d.attack is None else AttackerClient(cfg, x, y, d.attack))
    runs = await asyncio.gather(*(c.run() for c in clients), return_exceptions=True)
    history = await server
    errors = {d.device_id: repr(r) for d, r in zip(devices, runs) if isinstance(r, BaseException)}
    return FleetResult(history, errors)


#: The settings of a plain FedAvg / EmbracingFL server: the mean, no weight cap, no norm bound, no
#: validation before commit (what the papers' update rules describe).
PLAIN: dict[str, object] = {"norm_bound": 0.0, "max_loss_rise": 0.0}
PLAIN_OPTIONS: dict[str, object] = {"aggregation": "mean", "max_weight_share": 1.0}


def run_fleet(store_dir: Path, devices: Sequence[FleetDevice], *, aggregation: str | None = "mean", rounds: int = 8,
              options: Mapping[str, object] | None = None, seed: int = 0, local_steps: int = 10,
              shards: int = 5, credentials: bool = False, settings: Mapping[str, object] | None = None,
              strategy: str = "embracingfl") -> FleetResult:
    """Train digits_mlp with ``devices`` against a live orchestrator; every device must take part
    in every round (min_devices is the fleet's size). The digits training split is cut into
    ``shards`` iid shards whatever the fleet, so a fleet without its attacker keeps the same data.
    ``aggregation`` None keeps the strategy's default; ``settings`` are further ServerConfig fields;
    ``credentials``: every device is enrolled (without a fixed sample count) and proves it."""
    from emulator.localfleet import role_budgets
    from orchestrator.store import Store

    agg = {} if aggregation is None else {"aggregation": aggregation}
    config = ServerConfig(model="digits_mlp", rounds=rounds, min_devices=len(devices), local_steps=local_steps,
                          lr=0.1, seed=seed, store_dir=store_dir, deadline_s=120, allow_forced_split=True,
                          strategy=strategy, strategy_options={**agg, **(options or {})},
                          require_credentials=credentials, **(settings or {}))
    secrets: dict[str, str] = {}
    if credentials:
        with Store(store_dir) as store:
            secrets = {d.device_id: store.credentials.enroll(d.device_id) for d in devices}
    budget = role_budgets("digits_mlp", secure=bool((settings or {}).get("secure_aggregation")))["strong"]
    return asyncio.run(_fleet(config, devices, shards, budget, secrets))


#: The demo's fleet shape (the hostile kit's): two devices training the whole model and one training
#: blocks 2-3, on iid shards 0-2 of the digits training split cut in :data:`DEMO_SHARDS`; an insider
#: takes shard 3 and, unless its attack forces a split, the whole model too, so blocks 0-1 are
#: trained by three devices, one of them hostile.
DEMO_HONEST = (FleetDevice("strong-0", 0), FleetDevice("strong-1", 1), FleetDevice("weak-0", 2, split=2))
DEMO_SHARDS = 4
#: Rounds of the demo fleet in the slow test and the benchmark.
ROUNDS_DEMO = 8


def run_demo_fleet(store_dir: Path, attack: str | None, *, rounds: int = ROUNDS_DEMO, trust: bool = True,
                   seed: int = 0, insiders: int = 1) -> FleetResult:
    """The demo's fleet under the default settings, every device enrolled and proving its
    credential, with the insider ``attack`` of :data:`ATTACKS` (None: the honest fleet alone);
    ``trust`` False turns direction trust off (the rest of the defaults stay). Every round waits for
    every device (``straggler_policy`` deadline): on a loaded machine the grace period would close a
    round without the slowest device, and selection would then leave it out, so the insider would
    not be measured in every round. ``insiders`` > 1: that many colluding insiders, all on the
    insider's shard (the same honest update, tampered alike)."""
    names = ["attacker"] if insiders == 1 else [f"attacker-{i}" for i in range(insiders)]
    devices = DEMO_HONEST + (tuple(FleetDevice(n, DEMO_SHARDS - 1, attack=ATTACKS[attack]) for n in names)
                             if attack else ())
    settings: dict[str, object] = {"straggler_policy": "deadline", **({} if trust else {"direction_trust": False})}
    return run_fleet(store_dir, devices, aggregation=None, rounds=rounds, credentials=True, shards=DEMO_SHARDS,
                     seed=seed, settings=settings)


# -- insiders of secure rounds ------------------------------------------------------------------------
#: How an insider's secure round misbehaves (besides tampering with its update before it is masked):
#: ``no_clip`` encodes its update without the device's clip (a fixed point whose clip is 10^6 times the
#: round's); ``bad_seals`` sends random bytes in place of its sealed shares; ``wrong_shares`` answers the
#: unmasking with every share altered; ``weight_word`` adds a quarter of the ring to each block's weight word.
ROUND_TAMPERS = ("no_clip", "bad_seals", "wrong_shares", "weight_word")
#: The insiders of secure rounds: name -> (the update's tampering, the secure round's).
SECURE_ATTACKS: dict[str, tuple[Attack, str]] = {
    "sign_flip": (ATTACKS["sign_flip"], ""),
    "boost100": (ATTACKS["boost100"], ""),
    "constant": (ATTACKS["constant"], ""),
    "noclip_x100": (Attack("noclip_x100", scale=100.0), "no_clip"),
    "noclip_x-3": (Attack("noclip_x-3", scale=-3.0), "no_clip"),
    "wrong_shares": (Attack("wrong_shares"), "wrong_shares"),
    "bad_seals": (Attack("bad_seals"), "bad_seals"),
    "weight_word": (Attack("weight_word"), "weight_word"),
    "free_rider": (ATTACKS["free_rider"], ""),
}
#: The secure fleet: six devices training the whole model and one training blocks 2-3 (the demo fleet's
#: shape, doubled, so that the cohort holds two groups of at least 3 that each train blocks 0-1 with t = 3),
#: on iid shards 0-6 of the digits training split cut in :data:`SECURE_SHARDS`; insiders take shard 7.
SECURE_SHARDS = 8


def secure_honest(shards: int = SECURE_SHARDS) -> tuple[FleetDevice, ...]:
    """The secure fleet's honest devices for the digits training split cut in ``shards``: ``shards - 2``
    at split 0 and one at split 2, on shards 0 to ``shards - 2``; the last shard is the insiders'."""
    return tuple(FleetDevice(f"strong-{i}", i) for i in range(shards - 2)) + (FleetDevice("weak-0", shards - 2, split=2),)


SECURE_HONEST = secure_honest()


def _tampered_round(how: str):  # noqa: ANN202 - a DeviceRound subclass, built when secure aggregation loads
    import os

    from edge_sdk.secagg.fixedpoint import FixedPoint
    from edge_sdk.secagg.masks import ring_mask
    from edge_sdk.secagg.round import DeviceRound

    class TamperedRound(DeviceRound):
        def share(self, peers):  # type: ignore[no-untyped-def]
            sealed = super().share(peers)
            if how == "no_clip":  # an unchecked fixed point: the same words, a clip nobody reaches
                fixed = object.__new__(FixedPoint)
                for f in dataclasses.fields(FixedPoint):
                    object.__setattr__(fixed, f.name, getattr(self.fixed, f.name))
                object.__setattr__(fixed, "clip", self.fixed.clip * 1e6)
                self.fixed = fixed
            return {v: os.urandom(len(s)) for v, s in sealed.items()} if how == "bad_seals" else sealed

        def mask(self, blocks, num_samples):  # type: ignore[no-untyped-def]
            words = super().mask(blocks, num_samples)
            if how == "weight_word":
                ring = ring_mask(self.fixed.ring_bits)
                for w in words:
                    w[-1] = (int(w[-1]) + (1 << (self.fixed.ring_bits - 2))) & ring
            return words

        def reveal(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            seeds, keys = super().reveal(*args, **kwargs)
            if how == "wrong_shares":
                def alter(s: bytes) -> bytes:  # every 33-byte share's last byte flipped
                    return bytes(b ^ 0x5A if (i + 1) % 33 == 0 else b for i, b in enumerate(s))
                seeds = {v: alter(s) if v != self.device_id else s for v, s in seeds.items()}
                keys = {v: alter(s) for v, s in keys.items()}
            return seeds, keys

    return TamperedRound


def run_secure_fleet(store_dir: Path, attack: str | None, *, secure: bool = True, group_size: int = 3,
                     rounds: int = ROUNDS_DEMO, seed: int = 0, insiders: int = 1,
                     shards: int = SECURE_SHARDS, group_norm: str | None = None) -> FleetResult:
    """:func:`secure_honest` (``shards``: :data:`SECURE_HONEST` at the default 8) under the default
    settings with ``secure`` aggregation in groups of at least ``group_size`` (0: one group), every
    device enrolled, and ``insiders`` devices of :data:`SECURE_ATTACKS` ``attack`` on the last shard
    (None: the honest fleet alone). Every round waits for every device. A larger ``shards`` cuts the
    same data among more devices, so the cohort holds more groups: one spoiled group carries a smaller
    share of the round. ``group_norm``: ``secure_group_norm`` (None: the default)."""
    from edge_sdk.secagg import Scope, exchange

    names = ["attacker"] if insiders == 1 else [f"attacker-{i}" for i in range(insiders)]
    update, how = SECURE_ATTACKS[attack] if attack else (None, "")
    devices = secure_honest(shards) + (tuple(FleetDevice(n, shards - 1, attack=update) for n in names) if attack else ())
    settings: dict[str, object] = {"straggler_policy": "deadline", "secure_aggregation": secure,
                                   **({"secure_group_size": group_size} if secure else {}),
                                   **({"secure_group_norm": group_norm} if secure and group_norm else {})}
    honest_start, tampered = exchange.start, _tampered_round(how) if how else None

    def start(device_id, secret, ins, num_blocks, min_survivors):  # type: ignore[no-untyped-def]
        if tampered is None or device_id not in names:
            return honest_start(device_id, secret, ins, num_blocks, min_survivors)
        return tampered(device_id, secret, Scope(str(ins.config[p.SECAGG_KEY]), ins.round), ins.split, num_blocks,
                        min_survivors=min_survivors)

    exchange.start = start
    try:
        return run_fleet(store_dir, devices, aggregation=None, rounds=rounds, credentials=True, shards=shards,
                         seed=seed, settings=settings)
    finally:
        exchange.start = honest_start
