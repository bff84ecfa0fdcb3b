"""A device's footprint counts only its rows of each sparse table when the strategy sends row
selections (FedSubAvg): a budget that cannot hold the recommender's full tables but holds the
device's rows trains its submodel; one too small even for its rows is never sent the instruction.

Real device processes (``python -m edge_sdk``) over websockets on 127.0.0.1, one MovieLens-shaped
user each (synthetic_ratings, natural partition).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.data import load_dataset, partition
from edge_sdk.models import build_model
from emulator.faults import Faults
from emulator.localfleet import DeviceLaunch, run_local_fleet
from orchestrator.config import ServerConfig
from profiles.accounting import measure_model
from profiles.planner import PlanError, plan_split
from profiles.runtime import runtime_memory

USERS = 40  # synthetic_ratings: one device per user
TABLES = ("blocks.embeddings.user.weight", "blocks.embeddings.item.weight")
MiB = 1 << 20


def _rows(client: int) -> tuple[dict[str, int], int]:
    data = load_dataset("synthetic_ratings", split="train")
    x = data.x[partition(data.groups, USERS, "natural", seed=0)[client]]
    return {TABLES[0]: len(np.unique(x[:, 0])), TABLES[1]: len(np.unique(x[:, 1]))}, len(x)


@pytest.fixture(scope="module")
def budgets() -> dict[str, int]:
    cost = measure_model(build_model("recommender"))
    runtime = runtime_memory().training
    rows, samples = _rows(0)
    full = cost.footprint(0, 32, runtime_bytes=runtime, local_samples=samples).total
    sub = cost.footprint(0, 32, runtime_bytes=runtime, local_samples=samples, rows=rows).total
    assert full - sub > 4 * MiB  # the tables are most of the model
    between = (full + sub) // 2
    # Whole tables fit no split at this budget (freezing the tables streams them whole).
    with pytest.raises(PlanError):
        plan_split(cost, between, 32, runtime=runtime, local_samples=samples)
    plan = plan_split(cost, between, 32, runtime=runtime, local_samples=samples, rows=rows)
    assert plan.split == 0 and plan.rows == rows and plan.footprint_bytes <= between
    return {"between": between, "too_small": sub - MiB}


def test_rows_fit_where_tables_do_not_and_too_small_is_skipped(tmp_path: Path, budgets) -> None:
    # Device 0 plans at split 0 for its rows. Devices 1 and 2 register with a forced split (2: the
    # head only) and FedSubAvg(split="zero") asks them for every block: the server's budget check
    # counts their rows, which device 2's budget holds (the whole tables it would not) and device
    # 1's does not.
    launches = [
        DeviceLaunch("sub-0", budgets["between"], client=0, num_clients=USERS, data="synthetic_ratings",
                     partition="natural"),
        DeviceLaunch("tiny-1", budgets["too_small"], client=1, num_clients=USERS, data="synthetic_ratings",
                     partition="natural", faults=Faults(force_split=2)),
        DeviceLaunch("sub-2", budgets["between"], client=2, num_clients=USERS, data="synthetic_ratings",
                     partition="natural", faults=Faults(force_split=2)),
    ]
    config = ServerConfig(model="recommender", strategy="fedsubavg", strategy_options={"split": "zero"}, rounds=1,
                          min_devices=3, local_steps=2, batch_size=8, store_dir=tmp_path / "store",
                          eval_data="synthetic_ratings", deadline_s=120)
    events: list[tuple[str, dict]] = []
    run = asyncio.run(run_local_fleet(config, launches, on_event=lambda k, d: events.append((k, d))))
    registered = {d["device"]: d for k, d in events if k == "registered"}
    assert registered["sub-0"]["split"] == 0 and registered["tiny-1"]["split"] == registered["sub-2"]["split"] == 2
    over = [d for k, d in events if k == "over_budget"]
    assert [d["device"] for d in over] == ["tiny-1"]
    assert over[0]["split"] == 0 and over[0]["footprint_bytes"] > budgets["too_small"]
    sent = [d for k, d in events if k == "sent" and d["kind"] == "model"]
    assert {d["device"] for d in sent} == {"sub-0", "sub-2"}
    for d in sent:  # its rows, not the 10,353-row tables
        rows, _ = _rows(int(d["device"][-1]))
        assert d["bytes"] < 32 * 4 * (sum(rows.values()) + 2_000)
    updates = [d for k, d in events if k == "update" and d["phase"] == "train"]
    assert sorted(d["device"] for d in updates) == ["sub-0", "sub-2"]
    assert [h["reported"] for h in run.history] == [2]
