"""Process limits a server holding thousands of connections needs.

Every websocket is a file descriptor: an orchestrator with 10,000 devices holds 10,000 sockets, and
a lightweight worker one per device it runs. Many systems start processes with a soft
``RLIMIT_NOFILE`` of 1,024 while allowing far more (the hard limit), so the server and the workers
raise their soft limit to the hard one where the OS lets them.
"""

from __future__ import annotations

try:
    import resource
except ImportError:  # not on POSIX: nothing to raise
    resource = None  # type: ignore[assignment]

__all__ = ["raise_fd_limit"]


def raise_fd_limit(want: int | None = None) -> tuple[int, int]:
    """Raise this process's soft descriptor limit to ``want`` (default: the hard limit), never
    above the hard limit and never lower than it is. Returns the (soft, hard) limits before.

    An OS that refuses (macOS caps the soft limit at ``OPEN_MAX`` below an "unlimited" hard limit)
    keeps the old limit; the server then refuses connections beyond it as it would anyway."""
    if resource is None:
        return (-1, -1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if want is None else (want if hard == resource.RLIM_INFINITY else min(want, hard))
    if target == resource.RLIM_INFINITY:
        target = 1 << 20  # "unlimited" hard limits still refuse an infinite soft one on some systems
    if soft != resource.RLIM_INFINITY and target > soft:
        for value in (target, 1 << 16, 10_240):
            if value <= soft:
                break
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (value, hard))
                break
            except (ValueError, OSError):
                continue
    return soft, hard
