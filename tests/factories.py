"""Settings the server tests share: a server of the tiny model on synthetic data, one round, one device.

Each test names what it changes (``server_config(tmp_path / "s", norm_bound=0)``), so what a test is
about stays in the test and what all of them share is said once.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.config import EXACT_TRANSFERS, ServerConfig

__all__ = ["EXACT_TRANSFERS", "server_config"]

#: What the server tests share unless they say otherwise. Direction trust is off: most of these tests'
#: devices send scripted constant deltas (tests/scripted.py), which no training direction agrees with, and
#: they check the plain mean of them (tests/test_direction_trust.py tests the trust).
#: Payloads and updates travel exact (the codec tests name theirs: the server's default transfers are
#: lossy, and these tests check exact means), and a server whose devices die gives up after 120 s instead
#: of waiting for them as a service does.
DEFAULTS: dict[str, object] = {"model": "tiny", "eval_data": "synthetic", "rounds": 1, "min_devices": 1,
                               "direction_trust": False, "wait_devices_s": 120.0, **EXACT_TRANSFERS}


def server_config(store_dir: Path, **overrides: object) -> ServerConfig:
    """A :class:`ServerConfig` of :data:`DEFAULTS` storing under ``store_dir``, with ``overrides``."""
    return ServerConfig(**{**DEFAULTS, "store_dir": store_dir, **overrides})
