"""Settings the server tests share: a server of the tiny model on synthetic data, one round, one device.

Each test names what it changes (``server_config(tmp_path / "s", norm_bound=0)``), so what a test is
about stays in the test and what all of them share is said once.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.config import ServerConfig

__all__ = ["server_config"]

#: What the server tests share unless they say otherwise. Direction trust is off: most of these tests'
#: devices send scripted constant deltas (tests/scripted.py), which no training direction agrees with, and
#: they check the plain mean of them (tests/test_direction_trust.py tests the trust).
DEFAULTS: dict[str, object] = {"model": "tiny", "eval_data": "synthetic", "rounds": 1, "min_devices": 1,
                               "direction_trust": False}


def server_config(store_dir: Path, **overrides: object) -> ServerConfig:
    """A :class:`ServerConfig` of :data:`DEFAULTS` storing under ``store_dir``, with ``overrides``."""
    return ServerConfig(**{**DEFAULTS, "store_dir": store_dir, **overrides})
