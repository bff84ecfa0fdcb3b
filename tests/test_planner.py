"""The planner, device classes, size strings, and ``edgetrain profile``.

Plans here use the documented fallback runtime figures (profiles.runtime.FALLBACK), so that the
expected splits do not move with the machine; tests/test_probe.py measures the real ones.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_sdk.models import build_model
from profiles.accounting import ModelCost, TrainingMemory, measure_model
from profiles.devices import DeviceClass, DeviceClassError, device_classes, device_names, load_device_class
from profiles.planner import Plan, PlanError, RoleThresholds, group_chunks, plan_for_device, plan_split
from profiles.runtime import FALLBACK
from profiles.units import format_size, parse_size

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
RUNTIME = FALLBACK.training  # 267 MiB: torch + ONNX Runtime (docs/measurements.md) + the device's warm-up


@pytest.fixture(scope="module")
def costs() -> dict[str, ModelCost]:
    return {name: measure_model(build_model(name)) for name in ("resnet20", "leaf_cnn", "recommender")}


# -- every device class, batch 32 and 128 -------------------------------------------------------
# The split each class gets (None: refused) with the fallback runtime figures.
EXPECTED: dict[tuple[str, int], dict[str, int | None]] = {
    ("resnet20", 32): {
        "go-phone": None, "pi-zero-2w": 6, "entry-phone": 0, "pi-3b": 0, "mid-phone": 0,
        "pi-4-2gb": 0, "jetson-nano-4gb": 0, "flagship-phone": 0,
    },
    ("resnet20", 128): {
        "go-phone": None, "pi-zero-2w": None, "entry-phone": 5, "pi-3b": 0, "mid-phone": 0,
        "pi-4-2gb": 0, "jetson-nano-4gb": 0, "flagship-phone": 0,
    },
    ("leaf_cnn", 32): {
        "go-phone": None, "pi-zero-2w": None, "entry-phone": 0, "pi-3b": 0, "mid-phone": 0,
        "pi-4-2gb": 0, "jetson-nano-4gb": 0, "flagship-phone": 0,
    },
    ("leaf_cnn", 128): {
        "go-phone": None, "pi-zero-2w": None, "entry-phone": 2, "pi-3b": 0, "mid-phone": 0,
        "pi-4-2gb": 0, "jetson-nano-4gb": 0, "flagship-phone": 0,
    },
}
CASES = [(m, b, d) for (m, b), table in EXPECTED.items() for d in table]


def assert_plan_is_sound(cost: ModelCost, plan: Plan, runtime: int, memory: TrainingMemory = TrainingMemory()) -> None:
    """The plan fits, no larger suffix fits, and every chunk fits beside what else is held."""
    k, budget, batch = plan.split, plan.budget_bytes, plan.batch_size
    assert plan.footprint_bytes <= budget
    assert plan.footprint_bytes == cost.footprint(k, batch, memory=memory, runtime_bytes=runtime, chunks=plan.chunks).total
    for smaller in range(k):  # every larger trainable suffix is over budget, however it is chunked
        assert cost.footprint(smaller, batch, memory=memory, runtime_bytes=runtime).total > budget
    covered = [i for start, stop in plan.chunks for i in range(start, stop)]
    assert covered == list(range(k))
    least = cost.footprint(k, batch, memory=memory, runtime_bytes=runtime)
    for i, (start, stop) in enumerate(plan.chunks):
        held = dataclasses.replace(least, frozen_chunk=cost.chunk_bytes(start, stop, batch, memory))
        assert held.total <= budget
        if i + 1 < len(plan.chunks):  # greedy: one more block would not have fit
            grown = dataclasses.replace(least, frozen_chunk=cost.chunk_bytes(start, stop + 1, batch, memory))
            assert grown.total > budget
    assert plan.capacity == cost.capacity(k, batch)
    assert plan.trainable_params == cost.trainable_params(k)


@pytest.mark.parametrize(("model", "batch", "device"), CASES)
def test_plan_for_every_device_class(costs, model, batch, device):
    cost, expected = costs[model], EXPECTED[(model, batch)][device]
    cls = load_device_class(device)
    runtime = FALLBACK.with_overrides(cls.runtime_overrides).training
    if expected is None:
        with pytest.raises(PlanError) as refused:
            plan_for_device(cost, cls, batch, runtime=FALLBACK)
        assert refused.value.needed_bytes > cls.budget_bytes == refused.value.budget_bytes
        assert cost.footprint(len(cost) - 1, batch, runtime_bytes=runtime).total > cls.budget_bytes
        return
    plan = plan_for_device(cost, cls, batch, runtime=FALLBACK)
    assert plan.split == expected
    assert plan.budget_bytes == cls.budget_bytes
    assert plan.footprint.runtime == runtime
    assert_plan_is_sound(cost, plan, runtime)


def test_the_catalogue_gives_each_role(costs):
    roles = {
        plan_for_device(costs[m], d, b, runtime=FALLBACK).role
        for (m, b), table in EXPECTED.items()
        for d, k in table.items()
        if k is not None
    }
    assert roles == {"strong", "moderate", "weak"}


def test_device_runtime_overrides_reach_the_plan(costs):
    jetson = load_device_class("jetson-nano-4gb")
    plan = plan_for_device(costs["resnet20"], jetson, 32, runtime=FALLBACK)
    assert plan.footprint.runtime == jetson.runtime_overrides["torch_onnxruntime"]
    assert plan.footprint_bytes > jetson.runtime_overrides["torch_onnxruntime"]


@settings(max_examples=40, deadline=None)
@given(budget_mib=st.integers(min_value=360, max_value=900), batch=st.sampled_from([1, 8, 32, 128]))
def test_any_budget_gets_a_sound_plan_or_a_clear_refusal(costs, budget_mib, batch):
    cost = costs["resnet20"]
    try:
        plan = plan_split(cost, budget_mib * MiB, batch, runtime=RUNTIME)
    except PlanError as e:
        assert e.needed_bytes > budget_mib * MiB
        assert all(cost.footprint(k, batch, runtime_bytes=RUNTIME).total > budget_mib * MiB for k in range(len(cost)))
        return
    assert_plan_is_sound(cost, plan, RUNTIME)


def test_each_boundary_budget_gives_its_split(costs):
    """At exactly the least footprint of split k, the planner picks the first split that fits."""
    cost = costs["resnet20"]
    least = [cost.footprint(k, 32, runtime_bytes=RUNTIME).total for k in range(len(cost))]
    seen = set()
    for k, budget in enumerate(least):
        plan = plan_split(cost, budget, 32, runtime=RUNTIME)
        assert plan.split == min(j for j in range(len(cost)) if least[j] <= budget)
        assert_plan_is_sound(cost, plan, RUNTIME)
        seen.add(plan.split)
    assert {0, 4, 7} <= seen  # the paper's strong, moderate and weak splits are all reachable


# -- refusals -------------------------------------------------------------------------------------
def test_a_tiny_budget_is_refused_with_what_it_needs(costs):
    cost = costs["resnet20"]
    with pytest.raises(PlanError) as refused:
        plan_split(cost, 100 * MiB, 32, runtime=RUNTIME)
    error = refused.value
    assert isinstance(error, ValueError)
    least = min(cost.footprint(k, 32, runtime_bytes=RUNTIME).total for k in range(len(cost)))
    assert error.needed_bytes == least
    assert error.budget_bytes == 100 * MiB
    message = str(error)
    assert "resnet20" in message and "100.0 MiB" in message and format_size(least) in message


def test_a_frozen_block_too_large_to_stream_is_refused(costs):
    """LEAF CNN, budget for its last block only: dense2 alone would train in 1 MiB, but the frozen
    dense1 (6.4 M parameters) cannot be held even as a chunk of its own."""
    cost = costs["leaf_cnn"]
    last = cost.footprint(3, 32, runtime_bytes=RUNTIME)
    budget = RUNTIME + 50 * MiB
    assert last.training < 50 * MiB < last.frozen_chunk
    with pytest.raises(PlanError, match="leaf_cnn does not fit"):
        plan_split(cost, budget, 32, runtime=RUNTIME)
    with pytest.raises(ValueError, match="dense1"):
        group_chunks(cost, 3, 32, lambda chunk: chunk <= 50 * MiB, TrainingMemory())


def test_bad_arguments(costs):
    with pytest.raises(ValueError, match="budget"):
        plan_split(costs["resnet20"], 0, 32, runtime=RUNTIME)
    with pytest.raises(ValueError, match="batch"):
        plan_split(costs["resnet20"], 1 << 30, 0, runtime=RUNTIME)
    with pytest.raises(ValueError, match="runtime"):
        plan_split(costs["resnet20"], 1 << 30, 32, runtime=-1)


# -- roles ----------------------------------------------------------------------------------------
def test_roles_reproduce_every_label_of_table1():
    roles = RoleThresholds()
    assert roles.role(0, 1.0) == "strong"
    # (capacity, label) of Table 1's partial clients: ResNet20, FEMNIST CNN, IMDB BiLSTM.
    for capacity, label in [(0.42, "moderate"), (0.16, "weak"), (0.99, "moderate"), (0.02, "weak"),
                            (0.48, "moderate"), (0.35, "weak")]:
        assert roles.role(1, capacity) == label, capacity


def test_role_thresholds_are_configurable(costs):
    cost = costs["resnet20"]
    budget = cost.footprint(4, 32, runtime_bytes=RUNTIME).total
    assert plan_split(cost, budget, 32, runtime=RUNTIME).role == "moderate"  # capacity 0.45
    stricter = RoleThresholds(moderate=0.5, weak=0.2)
    assert plan_split(cost, budget, 32, runtime=RUNTIME, thresholds=stricter).role == "weak"
    whole = cost.footprint(0, 32, runtime_bytes=RUNTIME).total
    assert plan_split(cost, whole, 32, runtime=RUNTIME, thresholds=stricter).role == "strong"
    for bad in ({"moderate": 0.1, "weak": 0.2}, {"moderate": 1.5}, {"weak": 0.0}):
        with pytest.raises(ValueError, match="thresholds"):
            RoleThresholds(**bad)


# -- the plan as data -----------------------------------------------------------------------------
def test_plan_is_plain_data_and_measures_a_model_itself(costs):
    model = build_model("resnet20")
    budget = costs["resnet20"].footprint(7, 32, runtime_bytes=RUNTIME).total
    plan = plan_split(model, budget, 32, runtime=RUNTIME)
    assert plan == plan_split(costs["resnet20"], budget, 32, runtime=RUNTIME)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["split"] == plan.split and data["role"] == plan.role
    assert data["chunks"] == [list(c) for c in plan.chunks]
    assert data["footprint"]["total"] == plan.footprint_bytes
    assert "split" in plan.describe() and plan.role in plan.describe()


def test_sparse_blocks_count_in_full(costs):
    cost = costs["recommender"]
    assert cost.sparse_blocks == ("embeddings",)
    assert cost.blocks[0].sparse
    assert cost.blocks[0].trainable_params == (611 + 9_742) * 32  # every row of both tables
    plan = plan_split(cost, RUNTIME + 64 * MiB, 32, runtime=RUNTIME)
    assert plan.split == 0 and plan.role == "strong"


def test_memory_settings_change_the_plan(costs):
    cost = costs["leaf_cnn"]
    budget = cost.footprint(0, 32, runtime_bytes=RUNTIME).total  # SGD with momentum fits exactly
    assert plan_split(cost, budget, 32, runtime=RUNTIME).split == 0
    adam = TrainingMemory(optimizer_copies=2)  # one more copy of 6.6 M parameters does not
    plan = plan_split(cost, budget, 32, runtime=RUNTIME, memory=adam)
    assert plan.split > 0
    assert_plan_is_sound(cost, plan, RUNTIME, adam)


# -- device classes -------------------------------------------------------------------------------
def test_device_classes_cover_small_boards_to_flagship_phones():
    classes = device_classes()
    names = [d.name for d in classes]
    assert len(classes) >= 6
    assert {"pi-zero-2w", "pi-3b", "pi-4-2gb", "jetson-nano-4gb", "entry-phone", "mid-phone", "flagship-phone"} <= set(names)
    assert [d.budget_bytes for d in classes] == sorted(d.budget_bytes for d in classes)
    assert sorted(names) == device_names()
    for d in classes:
        assert isinstance(d, DeviceClass)
        assert d.budget_bytes == int(d.ram_bytes * d.app_share) > 0
        assert d.cores >= 1 and d.speed > 0 and d.notes and d.description
    zero = load_device_class("pi-zero-2w")
    assert zero.ram_bytes == 512 * MiB and zero.cores == 4
    assert load_device_class("flagship-phone").ram_bytes == 12 * 1024 * MiB
    jetson = load_device_class("jetson-nano-4gb")
    assert jetson.gpu and jetson.ram_bytes == 4 * 1024 * MiB and "torch_onnxruntime" in jetson.runtime_overrides


def test_a_typo_lists_the_known_classes():
    with pytest.raises(DeviceClassError) as error:
        load_device_class("pi-zero")
    message = str(error.value)
    assert "unknown device class 'pi-zero'" in message and "did you mean 'pi-zero-2w'" in message
    for name in device_names():
        assert name in message
    assert isinstance(error.value, ValueError)


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


GOOD = 'ram = "1GiB"\napp_share = 0.5\ncores = 2\nspeed = 1.0\n'


def test_a_class_file_outside_the_package(tmp_path):
    path = _write(tmp_path, "lab-box", GOOD + '[runtime]\ntorch_training = "300MiB"\n')
    box = load_device_class(str(path))
    assert box.name == "lab-box" and box.budget_bytes == 512 * MiB
    assert box.runtime_overrides == {"torch_training": 300 * MiB}
    assert [d.name for d in device_classes(tmp_path)] == ["lab-box"]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (GOOD + "colour = 'red'\n", "colour"),
        (GOOD.replace("app_share = 0.5", "app_share = 1.5"), "app_share"),
        (GOOD.replace('ram = "1GiB"', 'ram = "lots"'), "ram"),
        (GOOD.replace("cores = 2", "cores = 0"), "cores"),
        (GOOD.replace("speed = 1.0", "speed = -1"), "speed"),
        (GOOD + 'name = "other"\n', "name"),
        (GOOD.replace("cores = 2\n", ""), "cores"),
        (GOOD + "[runtime]\ncuda = 1\n", "runtime.cuda"),
        (GOOD + "gpu = 'yes'\n", "gpu"),
        ("ram = \n", "not valid TOML"),
    ],
)
def test_malformed_class_files_name_the_file_and_key(tmp_path, text, key):
    path = _write(tmp_path, "bad", text)
    with pytest.raises(DeviceClassError) as error:
        load_device_class("bad", directory=tmp_path)
    assert str(path) in str(error.value) and key in str(error.value)


# -- sizes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512MiB", 512 * MiB), ("1.5GiB", 1536 * MiB), ("300MB", 300_000_000), ("4096", 4096),
        ("2 GiB", 2 << 30), ("64k", 65_536), ("1kB", 1000), ("12gib", 12 << 30), (".5M", MiB // 2), (77, 77),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "12 parsecs", "-5MiB", "1.2.3GB", "ten", -1, True, None])
def test_parse_size_rejects_what_is_not_a_size(text):
    with pytest.raises(ValueError, match="memory size|unit|negative"):
        parse_size(text)


def test_format_size():
    assert format_size(0) == "0 B"
    assert format_size(512 * MiB) == "512.0 MiB"
    assert format_size(1536 * MiB) == "1.5 GiB"
    assert format_size(parse_size("237.0MiB")) == "237.0 MiB"


# -- edgetrain profile ----------------------------------------------------------------------------
def edgetrain(*args: str, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run the real command line, with the fallback runtime figures in its cache."""
    from profiles.runtime import RUNTIME_FIELDS, runtime_key

    cache = cache_dir / "runtime.json"
    cache.write_text(json.dumps({runtime_key(): {f: getattr(FALLBACK, f) for f in RUNTIME_FIELDS}}))
    env = {**os.environ, "EDGETRAIN_CACHE_DIR": str(cache_dir), "COLUMNS": "160"}
    return subprocess.run(
        [sys.executable, "-m", "edgetrain", "profile", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )


@pytest.mark.slow
def test_cli_default_profiles_resnet20_for_every_device_class(tmp_path):
    out = edgetrain("--model", "resnet20", cache_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for block in ("stem", "stage2_block1", "head"):
        assert block in text
    assert "272,474" in text and "257,994" in text and "206,346" in text  # suffix params, Table 1
    assert "0.450" in text and "0.168" in text  # capacities of splits 4 and 7
    for name in device_names():
        assert name in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip() and line.split()[0] in device_names()}
    # A 512 MiB board trains a weak share of ResNet20 (its last stages); a flagship phone trains it all.
    assert "weak" in rows["pi-zero-2w"] and "strong" in rows["flagship-phone"]


def test_cli_plans_a_secure_run_with_the_secure_rounds_memory(tmp_path):
    """A budget that buys the strong role plain does not in a secure run (profiles.accounting
    TrainingMemory.secured: the secure round's libraries and masked words)."""
    cost = measure_model(build_model("digits_mlp"))
    plain = plan_split(cost, 2 * GiB, 32, runtime=FALLBACK)
    budget = f"{plain.footprint_bytes // KiB + 1}KiB"  # the strong plan's own footprint, and no more
    out = {flag: edgetrain("--model", "digits_mlp", "--budget", budget, *flag, cache_dir=tmp_path)
           for flag in ((), ("--secure-aggregation",))}
    assert all(o.returncode == 0 for o in out.values()), [o.stderr for o in out.values()]
    roles = {flag: next(line for line in o.stdout.splitlines() if "│ role" in line).split()[3] for flag, o in out.items()}
    assert roles == {(): "strong", ("--secure-aggregation",): "moderate"}, roles
    assert "masked words" in out[("--secure-aggregation",)].stdout and "masked words" not in out[()].stdout


@pytest.mark.slow  # a whole-command run; the quick tier keeps a sibling
def test_cli_plans_for_the_backend_it_is_given(tmp_path):
    """At 300 MiB digits_mlp fits no torch device, and fits one training from ONNX Runtime graphs: the
    refusal says where it fits, and --backend plans as the server plans a hello naming that runtime
    (a Python backend's, or a JavaScript device's: a browser tab's at 420 MiB)."""
    cost = measure_model(build_model("digits_mlp"))
    refused = edgetrain("--model", "digits_mlp", "--budget", "300MiB", "--backend", "torch", cache_dir=tmp_path)
    assert refused.returncode == 1 and "refused" in refused.stdout, refused.stdout + refused.stderr
    assert "fits on onnxruntime: strong, split 0 (--backend onnxruntime)" in refused.stdout.replace("\n", " ")
    for name, budget in (("onnxruntime", 300 * MiB), ("onnxruntime-web", 420 * MiB)):
        out = edgetrain("--model", "digits_mlp", "--budget", f"{budget // MiB}MiB", "--backend", name, cache_dir=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        plan = plan_split(cost, budget, 32, runtime=FALLBACK, backends=(name,), graph_splits=range(len(cost)))
        assert f"Plan for budget {format_size(budget)} on {name}" in out.stdout
        assert f"{plan.split} / 4" in out.stdout and format_size(plan.footprint_bytes) in out.stdout, out.stdout
    unknown = edgetrain("--model", "digits_mlp", "--budget", "300MiB", "--backend", "tensorflow", cache_dir=tmp_path)
    assert unknown.returncode == 2 and "onnxruntime-node" in unknown.stderr, unknown.stderr


@pytest.mark.slow
def test_cli_plans_for_one_device(tmp_path):
    out = edgetrain("--model", "resnet20", "--device", "entry-phone", "--batch", "128", cache_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Plan for entry-phone" in text
    plan = plan_for_device(measure_model(build_model("resnet20")), "entry-phone", 128, runtime=FALLBACK)
    assert f"{plan.split} / 11" in text and plan.role in text
    assert format_size(plan.footprint_bytes) in text


def test_cli_counts_the_local_dataset(tmp_path):
    """--samples moves the plan the way the server's planning of a hello with that many samples does."""
    out = edgetrain("--model", "resnet20", "--device", "pi-zero-2w", "--samples", "256", cache_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    plan = plan_split(measure_model(build_model("resnet20")), load_device_class("pi-zero-2w").budget_bytes, 32,
                      runtime=FALLBACK, local_samples=256)
    assert plan.footprint.local_data == 256 * 3 * 32 * 32 * 4
    assert f"{plan.split} / 11" in out.stdout and format_size(plan.footprint_bytes) in out.stdout
    assert "256 samples" in out.stdout and "local data" in out.stdout


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--list-devices"], 0, "jetson-nano-4gb"),
        (["--device", "pi-zer"], 2, "did you mean 'pi-zero-2w'"),
        (["--device", "pi-3b", "--budget", "1GiB"], 2, "not both"),
        (["--budget", "lots"], 2, "not a memory size"),
        (["--budget", "100MiB"], 1, "refused"),
        (["--model", "nope"], 2, "unknown model 'nope'"),
    ],
)
def test_cli_answers_and_errors(tmp_path, args, code, says):
    out = edgetrain(*args, cache_dir=tmp_path)
    assert out.returncode == code, out.stdout + out.stderr
    assert says in out.stdout + out.stderr


def test_a_tab_is_charged_the_parameter_copies_it_holds_while_training() -> None:
    # A Chromium tab (onnxruntime-web) holds its trainable parameters Runtime.training_copies more
    # times than any graph device (its WebAssembly heap's copies and uncollected gradient arrays):
    # its training phase costs that much more than a Node device's, and a 400 MiB digits_mlp tab
    # gets the weak plan, the moderate one only at the budget that covers those copies.
    from profiles.planner import tail_footprint
    from profiles.runtime import RUNTIMES, WEB_TRAINING_COPIES, Runtime

    assert RUNTIMES["onnxruntime-web"].training_copies == WEB_TRAINING_COPIES > 0
    assert RUNTIMES["onnxruntime-node"].training_copies == 0
    with pytest.raises(ValueError, match="training_copies"):
        Runtime("x", memory=1, backend="graph", training_copies=-1)
    cost = measure_model(build_model("digits_mlp"))
    tab, node = (tail_footprint(cost, 2, 32, backend=b, runtime=0) for b in ("onnxruntime-web", "onnxruntime-node"))
    assert tab.training - node.training == WEB_TRAINING_COPIES * cost.trainable_params(2) * 4
    assert tab.streaming == node.streaming
    weak = plan_split(cost, 400 << 20, 32, backends=("onnxruntime-web",), graph_splits=range(4), local_samples=450)
    assert (weak.split, weak.role) == (3, "weak")
    moderate = plan_split(cost, 580 << 20, 32, backends=("onnxruntime-web",), graph_splits=range(4), local_samples=450)
    assert (moderate.split, moderate.role) == (2, "moderate") and moderate.footprint_bytes > 500 << 20


def test_a_tab_is_charged_what_v8_holds_compiling_a_transformers_kernels() -> None:
    # A tab's renderer grows by 100-120 MiB while V8's optimising tier compiles the kernels of a model with
    # attention layers (profiles.runtime.WEB_ATTENTION_COMPILE_BYTES, measured): charged to onnxruntime-web
    # for a transformer, at every split and either way it trains, and to no other runtime nor model.
    from profiles.planner import tail_footprint
    from profiles.runtime import RUNTIMES, WEB_ATTENTION_COMPILE_BYTES, Runtime

    assert RUNTIMES["onnxruntime-web"].attention_compile_bytes == WEB_ATTENTION_COMPILE_BYTES > 0
    assert all(RUNTIMES[n].attention_compile_bytes == 0 for n in ("torch", "onnxruntime", "onnxruntime-node"))
    with pytest.raises(ValueError, match="attention_compile_bytes"):
        Runtime("x", memory=1, backend="graph", attention_compile_bytes=-1)
    lm = measure_model(build_model("char_transformer_tiny@rank=4"))
    for split in range(len(lm)):
        for adapters in (False, True):
            tab, node = (tail_footprint(lm, split, 32, backend=b, runtime=0, adapters=adapters)
                         for b in ("onnxruntime-web", "onnxruntime-node"))
            assert tab.runtime == WEB_ATTENTION_COMPILE_BYTES and node.runtime == 0
    mlp = measure_model(build_model("digits_mlp"))
    assert tail_footprint(mlp, 2, 32, backend="onnxruntime-web", runtime=0).runtime == 0
    plan = plan_split(lm, 440 << 20, 32, backends=("onnxruntime-web",), graph_splits=range(len(lm)), local_samples=495)
    assert plan.adapters and plan.footprint.runtime == RUNTIMES["onnxruntime-web"].memory + WEB_ATTENTION_COMPILE_BYTES
    with pytest.raises(PlanError):  # what a tab was planned at before the compilation was charged
        plan_split(lm, 320 << 20, 32, backends=("onnxruntime-web",), graph_splits=range(len(lm)), local_samples=495)


def test_a_tab_on_its_gpu_is_planned_with_what_its_renderer_holds_while_it_trains() -> None:
    # The WebGPU build's tab: its renderer holds more than the WebAssembly build's while it trains on the GPU
    # (profiles.runtime.WEBGPU_RUNTIME_BYTES, measured) and the same gradient copies, so a digits_mlp tab on
    # the GPU is refused at 500 MiB (where one on WebAssembly is moderate), weak from 526 MiB and moderate
    # from 706 MiB; its plan covers the WebAssembly fallback's at every split.
    from profiles.planner import tail_footprint
    from profiles.runtime import JS_RUNTIME_MEMORY, RUNTIMES, WEB_TRAINING_COPIES, WEBGPU_RUNTIME_BYTES

    gpu = RUNTIMES["onnxruntime-webgpu"]
    assert gpu.training_copies == WEB_TRAINING_COPIES and gpu.memory == WEBGPU_RUNTIME_BYTES
    assert WEBGPU_RUNTIME_BYTES > JS_RUNTIME_MEMORY["onnxruntime-web"]
    cost = measure_model(build_model("digits_mlp"))
    for split in range(4):
        on = {b: tail_footprint(cost, split, 32, backend=b, local_samples=337).total
              for b in ("onnxruntime-webgpu", "onnxruntime-web")}
        assert on["onnxruntime-webgpu"] > on["onnxruntime-web"]
    plan = lambda mib: plan_split(cost, mib << 20, 32, backends=("onnxruntime-webgpu",),  # noqa: E731
                                  graph_splits=range(4), local_samples=337)
    with pytest.raises(PlanError):
        plan(500)
    assert (plan(530).split, plan(530).role) == (3, "weak")
    assert (plan(710).split, plan(710).role) == (2, "moderate")
