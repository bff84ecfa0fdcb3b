"""Real child processes under real memory caps (cgroup where this machine allows it, RLIMIT_AS + watchdog
everywhere on POSIX): a device that stays inside its budget runs to the end with a measured peak, one that
goes past it is killed and reported, a hung one times out, and no cgroup is left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from emulator import capping, cgroups
from emulator.capping import (
    MEMORY_EXIT_CODE,
    CapError,
    CappedProcess,
    apply_self_limit,
    available_mechanisms,
    cleanup_stale,
    find_cgroups,
    mechanism_status,
)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="memory capping needs a POSIX system")

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[1]
STATUS = mechanism_status()
CGROUP = next((m for m in ("cgroup-v2", "cgroup-v1") if STATUS[m] == "ok"), None)
CAPS = ["cgroup-v2", "cgroup-v1", "rlimit-as+watchdog"]
# The device side of a capped child: its imports, then the self-limit (a no-op under a cgroup).
PRELUDE = (
    "import numpy as np\n"
    "from emulator.capping import apply_self_limit\n"
    "apply_self_limit()\n"
)


def need(mechanism: str) -> None:
    if STATUS[mechanism] != "ok":
        pytest.skip(f"{mechanism} is not available on this machine: {STATUS[mechanism]}")


def run(code: str, budget: int, mechanism: str, timeout_s: float = 60.0, **kw) -> capping.CapResult:
    p = CappedProcess.start(
        [sys.executable, "-c", code], budget, mechanism=mechanism, timeout_s=timeout_s, cwd=REPO, **kw
    )
    return p.wait(timeout=timeout_s + 30)


@pytest.fixture(autouse=True, scope="module")
def no_cgroup_left_behind():
    yield
    assert find_cgroups(os.getpid()) == [], "capped processes left cgroups behind"


def test_a_mechanism_is_available_or_the_reason_is_given():
    assert STATUS["none"] == "ok"
    assert all(isinstance(v, str) and v for v in STATUS.values())
    found = available_mechanisms()
    assert "none" not in found
    assert found == [m for m in CAPS if STATUS[m] == "ok"]


@pytest.mark.parametrize("mechanism", CAPS)
def test_under_budget_runs_to_the_end_with_a_peak_between_allocation_and_budget(mechanism):
    need(mechanism)
    code = PRELUDE + "a = np.ones(100 * 2**20 // 8)\nassert a.sum() == a.size\n"
    r = run(code, 256 * MiB, mechanism)
    assert r.returncode == 0 and not r.oom_killed and not r.timed_out
    assert r.mechanism == mechanism and r.budget_bytes == 256 * MiB
    assert r.peak_bytes is not None and 100 * MiB < r.peak_bytes < 256 * MiB
    assert r.within_budget


@pytest.mark.parametrize("mechanism", CAPS)
def test_over_budget_is_killed_and_reported(mechanism):
    need(mechanism)
    code = PRELUDE + "a = np.ones(400 * 2**20 // 8)\nprint(a.sum())\n"
    r = run(code, 200 * MiB, mechanism, stderr=subprocess.DEVNULL)
    assert r.oom_killed and not r.timed_out and not r.within_budget
    if mechanism.startswith("cgroup"):
        assert r.returncode == -9  # the kernel's OOM killer
        assert r.peak_bytes is not None and r.peak_bytes <= 200 * MiB
    else:
        assert r.returncode == MEMORY_EXIT_CODE  # the allocation failed under RLIMIT_AS: MemoryError


def test_watchdog_kills_a_child_that_did_not_limit_itself():
    need("rlimit-as+watchdog")
    # Grows 4 MiB at a time without calling apply_self_limit: only the RSS watchdog can stop it.
    code = "import time\nb = []\nfor _ in range(150):\n    b.append(b'x' * (4 << 20))\n    time.sleep(0.002)\n"
    r = run(code, 150 * MiB, "rlimit-as+watchdog")
    assert r.returncode == -9 and r.oom_killed and not r.timed_out
    # It polls every 10 ms, so it overshoots, but not by the 600 MiB the child would have reached.
    assert r.peak_bytes is not None and 150 * MiB < r.peak_bytes < 300 * MiB


@pytest.mark.parametrize("mechanism", CAPS + ["none"])
def test_a_hung_child_is_killed_at_the_timeout(mechanism):
    need(mechanism)
    r = run("import time; time.sleep(60)", 128 * MiB, mechanism, timeout_s=0.5)
    assert r.timed_out and r.returncode == -9 and not r.oom_killed


def test_the_child_is_in_its_cgroup_from_the_start_and_sees_its_budget():
    if CGROUP is None:
        pytest.skip(f"no writable memory cgroup here: {STATUS}")
    code = (
        "import os\n"
        "print(os.environ['EDGETRAIN_MEMORY_BUDGET'], os.environ['EDGETRAIN_MEMORY_MECHANISM'])\n"
        "print(open('/proc/self/cgroup').read())\n"
    )
    p = CappedProcess.start(
        [sys.executable, "-c", code], 64 * MiB, mechanism=CGROUP, timeout_s=30, stdout=subprocess.PIPE
    )
    r = p.wait(timeout=60)
    out = p._popen.stdout.read().decode()
    p._popen.stdout.close()
    assert r.returncode == 0
    assert out.splitlines()[0] == f"{64 * MiB} {CGROUP}"
    assert f"/edgetrain-{os.getpid()}-" in out
    # The cgroup counts the interpreter's own start-up, yet stays far below what `python` maps.
    assert r.peak_bytes is not None and 0 < r.peak_bytes < 64 * MiB


def test_cpu_share_is_applied_with_the_cfs_quota():
    status = capping.cpu_throttle_status()
    if status != "cgroup-v1":
        pytest.skip(f"cpu_share is applied through cgroup v1 only in this test; here: {status}")
    code = (
        "import os\n"
        "line = [l for l in open('/proc/self/cgroup') if l.split(':')[1].split(',').count('cpu')][0]\n"
        "path = line.strip().split(':', 2)[2]\n"
        "mount = [l.split()[4] for l in open('/proc/self/mountinfo')\n"
        "         if ' - cgroup ' in l and 'cpu' in l.split()[-1].split(',')][0]\n"
        "print(open(mount + path + '/cpu.cfs_quota_us').read().strip())\n"
    )
    p = CappedProcess.start(
        [sys.executable, "-c", code], 64 * MiB, mechanism="none", timeout_s=30, cpu_share=0.25,
        stdout=subprocess.PIPE,
    )
    r = p.wait(timeout=60)
    out = p._popen.stdout.read().decode().strip()
    p._popen.stdout.close()
    assert r.returncode == 0 and r.cpu_mechanism == "cgroup-v1" and r.cpu_share == 0.25
    assert out == "25000"  # a quarter of the 100 ms period


def test_kill_and_context_manager():
    mechanism = available_mechanisms()[0]
    with CappedProcess.start(
        [sys.executable, "-c", "import time; time.sleep(60)"], 64 * MiB, mechanism=mechanism, timeout_s=60
    ) as p:
        assert p.poll() is None and p.pid > 0
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=0.05)
        p.kill()
        r = p.wait(timeout=30)
    assert r.returncode == -9 and not r.timed_out and not r.oom_killed
    assert p.poll() == -9
    with CappedProcess.start(
        [sys.executable, "-c", "import time; time.sleep(60)"], 64 * MiB, mechanism=mechanism, timeout_s=60
    ) as p:
        pass  # leaving the block kills and reaps
    assert p.poll() == -9


def test_wait_async_runs_devices_side_by_side():
    mechanism = available_mechanisms()[0]

    async def main():
        procs = [
            CappedProcess.start(
                [sys.executable, "-c", f"import sys; sys.exit({rc})"], 64 * MiB, mechanism=mechanism, timeout_s=30
            )
            for rc in (0, 3, 5)
        ]
        return await asyncio.wait_for(asyncio.gather(*(p.wait_async() for p in procs)), 60)

    results = asyncio.run(main())
    assert [r.returncode for r in results] == [0, 3, 5]
    assert not any(r.oom_killed or r.timed_out for r in results)


def test_bad_requests_get_clear_errors():
    argv = [sys.executable, "-c", "pass"]
    with pytest.raises(CapError, match="budget_bytes"):
        CappedProcess.start(argv, 0, timeout_s=5)
    with pytest.raises(CapError, match="unknown mechanism"):
        CappedProcess.start(argv, MiB, mechanism="ulimit", timeout_s=5)
    with pytest.raises(CapError, match="timeout_s"):
        CappedProcess.start(argv, MiB, timeout_s=0)
    with pytest.raises(CapError, match="cpu_share"):
        CappedProcess.start(argv, MiB, timeout_s=5, cpu_share=0)
    unavailable = [m for m in CAPS if STATUS[m] != "ok"]
    if unavailable:
        with pytest.raises(CapError, match="unavailable"):
            CappedProcess.start(argv, MiB, mechanism=unavailable[0], timeout_s=5)
    with pytest.raises(FileNotFoundError):
        CappedProcess.start(["/nonexistent/device"], 64 * MiB, timeout_s=5)
    assert find_cgroups(os.getpid()) == []  # the failed start removed its cgroup


def test_apply_self_limit_does_nothing_without_a_budget_or_under_a_cgroup(monkeypatch):
    monkeypatch.delenv(capping.BUDGET_ENV, raising=False)
    assert apply_self_limit() is None
    monkeypatch.setenv(capping.BUDGET_ENV, str(64 * MiB))
    monkeypatch.setenv(capping.MECHANISM_ENV, "cgroup-v1")
    assert apply_self_limit() is None  # the kernel caps this process already
    monkeypatch.setenv(capping.BUDGET_ENV, "lots")
    monkeypatch.setenv(capping.MECHANISM_ENV, "rlimit-as+watchdog")
    with pytest.raises(CapError, match="EDGETRAIN_MEMORY_BUDGET"):
        apply_self_limit()


def test_cleanup_stale_removes_the_cgroups_of_a_dead_parent():
    if CGROUP != "cgroup-v1":
        pytest.skip(f"needs a writable cgroup v1 memory hierarchy: {STATUS['cgroup-v1']}")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    parent = cgroups.v1_dir("memory")
    empty = parent / f"edgetrain-{dead.pid}-0"
    busy = parent / f"edgetrain-{dead.pid}-1"
    empty.mkdir()
    busy.mkdir()
    procs = os.fsencode(busy / "cgroup.procs")
    # An orphaned device left running inside the cgroup of the parent that died.
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=cgroups.join_cgroups_fn([procs])
    )
    try:
        assert busy in find_cgroups(dead.pid) and empty in find_cgroups(dead.pid)
        removed = cleanup_stale(kill_orphans=False)
        assert empty in removed and busy.exists() and orphan.poll() is None
        removed = cleanup_stale()
        assert busy in removed and not busy.exists()
        assert orphan.wait(timeout=10) == -9
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
        for d in (empty, busy):
            if d.exists():
                d.rmdir()
    assert find_cgroups(dead.pid) == []


def test_an_interrupted_parent_kills_its_devices_and_removes_their_cgroups():
    if CGROUP is None:
        pytest.skip(f"no writable memory cgroup here: {STATUS}")
    parent_code = (
        "import signal, sys, time\n"
        # A shell starts background jobs with SIGINT ignored, and Python keeps an inherited SIG_IGN:
        # restore the KeyboardInterrupt handler so the test does not depend on how it was launched.
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from emulator.capping import CappedProcess\n"
        f"p = CappedProcess.start([sys.executable, '-c', 'import time; time.sleep(60)'], {64 * MiB}, "
        f"mechanism={CGROUP!r}, timeout_s=60)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        child = int(parent.stdout.readline())
        assert len(find_cgroups(parent.pid)) == 1
        parent.send_signal(signal.SIGINT)  # KeyboardInterrupt in the parent: atexit cleans up
        assert parent.wait(timeout=30) != 0
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()
    assert find_cgroups(parent.pid) == []
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # killed (and reaped by init once its parent was gone)


def test_many_short_devices_leave_nothing_behind():
    mechanism = available_mechanisms()[0]
    procs = [
        CappedProcess.start([sys.executable, "-c", "pass"], 64 * MiB, mechanism=mechanism, timeout_s=30)
        for _ in range(8)
    ]
    assert all(p.wait(timeout=60).returncode == 0 for p in procs)
    assert find_cgroups(os.getpid()) == []  # removed before wait() returns


def test_a_device_process_can_import_the_self_limit_without_torch():
    code = (
        "import sys\n"
        "import emulator.capping\n"
        "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
