"""Where the tests find the staged public datasets: ``$EDGETRAIN_DATA``, else, for the test run only,
``shared/datasets`` beside the checkout (the library itself has no default: the data root is a
setting). ``tests/conftest.py`` exports it as ``$EDGETRAIN_DATA`` for the whole run, device
processes included. A test that needs a dataset skips with one line where it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("EDGETRAIN_DATA") or REPO.parent / "shared" / "datasets")


def need(folder: str) -> Path:
    """The datasets root, if it holds ``folder``; else skip the calling test."""
    if not (SHARED / folder).exists():
        pytest.skip(f"{SHARED / folder} is absent: set $EDGETRAIN_DATA to the datasets folder to run this test")
    return SHARED
