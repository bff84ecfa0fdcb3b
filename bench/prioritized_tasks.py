"""The prioritized benchmarks' tasks: which devices, which priority group, what is scored.

A task builds, for one priority choice and one seed, the devices (their data and whether they are
priority devices), the held-out data the priority objective is scored on, and the training
settings. ``held_out="test"`` scores on the priority group's test data (the benchmark);
``held_out="validation"`` keeps a validation part of the priority devices' own data off the devices
and scores on it (``bench/fedalign_epsilon.py``'s grid), so choosing epsilon never sees the test data.

- ``shakespeare``: Tiny Shakespeare's speaking roles (``edge_sdk.data.shakespeare``); a device per
  role (the ``roles`` longest roles of each of the ``plays``), priority = the roles of one play
  (the Selfish FL paper's Section 5.2 natural grouping, internal = one play's roles); next-character
  prediction with ``char_lstm``, scored by accuracy on the priority roles' held-out text.
- ``tcga``: Fed-TCGA-BRCA's six regions (``edge_sdk.data.tcga_brca``); each region's training
  patients on 3 devices (VaRSeL needs at least 2 internal devices; its paper splits one FeTS site
  over 3 the same way), priority = one region; the linear Cox model ``cox_linear`` (FLamby's task)
  scored by the C-index on the region's test patients (FLamby's split).
- ``mnist``: ``bench/prioritized.py``'s constructed setting (one choice: the seed's 5 priority classes).

``--priority-labels swapped`` builds, from the same natural data, a priority group whose labels differ
from every other device's (the case a selection rule must not let in before it can tell devices
apart): Shakespeare's priority roles speak in swapped case (``str.swapcase``: the characters to predict
are capitals where every other role's are small letters, and the reverse), TCGA-BRCA's priority
region has its survival times reversed (t -> T - t: a longer life now ranks as the higher risk, the
opposite of every other region's).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

import numpy as np

from bench.prioritized_runner import Device, Scorer, Training, accuracy
from edge_sdk.models import build_model

HeldOut = Literal["test", "validation"]
# 3 of Tiny Shakespeare's 9 plays, a history, a tragedy and a comedy (the paper takes 6 of the
# complete works; 3 keep 4 algorithms x 3 choices x 3 seeds within half an hour on 2 cores).
SHAKESPEARE_PLAYS = ("Coriolanus", "Romeo and Juliet", "The Taming of the Shrew")
TASKS = ("shakespeare", "tcga", "mnist")


@dataclass
class Instance:
    """One priority choice of a task at one seed."""

    devices: list[Device]
    scorer: Scorer
    training: Training


def shakespeare_training(args: argparse.Namespace) -> Training:
    return Training(model="char_lstm", rounds=args.rounds or 15, local_steps=args.local_steps or 10,
                    batch_size=args.batch_size or 32, lr=args.lr or 0.5, momentum=0.9)


def shakespeare(choice: str, seed: int, held_out: HeldOut, args: argparse.Namespace) -> Instance:
    """Priority: the roles of play ``choice``; every play's ``args.roles`` longest roles are devices."""
    from edge_sdk.data.shakespeare import load_roles, role_split, windows

    roles, vocab = load_roles()
    plays = args.plays or SHAKESPEARE_PLAYS
    if choice not in plays:
        raise ValueError(f"priority play {choice!r} is not one of the plays {plays}")
    devices, test_x, test_y = [], [], []
    seq = build_model("char_lstm", seed=0).input_shape[0]  # the context the model declares (the server checks it)
    for play in plays:
        cast = sorted((r for r in roles if r.play == play), key=lambda r: -len(r.text))[: args.roles]
        for role in cast:
            validation = 0.1 if held_out == "validation" else 0.0
            text = role.text.swapcase() if play == choice and args.priority_labels == "swapped" else role.text
            train, val, test = role_split(text, test=0.2, validation=validation)
            x, y = windows(vocab.encode(train), seq)
            devices.append(Device(role.device_id, play, x, y, priority=play == choice))
            if play == choice:
                hx, hy = windows(vocab.encode(val if held_out == "validation" else test), seq, stride=3)
                test_x.append(hx)
                test_y.append(hy)
    x, y = np.concatenate(test_x), np.concatenate(test_y)
    keep = np.sort(np.random.default_rng(0).permutation(len(x))[: args.score_samples])
    return Instance(devices, Scorer("char_lstm", x[keep], y[keep], accuracy), shakespeare_training(args))


def tcga_training(args: argparse.Namespace) -> Training:
    return Training(model="cox_linear", rounds=args.rounds or 30, local_steps=args.local_steps or 10,
                    batch_size=args.batch_size or 128, lr=args.lr or 0.01)


def tcga(choice: str, seed: int, held_out: HeldOut, args: argparse.Namespace) -> Instance:
    """Priority: region ``choice``'s patients; every region's training patients on 3 devices."""
    from edge_sdk.data.tcga_brca import REGIONS, concordance_index, load_tcga_brca

    if choice not in REGIONS:
        raise ValueError(f"priority region {choice!r} is not one of {REGIONS}")
    train = load_tcga_brca("train")
    test = load_tcga_brca("test")
    if args.priority_labels == "swapped":
        train, test = _reversed_times(train, choice), _reversed_times(test, choice)
    devices = []
    score_x = score_y = None
    for region in REGIONS:
        part = train.of(region)
        order = np.random.default_rng(0).permutation(len(part.x))  # the same silos for every seed
        if region == choice and held_out == "validation":
            cut = len(order) // 4  # a quarter of the priority patients: the validation set
            score_x, score_y, order = part.x[order[:cut]], part.y[order[:cut]], order[cut:]
        for i, idx in enumerate(np.array_split(order, 3)):
            devices.append(Device(f"{region.lower()}-{i}", region, part.x[idx], part.y[idx], priority=region == choice))
    if held_out == "test":
        mine = test.of(choice)
        score_x, score_y = mine.x, mine.y
    assert score_x is not None and score_y is not None
    scorer = Scorer("cox_linear", score_x, score_y, lambda out, y: concordance_index(out.reshape(-1), y))
    return Instance(devices, scorer, tcga_training(args))


#: The time survival times are reversed from (``--priority-labels swapped``): above every time in
#: Fed-TCGA-BRCA (its longest follow-up is 8,605 days), so reversed times stay positive.
REVERSED_FROM = 10_000.0


def _reversed_times(patients, region: str):
    """``patients`` with ``region``'s survival times reversed (t -> REVERSED_FROM - t), events kept."""
    from dataclasses import replace

    y = patients.y.copy()
    mine = patients.region == region
    y[mine, 1] = REVERSED_FROM - y[mine, 1]
    return replace(patients, y=y)


def mnist(choice: str, seed: int, held_out: HeldOut, args: argparse.Namespace) -> Instance:
    """``bench/prioritized.py``'s setting at its defaults; validation: unused training images of
    each priority device's classes (its distribution), 100 per device."""
    from bench.prioritized import MODEL, default_args, make_shards
    from edge_sdk.data import load_dataset

    settings = default_args()
    if args.priority_labels == "swapped":
        settings.nonpriority_labels = "other"  # no non-priority device holds a priority class
    train = load_dataset("mnist", split="train")
    shards, prio, spare = make_shards(settings, seed, train)
    devices = [Device(d, kind, x, y, priority=kind == "priority") for d, kind, x, y in shards]
    if held_out == "validation":
        idx = np.concatenate([spare[d][:100] for d, kind, _, _ in shards if kind == "priority"])
        x, y = train.x[idx], train.y[idx]
    else:
        test = load_dataset("mnist", split="test")
        mask = np.isin(test.y, prio)
        x, y = test.x[mask], test.y[mask]
    training = Training(model=MODEL, rounds=args.rounds or settings.rounds, local_steps=settings.local_steps,
                        batch_size=settings.batch_size, lr=settings.lr, eval_data="mnist",
                        eval_every=args.rounds or settings.rounds)
    return Instance(devices, Scorer(MODEL, x, y, accuracy), training)


def choices(task: str, args: argparse.Namespace) -> tuple[str, ...]:
    """Every priority choice of ``task``: each play, each region, or MNIST's one."""
    if task == "shakespeare":
        return tuple(args.plays or SHAKESPEARE_PLAYS)
    if task == "tcga":
        from edge_sdk.data.tcga_brca import REGIONS

        return REGIONS
    return ("5-classes",)


def instance(task: str, choice: str, seed: int, held_out: HeldOut, args: argparse.Namespace) -> Instance:
    builders = {"shakespeare": shakespeare, "tcga": tcga, "mnist": mnist}
    return builders[task](choice, seed, held_out, args)


def add_task_arguments(ap: argparse.ArgumentParser, required: bool = True) -> None:
    """The options every prioritized benchmark command takes (0: the task's default)."""
    ap.add_argument("--task", choices=TASKS, required=required)
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--local-steps", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.0)
    ap.add_argument("--roles", type=int, default=3, help="shakespeare: devices per play (its longest roles)")
    ap.add_argument("--plays", type=lambda s: tuple(p.strip() for p in s.split(";") if p.strip()), default=None,
                    help="shakespeare: the plays, separated by ';' (default: 3 plays)")
    ap.add_argument("--score-samples", type=int, default=2000, help="shakespeare: held-out windows scored")
    ap.add_argument("--priority-labels", choices=("natural", "swapped"), default="natural",
                    help="swapped: a priority group whose labels differ from the others' (shakespeare: its roles' "
                         "text in swapped case; tcga: its survival times reversed)")
