"""Fleet files: every shipped fleet loads and expands to the counts it states, device ids and seeds are
unique and stable, the planner gives each group the role the file expects, and bad files get errors that
name the file and the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from emulator.fleet import (
    FLEETS_DIR,
    Fleet,
    FleetError,
    device_seed,
    fleet_names,
    load_fleet,
    parse_fleet,
)
from emulator.schedule import server_config

MiB = 1 << 20
RUNTIME = 400 * MiB  # a training runtime's memory, for budgets written as "runtime+..."
# name -> (devices in all, devices per expected role)
SHIPPED = {
    "embracingfl-16s-112w": (128, {"strong": 16, "weak": 112}),
    "embracingfl-25-25-50": (128, {"strong": 32, "moderate": 32, "weak": 64}),
    "cifar10-resnet20-mixed": (6, {"strong": 2, "moderate": 2, "weak": 2}),
    "femnist-75weak": (16, {"strong": 4, "weak": 12}),
    "tiny-capped": (5, None),
    "tiny-200": (200, None),
}


def by_role(fleet: Fleet) -> dict[str, int]:
    counts: dict[str, int] = {}
    for d in fleet.devices():
        if d.expect_role is not None:
            counts[d.expect_role] = counts.get(d.expect_role, 0) + 1
    return counts


def test_the_papers_fleets_and_the_small_ones_are_shipped():
    assert set(SHIPPED) <= set(fleet_names())


@pytest.mark.parametrize("name", fleet_names())
def test_every_shipped_fleet_loads_and_expands(name):
    fleet = load_fleet(name)
    assert fleet.name == name and fleet.path == FLEETS_DIR / f"{name}.toml"
    assert fleet.description  # each file says what it mirrors
    devices = fleet.devices(runtime=RUNTIME)
    assert len(devices) == fleet.num_devices == sum(fleet.counts().values())
    assert [d.index for d in devices] == list(range(len(devices)))
    ids = [d.id for d in devices]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(rf"{re.escape(d.group)}-\d{{3,}}", d.id) for d in devices)
    assert len({d.seed for d in devices}) == len(devices)
    assert all(d.budget_bytes > 0 and d.cores >= 1 and d.speed > 0 for d in devices)
    assert fleet.devices(RUNTIME) == devices  # deterministic
    assert load_fleet(FLEETS_DIR / f"{name}.toml").devices(RUNTIME) == devices  # by path, the same devices
    for d in devices:
        g = fleet.groups[[x.name for x in fleet.groups].index(d.group)]
        expected = g.budget_bytes if g.budget_over_runtime is None else RUNTIME + g.budget_over_runtime
        assert d.budget_bytes == expected
    if name in SHIPPED:
        total, roles = SHIPPED[name]
        assert len(devices) == total
        if roles is not None:
            assert by_role(fleet) == roles


def test_the_papers_mixes_and_settings():
    f = load_fleet("embracingfl-16s-112w")
    assert (f.model, f.dataset, f.partition.scheme, f.partition.alpha) == ("resnet20", "cifar10", "dirichlet", 0.1)
    assert f.training.fraction == 1.0  # section 4.1: all 128 clients join every round
    assert (f.training.local_steps, f.training.batch_size) == (10, 32)
    g = load_fleet("embracingfl-25-25-50")
    assert g.training.fraction == 0.25  # section 4.2: 25% of the 128 clients per round
    h = load_fleet("femnist-75weak")
    assert (h.model, h.dataset, h.partition.scheme) == ("leaf_cnn", "femnist", "natural")
    assert by_role(h)["weak"] / h.num_devices == 0.75
    assert load_fleet("tiny-200").emulation.mode == "lightweight"
    assert load_fleet("tiny-capped").model == "digits_mlp"


@pytest.fixture(scope="module")
def runtime():
    """The runtimes' memory on this machine, as the emulator plans with it (measured once, cached)."""
    pytest.importorskip("profiles.runtime", reason="profiles.runtime is not there yet")
    from profiles.runtime import runtime_memory

    return runtime_memory()


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_planner_gives_each_group_its_expected_role(name, runtime):
    planner = pytest.importorskip("profiles.planner", reason="profiles.planner is not there yet")
    from profiles.accounting import measure_model

    from edge_sdk.models.zoo import build_model

    fleet = load_fleet(name)
    cost = measure_model(build_model(fleet.model))
    batch = fleet.training.batch_size
    first = {}
    for d in fleet.devices(runtime):
        first.setdefault(d.group, d)
    for g in fleet.groups:
        budget = first[g.name].budget_bytes
        figures = runtime.with_overrides(g.runtime_overrides)
        if g.budget_over_runtime is not None:
            assert budget == figures.training + g.budget_over_runtime
        # The server plans with the dataset size the device's hello declares: a group's samples.
        samples = g.samples or 0
        plan = planner.plan_split(cost, budget, batch, runtime=figures, local_samples=samples)
        if g.force_split is None:
            role, split = plan.role, plan.split
        else:
            # A forced split must fit the budget too (a larger split is not always smaller: the
            # frozen chunks it streams cost ONNX Runtime sessions and their weights).
            split = g.force_split
            assert 0 <= split < len(cost), f"{name}: {g.name}.force_split past the last block"
            footprint = cost.footprint(split, batch, runtime_bytes=figures.training, local_samples=samples)
            assert footprint.total <= budget, f"{name}: {g.name} split {split} needs {footprint.total} > {budget}"
            role = planner.RoleThresholds().role(split, cost.capacity(split, batch))
        if g.expect_role is not None:
            assert role == g.expect_role, f"{name}: group {g.name} ({g.device_class}) planned {plan}"


BASE = {
    "fleet": {"model": "tiny", "seed": 3},
    "groups": [{"name": "a", "class": "{strong}", "count": 3}, {"name": "b", "class": "{weak}", "count": 12}],
}


@pytest.fixture(scope="module")
def classes():
    """Two real device class names, taken from a shipped fleet so these tests follow the catalogue."""
    f = load_fleet("embracingfl-16s-112w")
    strong = next(g.device_class for g in f.groups if g.expect_role == "strong")
    weak = next(g.device_class for g in f.groups if g.expect_role == "weak")
    return strong, weak


def base(classes) -> dict:
    strong, weak = classes
    return {
        "fleet": dict(BASE["fleet"]),
        "groups": [
            {**BASE["groups"][0], "class": strong},
            {**BASE["groups"][1], "class": weak},
        ],
    }


def test_ids_and_seeds_are_stable_and_independent_of_other_groups(classes):
    fleet = parse_fleet(base(classes))
    devices = fleet.devices()
    assert [d.id for d in devices[:4]] == ["a-000", "a-001", "a-002", "b-000"]
    assert devices[-1].id == "b-011"
    assert devices[0].seed == device_seed(3, "a-000")
    # The seed is a fixed function of (fleet seed, id): pinned so that a change is noticed.
    assert device_seed(0, "weak-pi-zero-007") == device_seed(0, "weak-pi-zero-007") == 1197453736
    data = base(classes)
    data["groups"].insert(0, {"name": "new", "class": classes[0], "count": 5})
    grown = {d.id: d.seed for d in parse_fleet(data).devices()}
    assert all(grown[d.id] == d.seed for d in devices)
    data = base(classes)
    data["fleet"]["seed"] = 4
    assert all(x.seed != y.seed for x, y in zip(parse_fleet(data).devices(), devices))
    many = base(classes)
    many["groups"][1]["count"] = 1200
    assert parse_fleet(many).devices()[-1].id == "b-1199"


def test_overrides_behaviour_and_cpu_share(classes):
    data = base(classes)
    data["emulation"] = {"cpu_scale": 0.5}
    data["behaviour"] = {"dropout": 0.1, "latency_ms": 20, "rejoin_after_s": 30}
    data["groups"][1].update(
        budget="300MiB", force_split=1, priority=True, tags=["internal"], dropout=0.5, jitter_ms=5
    )
    fleet = parse_fleet(data)
    a, b = fleet.devices()[0], fleet.devices()[-1]
    assert a.behaviour.dropout == 0.1 and a.behaviour.latency_ms == 20 and a.behaviour.rejoin_after_s == 30
    assert b.behaviour.dropout == 0.5 and b.behaviour.latency_ms == 20 and b.behaviour.jitter_ms == 5
    assert b.budget_bytes == 300 << 20 and fleet.groups[1].budget_override
    assert not fleet.groups[0].budget_override
    assert (b.force_split, b.priority, b.tags) == (1, True, ("internal",))
    assert (a.force_split, a.priority, a.tags) == (None, False, ())
    assert a.cpu_share == min(a.speed * 0.5, a.cores)
    data["emulation"] = {"throttle_cpu": False}
    assert all(d.cpu_share is None for d in parse_fleet(data).devices())


def test_a_budget_relative_to_the_runtime(classes, runtime):
    data = base(classes)
    data["groups"][1]["budget"] = "runtime + 30MiB"
    fleet = parse_fleet(data)
    g = fleet.groups[1]
    assert g.budget_bytes is None and g.budget_over_runtime == 30 * MiB and g.budget_override
    assert fleet.devices(runtime=400 * MiB)[-1].budget_bytes == 430 * MiB
    assert fleet.devices(runtime)[-1].budget_bytes == runtime.training + 30 * MiB
    # Without figures, the runtime is measured on this machine (cached), as the emulator does.
    assert fleet.devices()[-1].budget_bytes == runtime.training + 30 * MiB
    assert fleet.devices()[0].budget_bytes == fleet.groups[0].budget_bytes  # absolute budgets untouched


GOOD = """\
[fleet]
model = "tiny"

[training]
rounds = 3

[partition]
scheme = "dirichlet"
alpha = 0.5

[[groups]]
name = "a"
class = "{cls}"
count = 2
"""


@pytest.mark.parametrize(
    "edit, key, message",
    [
        (("rounds = 3", "round = 3"), "training.round", "unknown key"),
        (("rounds = 3", "rounds = 0"), "training.rounds", ">= 1"),
        (("rounds = 3", "rounds = 2.5"), "training.rounds", "integer"),
        (("[training]", "[training]\nfraction = 1.5"), "training.fraction", "(0, 1]"),
        (("count = 2", "count = 0"), "groups[0].count", ">= 1"),
        (("count = 2", ""), "groups[0].count", "required"),
        (('class = "{cls}"', 'class = "pi-zer0"'), "groups[0].class", "pi-zer0"),
        (("count = 2", "count = 2\ndropout = 1.5"), "groups[0].dropout", "probability"),
        (("count = 2", "count = 2\nlatency_ms = -1"), "groups[0].latency_ms", ">= 0"),
        (("count = 2", 'count = 2\nbudget = "lots"'), "groups[0].budget", "not a memory size"),
        (("count = 2", 'count = 2\nbudget = "runtime+lots"'), "groups[0].budget", "not a memory size"),
        (("count = 2", "count = 2\nbudget = 0"), "groups[0].budget", "positive"),
        (("count = 2", "count = 2\nforce_split = -1"), "groups[0].force_split", ">= 0"),
        (("count = 2", 'count = 2\nexpect_role = "mighty"'), "groups[0].expect_role", "strong, moderate, weak"),
        (("count = 2", 'count = 2\ntags = "internal"'), "groups[0].tags", "list"),
        (('name = "a"', 'name = "Weak Pis"'), "groups[0].name", "lowercase"),
        (('scheme = "dirichlet"\nalpha = 0.5', 'scheme = "natural"'), "partition.scheme", "no natural clients"),
        (('scheme = "dirichlet"\nalpha = 0.5', 'scheme = "iid"\nalpha = 0.5'), "partition.alpha", "only the dirichlet"),
        (("alpha = 0.5", "alpha = 0"), "partition.alpha", "positive"),
        (('scheme = "dirichlet"', 'scheme = "pathological"'), "partition.scheme", "iid, dirichlet, natural"),
        (('model = "tiny"', 'model = "resnet50"'), "fleet.model", "resnet20"),
        (('model = "tiny"', 'model = "tiny"\ndataset = "cifar10"'), "fleet.dataset", "trains on 'synthetic'"),
        (('model = "tiny"', ""), "fleet.model", "required"),
        (("[fleet]", "[flet]"), "flet", "unknown key"),
        (("[training]", '[emulation]\nmemory_cap = "ulimit"\n[training]'), "emulation.memory_cap", "rlimit"),
        (("[training]", "[emulation]\ntimeout_s = 0\n[training]"), "emulation.timeout_s", "thrash"),
        (("[[groups]]", "[[groupz]]"), "groupz", "unknown key"),
        (("count = 2", 'count = 2\n[[groups]]\nname = "a"\nclass = "{cls}"\ncount = 1'), "groups[1].name", "distinct"),
        (("[training]", "[training"), "", "not valid TOML"),
        (("rounds = 3", "rounds = 3\nlr_decay_at = 800"), "training.lr_decay_at", "list of integers"),
        (("rounds = 3", "rounds = 3\nlr_decay_at = [0]"), "training.lr_decay_at", ">= 1"),
        (("rounds = 3", 'rounds = 3\nlr_decay_at = ["800"]'), "training.lr_decay_at", "list of integers"),
        (("rounds = 3", "rounds = 3\nlr_decay = 2.0"), "training.lr_decay", "(0, 1]"),
    ],
)
def test_bad_files_get_errors_naming_the_file_and_key(tmp_path: Path, classes, edit, key, message):
    old, new = edit
    text = GOOD.replace(old, new).replace("{cls}", classes[1])
    assert text != GOOD.replace("{cls}", classes[1])
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(FleetError) as info:
        load_fleet(path)
    err = info.value
    assert str(path) in str(err)
    assert err.key == key
    assert message in str(err)


def test_the_good_file_loads(tmp_path: Path, classes):
    path = tmp_path / "good.toml"
    path.write_text(GOOD.replace("{cls}", classes[1]))
    fleet = load_fleet(path)
    assert (fleet.name, fleet.dataset) == ("good", "synthetic")
    assert (fleet.training.rounds, fleet.partition.alpha) == (3, 0.5)
    assert [d.id for d in fleet.devices()] == ["a-000", "a-001"]
    assert fleet.training.lr_decay_at == ()  # no schedule unless the file gives one


def test_a_fleet_sets_the_learning_rate_schedule(tmp_path: Path, classes):
    path = tmp_path / "decay.toml"
    path.write_text(GOOD.replace("{cls}", classes[1]).replace("rounds = 3", "rounds = 3\nlr = 0.4\n"
                                                               "lr_decay_at = [900, 800]\nlr_decay = 0.1"))
    fleet = load_fleet(path)
    assert fleet.training.lr_decay_at == (800, 900)
    config = server_config(fleet, store_dir=tmp_path)
    assert (config.lr_decay_at, config.lr_decay) == ((800, 900), 0.1)
    assert config.lr_at(800) == 0.4 and config.lr_at(901) == pytest.approx(0.004)


def test_missing_fleet_and_groups(tmp_path: Path):
    with pytest.raises(FleetError, match="shipped fleets: .*tiny-capped"):
        load_fleet("no-such-fleet")
    path = tmp_path / "empty.toml"
    path.write_text('[fleet]\nmodel = "tiny"\n')
    with pytest.raises(FleetError, match=r"empty\.toml: groups: a fleet needs at least one"):
        load_fleet(path)


def test_the_femnist_fleet_gives_every_device_whole_writers():
    data = pytest.importorskip("edge_sdk.data", reason="edge_sdk.data is not there yet")
    fleet = load_fleet("femnist-75weak")
    try:
        ds = data.load_dataset("femnist")
    except data.DatasetUnavailable as e:
        pytest.skip(f"FEMNIST is not staged here: {e}")
    shards = data.partition(ds.groups, fleet.num_devices, "natural", seed=fleet.partition.seed)
    assert len(shards) == fleet.num_devices
    writers = [set(ds.groups[s].tolist()) for s in shards]
    assert all(len(w) >= 2 for w in writers)  # the paper gives each client two writers
    assert sum(len(w) for w in writers) == len(set(ds.groups.tolist()))  # no writer is split
