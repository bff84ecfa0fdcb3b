"""The cgroups of emulated devices: finding the hierarchies, making and removing a device's cgroup.

A device under a cgroup mechanism gets a child cgroup of this process's own (cgroup v1: in the
``memory`` and ``cpu`` hierarchies; v2: where the memory controller is delegated), named
``edgetrain-<parent pid>-<n>``. :mod:`emulator.capping` sets the limits and reads the
peaks; this module knows where cgroups live, makes and removes them, says whether a mechanism can
work here, and removes what a dead parent left behind (:func:`cleanup_stale`).
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CFS_PERIOD_US",
    "CGROUP_PREFIX",
    "cgroup_pids",
    "cleanup_stale",
    "cpu_throttle_status",
    "find_cgroups",
    "join_cgroups_fn",
    "kv_lines",
    "make_cgroup",
    "probe_v1",
    "probe_v2",
    "read_file",
    "remove_cgroup",
    "v1_dir",
    "v2_parent",
    "write_file",
]

CGROUP_PREFIX = "edgetrain-"
CFS_PERIOD_US = 100_000
_CGROUP_NAME = re.compile(r"^edgetrain-(\d+)-\d+$")
_names = itertools.count()  # per-process sequence for unique cgroup names


# -- cgroup discovery ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Mount:
    version: int  # 1 or 2
    controllers: frozenset[str]  # v1: the hierarchy's controllers; v2: empty (see cgroup.controllers)
    root: str  # the hierarchy path mounted there
    mountpoint: Path


def mounts() -> list[_Mount]:
    """cgroup mounts from /proc/self/mountinfo (fields: ... root mountpoint ... - fstype source opts)."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        root, mountpoint = _unescape(fields[3]), Path(_unescape(fields[4]))
        if tail[0] == "cgroup2":
            mounts.append(_Mount(2, frozenset(), root, mountpoint))
        else:
            opts = set(tail[2].split(","))
            mounts.append(_Mount(1, frozenset(opts), root, mountpoint))
    return mounts


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def own_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under key "" its v2 path."""
    paths: dict[str, str] = {}
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return paths
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            paths[""] = path
        for c in controllers.split(","):
            paths[c] = path
    return paths


def _resolve(mount: _Mount, path: str) -> Path | None:
    """The directory of hierarchy path `path` under `mount`, if that mount shows it."""
    if mount.root != "/":
        if path != mount.root and not path.startswith(mount.root + "/"):
            return None
        path = path[len(mount.root) :] or "/"
    d = mount.mountpoint / path.lstrip("/")
    return d if d.is_dir() else None


def v1_dir(controller: str) -> Path | None:
    own = own_cgroups()
    if controller not in own:
        return None
    for m in mounts():
        if m.version == 1 and controller in m.controllers:
            d = _resolve(m, own[controller])
            if d is not None:
                return d
    return None


def v2_parent(controller: str) -> Path | None:
    """Where a v2 child with `controller` can be made: our own cgroup if it delegates the controller to
    its children, else our parent (a sibling of ours), whose delegation is what gave it to us."""
    own = own_cgroups()
    if "" not in own:
        return None
    for m in mounts():
        if m.version != 2:
            continue
        d = _resolve(m, own[""])
        if d is None:
            continue
        if controller in read_file(d / "cgroup.subtree_control", "").split():
            return d
        if controller in read_file(d / "cgroup.controllers", "").split() and d != m.mountpoint:
            return d.parent
    return None


def read_file(path: Path, default: str | None = None) -> str:
    try:
        return path.read_text()
    except OSError:
        if default is None:
            raise
        return default


def write_file(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _new_name() -> str:
    return f"{CGROUP_PREFIX}{os.getpid()}-{next(_names)}"


def make_cgroup(parent: Path, files: Mapping[str, str], optional: Mapping[str, str] | None = None) -> Path:
    """mkdir a uniquely named child of `parent` and write its limit files (optional ones may fail)."""
    while True:
        d = parent / _new_name()
        try:
            os.mkdir(d)
            break
        except FileExistsError:
            continue
    try:
        for name, value in files.items():
            write_file(d / name, value)
        for name, value in (optional or {}).items():
            if (d / name).exists():
                try:
                    write_file(d / name, value)
                except OSError:
                    pass
    except BaseException:
        remove_cgroup(d)
        raise
    return d


def cgroup_pids(d: Path) -> list[int]:
    return [int(p) for p in read_file(d / "cgroup.procs", "").split()]


def remove_cgroup(d: Path, *, kill: bool = True, attempts: int = 50) -> bool:
    """Kill what is left inside (a device's own children) and rmdir; retry while the kernel is busy."""
    for _ in range(attempts):
        if kill:
            for pid in cgroup_pids(d):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            os.rmdir(d)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY:
                return False
        time.sleep(0.02)
    return False


def kv_lines(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out



# -- can a mechanism work here ---------------------------------------------------------------------
def probe_v1() -> str:
    d = v1_dir("memory")
    if d is None:
        return "no cgroup v1 memory hierarchy holds this process"
    if not (d / "memory.limit_in_bytes").exists():
        return f"{d} has no memory.limit_in_bytes"
    try:
        probe = make_cgroup(d, {})
    except OSError as e:
        return f"cannot create a cgroup under {d}: {_why(e)}"
    ok = (probe / "memory.limit_in_bytes").exists()
    remove_cgroup(probe, kill=False)
    return "ok" if ok else f"a child of {d} has no memory.limit_in_bytes"


def probe_v2() -> str:
    d = v2_parent("memory")
    if d is None:
        return "cgroup v2 has no memory controller delegated to this process"
    try:
        probe = make_cgroup(d, {})
    except OSError as e:
        return f"cannot create a cgroup under {d}: {_why(e)}"
    ok = (probe / "memory.max").exists()
    remove_cgroup(probe, kill=False)
    return "ok" if ok else f"a child of {d} has no memory.max"


def _why(e: OSError) -> str:
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"{e.strerror} (needs root, or a cgroup delegated to this user)"
    return str(e.strerror)


def cpu_throttle_status() -> str:
    """How ``cpu_share`` would be applied here ("cgroup-v2" or "cgroup-v1"), or why it would not."""
    d = v2_parent("cpu")
    if d is not None and v2_parent("memory") == d:
        return "cgroup-v2"  # set on the memory cgroup, so only with the cgroup-v2 mechanism
    d = v1_dir("cpu")
    if d is None or not (d / "cpu.cfs_quota_us").exists():
        return "no cgroup v1 cpu hierarchy with CFS bandwidth control holds this process"
    try:
        probe = make_cgroup(d, {})
    except OSError as e:
        return f"cannot create a cgroup under {d}: {_why(e)}"
    remove_cgroup(probe, kill=False)
    return "cgroup-v1"


def join_cgroups_fn(procs_files: list[bytes]) -> Callable[[], None]:
    """A preexec_fn that moves the forked child into its cgroups before exec, so its imports count.

    Runs between fork and exec: plain os calls only, no allocation-heavy Python."""

    def join() -> None:
        for path in procs_files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    return join



# -- housekeeping ----------------------------------------------------------------------------------
def _roots() -> list[Path]:
    roots = []
    for m in mounts():
        if m.version == 2 or m.controllers & {"memory", "cpu"}:
            roots.append(m.mountpoint)
    return roots


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_cgroups(owner: int | None = None, *, max_depth: int = 6) -> list[Path]:
    """Cgroups this module created (``edgetrain-<pid>-<n>``) in every memory/cpu/v2 hierarchy,
    optionally only those of parent pid `owner`."""
    found: list[Path] = []
    for root in _roots():
        stack = [(root, 0)]
        while stack:
            d, depth = stack.pop()
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                if not e.is_dir(follow_symlinks=False):
                    continue
                m = _CGROUP_NAME.match(e.name)
                if m:
                    if owner is None or int(m.group(1)) == owner:
                        found.append(Path(e.path))
                elif depth < max_depth:
                    stack.append((Path(e.path), depth + 1))
    return sorted(found)


def cleanup_stale(*, kill_orphans: bool = True) -> list[Path]:
    """Remove the cgroups of parents that no longer run (a killed emulator); return what was removed.

    With `kill_orphans`, device processes still inside such a cgroup are SIGKILLed first (nobody is left
    to collect their results); otherwise a cgroup that still holds processes is kept."""
    removed = []
    for cg in find_cgroups():
        m = _CGROUP_NAME.match(cg.name)
        assert m is not None
        owner = int(m.group(1))
        if owner == os.getpid() or _alive(owner):
            continue
        if not kill_orphans and cgroup_pids(cg):
            continue
        if remove_cgroup(cg, kill=kill_orphans):
            removed.append(cg)
    return removed
