"""The machine probe (memory, cgroup limits, cores) and the runtime memory measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from profiles.probe import MachineProfile, cgroup_memory_limit, probe, usable_cores
from profiles.runtime import (
    FALLBACK,
    RUNTIME_FIELDS,
    RuntimeMemory,
    default_cache_file,
    measure_runtime,
    runtime_key,
    runtime_memory,
)

MiB = 1024 * 1024
V1_UNLIMITED = "9223372036854771712"  # 2^63 rounded down to a page


# -- probe ----------------------------------------------------------------------------------------
def test_probe_is_consistent():
    profile = probe()
    assert isinstance(profile, MachineProfile)
    assert 0 < profile.available_bytes <= profile.total_bytes
    assert 0 < profile.budget_bytes <= profile.available_bytes
    if profile.cgroup_limit_bytes is not None:
        assert profile.budget_bytes <= profile.cgroup_limit_bytes
    assert profile.total_bytes == psutil.virtual_memory().total
    assert 1 <= profile.cores <= (os.cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        assert profile.cores == len(os.sched_getaffinity(0))
    assert json.loads(json.dumps(profile.to_dict()))["cores"] == profile.cores


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_cores_follow_the_cpu_affinity():
    first = min(os.sched_getaffinity(0))
    code = "from profiles.probe import probe; print(probe().cores)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
        preexec_fn=lambda: os.sched_setaffinity(0, {first}),
    )
    assert int(out.stdout) == 1
    assert usable_cores() == len(os.sched_getaffinity(0))


# -- cgroup limits, from files laid out as the kernel lays them out -------------------------------
def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_cgroup_v1_limit_of_the_process_cgroup(tmp_path):
    _tree(tmp_path, {
        "proc": "5:cpu:/\n4:memory:/jobs/device-1\n0::/\n",
        "cg/memory/memory.limit_in_bytes": V1_UNLIMITED,
        "cg/memory/jobs/memory.limit_in_bytes": V1_UNLIMITED,
        "cg/memory/jobs/device-1/memory.limit_in_bytes": str(300 * MiB),
    })
    assert cgroup_memory_limit(proc_cgroup=tmp_path / "proc", cgroup_root=tmp_path / "cg") == 300 * MiB


def test_cgroup_v1_ancestor_limit_applies(tmp_path):
    _tree(tmp_path, {
        "proc": "4:memory:/jobs/device-1\n",
        "cg/memory/jobs/memory.limit_in_bytes": str(200 * MiB),
        "cg/memory/jobs/device-1/memory.limit_in_bytes": V1_UNLIMITED,
    })
    assert cgroup_memory_limit(proc_cgroup=tmp_path / "proc", cgroup_root=tmp_path / "cg") == 200 * MiB


def test_cgroup_v2_limit_and_max_sentinel(tmp_path):
    _tree(tmp_path, {
        "proc": "0::/user.slice/app.scope\n",
        "cg/cgroup.controllers": "cpu memory\n",
        "cg/user.slice/memory.max": "max\n",
        "cg/user.slice/app.scope/memory.max": f"{768 * MiB}\n",
    })
    assert cgroup_memory_limit(proc_cgroup=tmp_path / "proc", cgroup_root=tmp_path / "cg") == 768 * MiB
    (tmp_path / "cg/user.slice/app.scope/memory.max").write_text("max\n")
    assert cgroup_memory_limit(proc_cgroup=tmp_path / "proc", cgroup_root=tmp_path / "cg") is None


def test_no_limit_no_cgroups(tmp_path):
    _tree(tmp_path, {"proc": "4:memory:/\n", "cg/memory/memory.limit_in_bytes": V1_UNLIMITED})
    assert cgroup_memory_limit(proc_cgroup=tmp_path / "proc", cgroup_root=tmp_path / "cg") is None
    assert cgroup_memory_limit(proc_cgroup=tmp_path / "missing", cgroup_root=tmp_path / "cg") is None


def _own_memory_cgroup() -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            return folder if (folder / "memory.limit_in_bytes").exists() else None
    return None


def test_probe_sees_a_real_cgroup_limit():
    """Run the probe in a child process inside a cgroup v1 memory cgroup capped at 256 MiB."""
    parent = _own_memory_cgroup()
    if os.geteuid() != 0 or parent is None or not os.access(parent, os.W_OK):
        pytest.skip("needs root and a writable cgroup v1 memory hierarchy")
    group = parent / f"probe-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(256 * MiB))
        procs = group / "cgroup.procs"
        code = "import json; from profiles.probe import probe; print(json.dumps(probe().to_dict()))"
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
            preexec_fn=lambda: procs.write_text("0"),
        )
    finally:
        group.rmdir()
    seen = json.loads(out.stdout)
    assert seen["cgroup_limit_bytes"] == 256 * MiB
    assert seen["budget_bytes"] <= 256 * MiB < seen["available_bytes"]


# -- runtime memory -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[RuntimeMemory, Path]:
    """Measure once for this module (about 3 s), into a cache file of its own."""
    cache = tmp_path_factory.mktemp("cache") / "runtime.json"
    return runtime_memory(cache_file=cache), cache


def test_runtime_figures_are_measured_and_ordered(measured):
    figures, _ = measured
    assert figures.source == "measured"
    assert 0 < figures.python < figures.onnxruntime < figures.torch_onnxruntime
    assert figures.python < figures.torch < figures.torch_onnxruntime <= figures.torch_training
    assert figures.training == figures.torch_training
    assert figures.inference == figures.onnxruntime
    # Sanity against docs/measurements.md (same machine kind, same versions): within a factor of two.
    for name in ("onnxruntime", "torch", "torch_onnxruntime"):
        assert 0.5 < getattr(figures, name) / getattr(FALLBACK, name) < 2, name


def test_runtime_figures_are_cached_per_versions(measured):
    figures, cache = measured
    entries = json.loads(cache.read_text())
    key = runtime_key()
    assert list(entries) == [key]
    assert "torch" in key and "ort" in key and "py" in key
    again = runtime_memory(cache_file=cache)
    assert again.source == "cache"
    assert {f: getattr(again, f) for f in RUNTIME_FIELDS} == {f: getattr(figures, f) for f in RUNTIME_FIELDS}


def test_a_damaged_cache_is_measured_again(tmp_path):
    cache = tmp_path / "runtime.json"
    cache.write_text(json.dumps({runtime_key("/bin/false"): {"python": "lots"}}))
    cache_text = cache.read_text()
    figures = runtime_memory(cache_file=cache, python="/bin/false")  # no Python there: nothing measures
    assert figures.source == "fallback"
    assert cache.read_text() == cache_text  # fallbacks are not cached


@pytest.mark.parametrize("python", ["/bin/false", "/nonexistent/python3"])
def test_measuring_falls_back_when_a_runtime_will_not_start(python):
    figures = measure_runtime(python=python, timeout=30)
    assert figures.source == "fallback"
    assert {f: getattr(figures, f) for f in RUNTIME_FIELDS} == {f: getattr(FALLBACK, f) for f in RUNTIME_FIELDS}


def test_fallbacks_are_the_documented_figures():
    assert round(FALLBACK.onnxruntime / MiB, 1) == 45.9
    assert round(FALLBACK.torch / MiB, 1) == 218.8
    assert round(FALLBACK.torch_onnxruntime / MiB, 1) == 237.0
    assert FALLBACK.training > FALLBACK.torch_onnxruntime


def test_overrides():
    figures = FALLBACK.with_overrides({"torch_training": 300 * MiB})
    assert figures.training == 300 * MiB and figures.onnxruntime == FALLBACK.onnxruntime
    assert "override" in figures.source
    with pytest.raises(ValueError, match="unknown runtime figure"):
        FALLBACK.with_overrides({"cuda": 1})


def test_default_cache_file_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path / "edge"))
    assert default_cache_file() == tmp_path / "edge" / "runtime.json"
    monkeypatch.delenv("EDGETRAIN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_file() == tmp_path / "xdg" / "edgetrain" / "runtime.json"
