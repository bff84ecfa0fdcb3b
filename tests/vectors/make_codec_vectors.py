"""Write tests/vectors/codecs.json: inputs, settings, seeds, and the Python SDK's records and decodings.

Run ``python tests/vectors/make_codec_vectors.py`` after changing a codec (and say why in the commit):
tests/test_codecs_vectors.py checks that the Python codecs still give these bytes, and
edge_sdk_js/test/codecs.test.mjs that the JavaScript codecs give them too (for the deflate codecs,
whose bytes differ between implementations: that each SDK decodes the other's). Inputs are drawn
from numpy's generator here once and stored; nothing in the check depends on numpy's generator.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edge_sdk.codecs import codec, decode  # noqa: E402

OUT = Path(__file__).with_name("codecs.json")


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20261127)
    half_edges = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 65519.0, -65519.0, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25,
                           3 * 2.0 ** -26, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 6e-8, 1e-30, 0.1], np.float32)
    block = np.repeat(np.float32(0.25), 300)
    block[256:] = rng.normal(size=44).astype(np.float32)
    return {
        "normal": (rng.normal(size=(3, 5, 7)) * 0.05).astype(np.float32),
        "update": (rng.standard_t(3, size=1500) * 1e-3).astype(np.float32),
        "ramp": np.linspace(-1, 3, 1000, dtype=np.float32),
        "half_edges": half_edges,
        "constant_block": block,
        "zeros": np.zeros(37, np.float32),
        "scalar": np.array(-0.75, np.float32),
        "empty": np.zeros((0, 4), np.float32),
        "int64": rng.integers(-2 ** 40, 2 ** 40, size=(4, 6)).astype(np.int64),
        "bool": rng.random(19) > 0.5,
        "float16": rng.normal(size=33).astype(np.float16),
        "bytes": np.frombuffer(b"edgetrain payload " * 40 + bytes(range(256)), np.uint8),
    }


# (codec, params, input names, seeds): a case per combination.
_FLOATS = ["normal", "update", "ramp", "constant_block", "zeros", "scalar", "empty"]
_PLAN = [
    ("none", {}, [*_FLOATS, "int64", "bool", "float16", "bytes"], [0]),
    ("zlib", {}, ["update", "int64", "bytes"], [0]),
    ("zlib", {"level": 1}, ["normal"], [0]),
    ("shuffle", {}, ["update", "ramp", "int64", "float16", "bytes"], [0]),
    ("shuffle", {"stride": 3}, ["bytes"], [0]),
    ("float16", {}, [*_FLOATS, "half_edges"], [0]),
    ("int8", {}, _FLOATS, [0]),
    ("int8", {"block": 64}, ["update"], [0]),
    ("sr8", {}, _FLOATS, [1, 2]),
    ("sr4", {}, ["update", "ramp", "constant_block"], [3]),
    ("sr2", {}, ["update", "normal"], [4]),
    ("sr1", {}, ["update"], [5]),
    ("sr8", {"scale": 1e-4}, ["update", "zeros"], [6]),
    ("sr4", {"scale": 2e-3}, ["update"], [7]),
    ("int8", {"scale": 1e-2}, ["normal"], [0]),
    *[(f"eden{b}", {}, ["normal", "update", "zeros", "scalar", "empty"], [11 * b, 2 ** 63 + b]) for b in (1, 2, 3, 4)],
    *[(f"eden{b}", {"segment": 256}, ["update", "ramp"], [100 + b]) for b in (1, 2, 3, 4)],
]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _tensor(array: np.ndarray) -> dict:
    return {"dtype": str(array.dtype), "shape": list(array.shape), "data": _b64(np.ascontiguousarray(array).tobytes())}


def cases() -> list[dict]:
    inputs = _inputs()
    out = []
    for name, params, names, seeds in _PLAN:
        c = codec(name, **params)
        for input_name in names:
            for seed in seeds:
                record = c.encode(inputs[input_name], seed=seed)
                out.append({"codec": name, "params": params, "input": input_name, "seed": str(seed),
                            "record": _b64(record), "decoded": _tensor(decode(record))})
    return out


def main() -> None:
    inputs = {k: _tensor(v) for k, v in _inputs().items()}
    OUT.write_text(json.dumps({"format": 1, "inputs": inputs, "cases": cases()}, indent=1) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
