"""Write tests/vectors/delta.json: delta downloads as the Python SDK encodes them, and the bytes they rebuild.

Run ``python tests/vectors/make_delta_vectors.py`` after changing the delta format (and say why in the
commit): tests/test_delta_downloads.py checks that the Python SDK still writes these payloads and
rebuilds these bytes, edge_sdk_js/test/delta-downloads.test.mjs that the JavaScript device rebuilds
the same bytes (sha256) from the same payloads and bases. Cases: a tensor payload (a tail: aligned
regions, an int64 entry in the skeleton) and raw bytes with regions at odd offsets (as an ONNX chunk's
initializers sit), each whole and against a base, at 8, 4 and 2 bits.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edge_sdk import protocol as p  # noqa: E402
from edge_sdk.codecs.delta import DELTA_BITS, encode_delta  # noqa: E402
from edge_sdk.wire_codecs import tensor_regions  # noqa: E402

OUT = Path(__file__).with_name("delta.json")


def _payloads() -> list[tuple[str, bytes, bytes, np.ndarray]]:
    """(name, version 1, version 2, regions) of each kind of payload."""
    rng = np.random.default_rng(20261128)
    w = (rng.normal(size=(20, 30)) * 0.1).astype(np.float32)
    tails = [p.encode_tensors({"w": w + np.float32(0.01) * k * rng.normal(size=w.shape).astype(np.float32),
                               "steps": np.array(k, np.int64), "b": np.linspace(-1, 1, 300, dtype=np.float32) * k})
             for k in (1, 2)]
    head, gap, tail = rng.bytes(37), rng.bytes(11), rng.bytes(5)
    a, b = (rng.normal(size=(2, 500)) * 0.2).astype(np.float32), (rng.normal(size=(2, 70))).astype(np.float32)
    raw = [head + a[k].tobytes() + gap + b[k].tobytes() + tail for k in (0, 1)]
    raw_regions = np.array([[37, 500], [37 + 2000 + 11, 70]], np.int64)
    return [("tensors", tails[0], tails[1], tensor_regions(tails[0])), ("bytes", raw[0], raw[1], raw_regions)]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def main() -> None:
    cases = []
    for name, first, second, regions in _payloads():
        for bits in DELTA_BITS:
            whole, base = encode_delta(first, regions, None, bits)
            delta, rebuilt = encode_delta(second, regions, base, bits)
            cases.append({"payload": name, "bits": bits, "base": None, "current": _b64(first), "delta": _b64(whole),
                          "rebuilt_sha256": hashlib.sha256(base).hexdigest(), "regions": regions.tolist()})
            cases.append({"payload": name, "bits": bits, "base": _b64(base), "current": _b64(second),
                          "delta": _b64(delta), "rebuilt_sha256": hashlib.sha256(rebuilt).hexdigest(),
                          "regions": regions.tolist()})
    OUT.write_text(json.dumps({"format": 1, "cases": cases}, indent=1) + "\n")
    print(f"{OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
