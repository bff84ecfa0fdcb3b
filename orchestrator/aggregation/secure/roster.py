"""The roster of identity keys: each enrolled device's Ed25519 public key (edge_sdk.secagg.binding).

Recorded when the device is enrolled, while its secret is at hand (``edgetrain device enroll``),
in ``secagg_roster.json`` in the run's store: device id -> hex of the 32-byte key. The server
relays a device's neighbours' keys from it; docs/security.md says what that binding holds against
and what it does not (a server that rewrites the roster can substitute keys).
"""

from __future__ import annotations

import json
from pathlib import Path

from edge_sdk.fileio import atomic_write

__all__ = ["ROSTER_FILE", "load_roster", "record_identity"]

ROSTER_FILE = "secagg_roster.json"


def load_roster(store_dir: str | Path) -> dict[str, bytes]:
    """Device id -> identity public key, as enrolled (empty if none was)."""
    path = Path(store_dir) / ROSTER_FILE
    if not path.exists():
        return {}
    return {d: bytes.fromhex(k) for d, k in json.loads(path.read_text()).items()}


def record_identity(store_dir: str | Path, device_id: str, secret: str) -> bytes:
    """Record the identity public key of ``device_id``'s new credential ``secret``; returns it."""
    from edge_sdk.secagg import identity_public_key

    key = identity_public_key(secret, device_id)
    roster = {d: k.hex() for d, k in load_roster(store_dir).items()}
    roster[device_id] = key.hex()
    atomic_write(Path(store_dir) / ROSTER_FILE, json.dumps(roster, sort_keys=True, indent=1).encode())
    return key
