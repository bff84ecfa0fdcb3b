"""The conformance vectors (tests/vectors/codecs.json, written by tests/vectors/make_codec_vectors.py):
this SDK still writes every record byte for byte and reads each to the stored values. The JavaScript
SDK checks the same file (edge_sdk_js/test/codecs.test.mjs)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.codecs import codec, decode

VECTORS = json.loads((Path(__file__).parent / "vectors" / "codecs.json").read_text())


def _array(spec: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(spec["data"]), dtype=np.dtype(spec["dtype"]).newbyteorder("<")) \
        .reshape(spec["shape"])


def _id(case: dict) -> str:
    return f"{case['codec']}{case['params'] or ''}-{case['input']}-{case['seed']}"


def test_the_vectors_cover_every_codec():
    from edge_sdk.codecs import CODECS

    assert {c["codec"] for c in VECTORS["cases"]} == set(CODECS)


@pytest.mark.parametrize("case", VECTORS["cases"], ids=_id)
def test_records_are_written_and_read_as_stored(case):
    x = _array(VECTORS["inputs"][case["input"]])
    record = base64.b64decode(case["record"])
    assert codec(case["codec"], **case["params"]).encode(x, seed=int(case["seed"])) == record
    got, want = decode(record), _array(case["decoded"])
    assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
