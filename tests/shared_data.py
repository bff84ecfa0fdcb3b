"""Where the tests find the staged public datasets: ``$EDGETRAIN_DATA``, else ``shared/datasets``
beside the checkout. A test that needs one skips with a clear message where it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("EDGETRAIN_DATA", REPO.parent / "shared" / "datasets"))


def need(folder: str) -> Path:
    """The datasets root, if it holds ``folder``; else skip the calling test."""
    if not (SHARED / folder).exists():
        pytest.skip(f"{SHARED / folder} is absent (the shared datasets folder is not on this machine)")
    return SHARED
