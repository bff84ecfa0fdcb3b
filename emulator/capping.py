"""Run one emulated device as an OS process under a hard memory cap, and report what it used.

A device class's memory budget is the device's whole memory for the app (runtime included), so the
emulator must hold every device process to it and prove afterwards that it stayed inside. Mechanisms, in
order of preference:

- ``cgroup-v2``: a child cgroup with ``memory.max`` (and ``memory.swap.max = 0``); the peak comes from
  ``memory.peak`` (kernel 5.19+, else sampled ``memory.current``), an OOM kill from ``memory.events``.
- ``cgroup-v1``: a child of this process's own memory cgroup with ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes`` so swap cannot dodge it); the peak is ``memory.max_usage_in_bytes``, an
  OOM kill is the ``oom_kill`` count of ``memory.oom_control``. Library pages already charged to another
  cgroup (shared libraries the parent loaded) are not counted again.
- ``rlimit-as+watchdog``: no root needed. The device process calls :func:`apply_self_limit` after its own
  imports, which caps its address space (``RLIMIT_AS``) so that an allocation past the budget fails with
  ``MemoryError`` (exit code :data:`MEMORY_EXIT_CODE`); the parent also polls the child's RSS every 10 ms and
  SIGKILLs it over budget. The watchdog overshoots by whatever the child allocates between two polls
  (tens of MiB for a fast allocator), so its kill is a backstop, not an exact limit; the peak it reports
  is the kernel's high-water mark (``VmHWM``) seen at the last poll.
- ``none``: no cap (never chosen by ``"auto"``); the RSS is still sampled for the report.

In a cgroup the kernel reclaims and kills; near the limit a process can thrash on shared-library pages
for minutes instead of dying, so every process also has a wall-clock timeout after which it is killed
and reported ``timed_out``.

CPU: ``cpu_share`` (0.25 = a quarter of one core) is applied with the CFS bandwidth controller (cgroup
v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``, or v2 ``cpu.max``) where writable; otherwise it is not
applied and :attr:`CapResult.cpu_mechanism` says ``"none"``.

A capped process's cgroups (:class:`~emulator.capgroups.CapGroups`: limits set, peaks and OOM kills
read; :mod:`emulator.cgroups`: where they live) are named ``edgetrain-<parent pid>-<n>``, removed when
the child has been reaped, at interpreter exit (``atexit``) for children still running, and by
:func:`cleanup_stale` for those of a parent that died.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from edge_sdk.memory import process_memory
from emulator.capgroups import CapError, CapGroups
from emulator.cgroups import (
    CGROUP_PREFIX,
    cleanup_stale,
    cpu_throttle_status,
    find_cgroups,
    join_cgroups_fn,
    probe_v1,
    probe_v2,
)

__all__ = [
    "BUDGET_ENV",
    "CGROUP_PREFIX",
    "MECHANISMS",
    "MECHANISM_ENV",
    "MEMORY_EXIT_CODE",
    "CapError",
    "CapResult",
    "CappedProcess",
    "apply_self_limit",
    "available_mechanisms",
    "cleanup_stale",
    "cpu_throttle_status",
    "find_cgroups",
    "is_out_of_memory",
    "mechanism_status",
]

MECHANISMS: tuple[str, ...] = ("cgroup-v2", "cgroup-v1", "rlimit-as+watchdog", "none")
BUDGET_ENV = "EDGETRAIN_MEMORY_BUDGET"
MECHANISM_ENV = "EDGETRAIN_MEMORY_MECHANISM"
# Exit code of a device process that died of MemoryError under apply_self_limit: the code a shell
# reports for a SIGKILLed command, which is how an OOM kill usually shows.
MEMORY_EXIT_CODE = 137

WATCHDOG_INTERVAL_S = 0.010


@dataclass(frozen=True)
class CapResult:
    """What a capped process did: how it ended and the most memory it held."""

    returncode: int | None
    mechanism: str  # "cgroup-v2" | "cgroup-v1" | "rlimit-as+watchdog" | "none"
    budget_bytes: int
    peak_bytes: int | None  # cgroup max usage, or the peak RSS the watchdog saw
    oom_killed: bool  # killed by the kernel (cgroup OOM) or the watchdog for memory, or MemoryError exit
    timed_out: bool
    wall_s: float
    cpu_mechanism: str = "none"  # "cgroup-v1" | "cgroup-v2" | "none": how cpu_share was applied
    cpu_share: float | None = None  # the share applied, None when not applied

    @property
    def within_budget(self) -> bool:
        """True when the process ended on its own and its measured peak is inside the budget."""
        return (
            not self.oom_killed
            and not self.timed_out
            and self.peak_bytes is not None
            and self.peak_bytes <= self.budget_bytes
        )


# -- mechanisms ------------------------------------------------------------------------------------
def _probe_rlimit() -> str:
    try:
        import resource  # noqa: F401
    except ImportError:
        return "the resource module (POSIX rlimits) is missing"
    if not hasattr(resource, "RLIMIT_AS"):
        return "RLIMIT_AS is not supported on this platform"
    return "ok"


_PROBES: dict[str, Callable[[], str]] = {
    "cgroup-v2": probe_v2,
    "cgroup-v1": probe_v1,
    "rlimit-as+watchdog": _probe_rlimit,
    "none": lambda: "ok",
}


def mechanism_status() -> dict[str, str]:
    """Every mechanism with "ok" or the reason it cannot be used on this machine."""
    return {name: probe() for name, probe in _PROBES.items()}


def available_mechanisms() -> list[str]:
    """The capping mechanisms this machine supports, best first ("none" is not a cap: not listed)."""
    return [m for m, status in mechanism_status().items() if status == "ok" and m != "none"]


def _choose(mechanism: str) -> str:
    if mechanism == "auto":
        found = available_mechanisms()
        if not found:
            raise CapError(f"no memory capping mechanism works here: {mechanism_status()}")
        return found[0]
    if mechanism not in MECHANISMS:
        raise CapError(f"unknown mechanism {mechanism!r}; known: auto, {', '.join(MECHANISMS)}")
    status = _PROBES[mechanism]()
    if status != "ok":
        raise CapError(f"mechanism {mechanism!r} is unavailable: {status}")
    return mechanism


# -- in the child ----------------------------------------------------------------------------------
def apply_self_limit(budget_bytes: int | None = None, *, force: bool = False) -> int | None:
    """Cap this process's address space so that allocating past the budget raises MemoryError.

    Call it in the device process after its imports. The budget is the process's whole memory (runtime
    included), so the allowance for new allocations is the budget minus the current RSS, added to the
    current virtual size: ``RLIMIT_AS = VmSize + (budget - RSS)``. Virtual reservations that are never
    touched (thread stacks, malloc arenas) count against it too, so this errs on the strict side.
    The budget defaults to ``$EDGETRAIN_MEMORY_BUDGET``; under a cgroup mechanism
    (``$EDGETRAIN_MEMORY_MECHANISM``) the kernel already caps the process and this does nothing unless
    ``force``. Also makes an uncaught
    allocation failure (``MemoryError``, or torch's and ONNX Runtime's errors, see :func:`is_out_of_memory`)
    exit with :data:`MEMORY_EXIT_CODE`, so the parent can tell it from other failures. A device that
    catches such errors itself (an asyncio task, a ``try``) should exit with that code too.
    Returns the limit set, or None when nothing was set.
    """
    import resource

    mechanism = os.environ.get(MECHANISM_ENV, "")
    if not force and mechanism in ("cgroup-v1", "cgroup-v2", "none"):
        return None
    if budget_bytes is None:
        raw = os.environ.get(BUDGET_ENV)
        if raw is None:
            return None
        try:
            budget_bytes = int(raw)
        except ValueError:
            raise CapError(f"${BUDGET_ENV} must be an integer number of bytes, got {raw!r}") from None
    if budget_bytes <= 0:
        raise CapError(f"memory budget must be positive, got {budget_bytes}")
    vms, rss = _self_vm()
    limit = vms + max(budget_bytes - rss, 0)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _exit_on_memory_error()
    return limit


def _self_vm() -> tuple[int, int]:
    """(virtual size, RSS) of this process in bytes."""
    seen = process_memory()
    return seen.vms_bytes, seen.rss_bytes


# How torch ("DefaultCPUAllocator: can't allocate memory") and ONNX Runtime ("Failed to allocate memory")
# report a failed allocation: as RuntimeError or their own exception types, not MemoryError.
_OUT_OF_MEMORY = ("can't allocate memory", "failed to allocate memory", "bad_alloc", "out of memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """True for MemoryError and for the allocation failures of torch and ONNX Runtime."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, Exception) and any(s in text for s in _OUT_OF_MEMORY)


def _exit_on_memory_error() -> None:
    previous, previous_thread = sys.excepthook, threading.excepthook

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        previous(exc_type, exc, tb)
        if is_out_of_memory(exc):
            sys.stderr.flush()
            os._exit(MEMORY_EXIT_CODE)

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        previous_thread(args)
        if args.exc_value is not None and is_out_of_memory(args.exc_value):
            sys.stderr.flush()
            os._exit(MEMORY_EXIT_CODE)

    sys.excepthook, threading.excepthook = hook, thread_hook


# -- in the parent ---------------------------------------------------------------------------------
def _rss_of(pid: int) -> tuple[int, int] | None:
    """(current RSS, high-water RSS) of a child, or None once it is gone (a zombie reads zeros)."""
    try:
        seen = process_memory(pid)
    except (ProcessLookupError, PermissionError):
        return None
    return seen.rss_bytes, seen.peak_rss_bytes


def _check_request(argv: Sequence[str], budget_bytes: int, timeout_s: float | None, cpu_share: float | None) -> None:
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0:
        raise CapError(f"budget_bytes must be a positive int, got {budget_bytes!r}")
    if timeout_s is not None and not timeout_s > 0:
        raise CapError(f"timeout_s must be positive or None, got {timeout_s!r}")
    if cpu_share is not None and not cpu_share > 0:
        raise CapError(f"cpu_share must be positive (1.0 = one core), got {cpu_share!r}")
    if not argv:
        raise CapError("argv is empty")


class CappedProcess:
    """One child process under a hard memory cap; usable from asyncio (``await wait_async()``) and sync code.

    A monitor thread reaps the child, enforces the timeout, and (for the watchdog mechanism) polls its
    RSS. Use it as a context manager, or call :meth:`wait`, so that the cgroup is removed.
    """

    pid: int
    mechanism: str

    def __init__(self) -> None:  # use CappedProcess.start()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._callbacks: list[Callable[[CapResult], None]] = []
        self._result: CapResult | None = None
        self._returncode: int | None = None
        self._kill_reason: str | None = None  # "memory" | "timeout" | "user"
        self._peak_seen = 0
        self._groups: CapGroups | None = None
        self._pidfd: int | None = None

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        budget_bytes: int,
        *,
        mechanism: str = "auto",
        timeout_s: float | None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stdout: int | IO[Any] | None = None,
        stderr: int | IO[Any] | None = None,
        cpu_share: float | None = None,
        watchdog_interval_s: float = WATCHDOG_INTERVAL_S,
    ) -> CappedProcess:
        """Start `argv` capped at `budget_bytes`; kill it after `timeout_s` seconds (None: never).

        The child's environment gets ``EDGETRAIN_MEMORY_BUDGET`` and ``EDGETRAIN_MEMORY_MECHANISM`` so a
        device process can call :func:`apply_self_limit` (it does nothing under a cgroup).
        """
        _check_request(argv, budget_bytes, timeout_s, cpu_share)
        self = cls()
        self.mechanism = _choose(mechanism)
        self.budget_bytes = budget_bytes
        self.argv = list(argv)
        self._timeout_s = timeout_s
        self._interval = watchdog_interval_s
        child_env = dict(os.environ if env is None else env)
        child_env[BUDGET_ENV] = str(budget_bytes)
        child_env[MECHANISM_ENV] = self.mechanism
        self._groups = CapGroups(self.mechanism, budget_bytes)
        try:
            procs_files = self._groups.create(cpu_share)
            preexec = join_cgroups_fn(procs_files) if procs_files else None
            self._t0 = time.monotonic()
            try:
                self._popen = subprocess.Popen(
                    self.argv, env=child_env, cwd=cwd, stdout=stdout, stderr=stderr, preexec_fn=preexec
                )
            except subprocess.SubprocessError as e:  # the preexec_fn failed: could not join the cgroup
                raise CapError(f"could not move the child into its cgroup: {e}") from e
        except BaseException:
            self._groups.remove()
            raise
        self.pid = self._popen.pid
        self._deadline = None if timeout_s is None else self._t0 + timeout_s
        if hasattr(os, "pidfd_open"):
            try:
                self._pidfd = os.pidfd_open(self.pid)
            except OSError:
                self._pidfd = None
        atexit.register(self._at_exit)
        threading.Thread(target=self._monitor, name=f"capped-{self.pid}", daemon=True).start()
        return self

    # -- monitoring ------------------------------------------------------------------------------
    def _monitor(self) -> None:
        assert self._groups is not None
        sample = self.mechanism in ("rlimit-as+watchdog", "none") or (
            self.mechanism == "cgroup-v2" and not self._groups.has_peak())
        try:
            while not self._reap():
                if sample:
                    self._sample()
                now = time.monotonic()
                if self._deadline is not None and now >= self._deadline:
                    self._kill("timeout")
                wait = self._interval if sample else None
                if self._deadline is not None:
                    remaining = max(self._deadline - now, 0.0) if self._kill_reason is None else 0.05
                    wait = remaining if wait is None else min(wait, remaining)
                self._sleep(wait)
        finally:
            self._finish()

    def _sleep(self, wait: float | None) -> None:
        if self._pidfd is not None:
            select.select([self._pidfd], [], [], wait)  # wakes when the child exits
        else:
            time.sleep(WATCHDOG_INTERVAL_S if wait is None else min(wait, WATCHDOG_INTERVAL_S * 5))

    def _sample(self) -> None:
        assert self._groups is not None
        if self.mechanism == "cgroup-v2":
            self._peak_seen = max(self._peak_seen, self._groups.current() or 0)
            return
        seen = _rss_of(self.pid)
        if seen is None:
            return
        rss, hwm = seen
        self._peak_seen = max(self._peak_seen, hwm, rss)
        if self.mechanism == "rlimit-as+watchdog" and rss > self.budget_bytes:
            self._kill("memory")

    def _reap(self) -> bool:
        with self._lock:
            if self._returncode is not None:
                return True
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: trust Popen if it knows
                self._returncode = self._popen.returncode if self._popen.returncode is not None else -1
                self._wall = time.monotonic() - self._t0
                return True
            if pid == 0:
                return False
            self._returncode = os.waitstatus_to_exitcode(status)
            self._popen.returncode = self._returncode  # keeps Popen from waiting on a reused pid
            self._wall = time.monotonic() - self._t0
            return True

    def _kill(self, reason: str) -> None:
        with self._lock:
            if self._returncode is not None:
                return
            if self._kill_reason is None:
                self._kill_reason = reason
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._groups is not None:  # the device's own children share its cgroup: take them down too
            self._groups.kill_members()

    def _finish(self) -> None:
        assert self._groups is not None
        rc = self._returncode
        peak, kernel_oom = self._groups.outcome(rc)
        if peak is not None and self.mechanism == "cgroup-v2":
            peak = max(peak, self._peak_seen)
        if peak is None and self.mechanism in ("rlimit-as+watchdog", "none", "cgroup-v2"):
            peak = self._peak_seen or None
        oom = (
            kernel_oom
            or self._kill_reason == "memory"
            or (self.mechanism == "rlimit-as+watchdog" and rc == MEMORY_EXIT_CODE)
        )
        self._groups.remove()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        result = CapResult(
            returncode=rc,
            mechanism=self.mechanism,
            budget_bytes=self.budget_bytes,
            peak_bytes=peak,
            oom_killed=oom,
            timed_out=self._kill_reason == "timeout",
            wall_s=getattr(self, "_wall", time.monotonic() - self._t0),
            cpu_mechanism=self._groups.cpu_mechanism,
            cpu_share=self._groups.cpu_share,
        )
        with self._lock:
            self._result = result
            callbacks, self._callbacks = self._callbacks, []
        atexit.unregister(self._at_exit)
        self._done.set()
        for cb in callbacks:
            cb(result)

    def _at_exit(self) -> None:
        self.kill()
        self._done.wait(5.0)
        if self._groups is not None:
            self._groups.remove()

    # -- public ------------------------------------------------------------------------------------
    def poll(self) -> int | None:
        """The return code once the child has ended (and its cgroup is gone), else None."""
        return self._result.returncode if self._done.is_set() and self._result else None

    def wait(self, timeout: float | None = None) -> CapResult:
        """Block until the child ends; raise subprocess.TimeoutExpired if `timeout` passes first.

        This timeout only bounds the wait: the cap's own timeout (``timeout_s``) kills the child."""
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.argv, timeout or 0.0)
        assert self._result is not None
        return self._result

    async def wait_async(self) -> CapResult:
        """Await the end of the child without blocking the event loop (no executor thread)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[CapResult] = loop.create_future()

        def resolve(result: CapResult) -> None:
            if not future.done():
                future.set_result(result)

        def from_thread(result: CapResult) -> None:
            try:
                loop.call_soon_threadsafe(resolve, result)
            except RuntimeError:  # the loop was closed meanwhile
                pass

        with self._lock:
            result = self._result
            if result is None:
                self._callbacks.append(from_thread)
        if result is not None:
            return result
        return await future

    def kill(self) -> None:
        """SIGKILL the child (and anything it started inside its cgroup); wait() then reports it."""
        self._kill("user")

    def peak_bytes(self) -> int | None:
        """The most memory the child has held so far (final once it has ended)."""
        if self._result is not None:
            return self._result.peak_bytes
        kernel = self._groups.peak() if self._groups is not None else None
        if kernel is not None:
            return max(kernel, self._peak_seen)
        return self._peak_seen or None

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def __enter__(self) -> CappedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._done.is_set():
            self.kill()
        self._done.wait()

    def __repr__(self) -> str:
        state = "running" if self._result is None else f"returncode={self._result.returncode}"
        return f"<CappedProcess pid={getattr(self, 'pid', None)} {self.mechanism} {state}>"


