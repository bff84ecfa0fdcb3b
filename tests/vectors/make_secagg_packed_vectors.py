"""Write tests/vectors/secagg_packed.json: compressed secure uploads' values both SDKs must reproduce.

Run from the repository root::

    .venv/bin/python tests/vectors/make_secagg_packed_vectors.py

Every input is fixed here (words, updates, rounding seeds); every output is computed by
``edge_sdk.secagg.fixedpoint``: words packed at b bits (:func:`pack_words`), a compressed round's
per-block fixed point (:class:`Compression`), and compressed encodings with their packed bytes.
tests/test_secagg_packed.py and edge_sdk_js/test/secagg-packed.test.mjs read the file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edge_sdk.secagg.fixedpoint import Compression, pack_words  # noqa: E402
from tests.vectors.make_secagg_vectors import dyadic, seed  # noqa: E402

OUT = Path(__file__).resolve().parent / "secagg_packed.json"


def packing() -> list[dict]:
    out = []
    for bits, count in [(1, 13), (3, 8), (7, 9), (9, 21), (10, 5), (16, 3), (17, 11), (31, 4), (32, 3), (10, 0)]:
        rng = np.random.default_rng(int.from_bytes(seed(f"pack {bits} {count}")[:8], "little"))
        words = rng.integers(0, 2**bits, size=count, dtype=np.uint64).astype(np.uint32)
        if count:
            words[0] = (1 << bits) - 1  # every bit of a word set
        out.append({"bits": bits, "words": words.tolist(), "packed": pack_words(words, bits).tobytes().hex()})
    return out


def plans() -> list[dict]:
    cases = [(7, 4.0, 8, 1.0, 4_196_352), (7, 4.0, 8, 1.0, 20_490), (6, 4.0, 10, 1.0, 133_120), (8, 4.0, 256, 2.5, 1000),
             (4, 2.0, 3, 0.5, 1), (24, 4.0, 200, 1e-3, 10**6), (2, 4.0, 5, 100.0, 7)]
    out = []
    for q, k, n, clip, d in cases:
        fp = Compression(q, k).fixed(n, clip, d)
        out.append({"value_bits": q, "spread": k, "cohort": n, "clip": clip, "dimension": d,
                    "frac_bits": fp.frac_bits, "ring_bits": fp.ring_bits, "bound": fp.bound})
    return out


def encodings() -> list[dict]:
    cases = [(7, 8, 1.0, dyadic("packed small", 1000, 3), 0.75),    # norm below the clip
             (7, 8, 1.0, dyadic("packed large", 1000, 500), 0.5),   # clipped
             (6, 10, 0.25, dyadic("packed six", 333, 40), 1.0),     # a stream that ends inside a byte
             (3, 4, 2.0, dyadic("packed zero weight", 9, 100), 0.0)]
    out = []
    for n, (q, cohort, clip, update, weight) in enumerate(cases):
        fp = Compression(q).fixed(cohort, clip, len(update))
        rounding = seed(f"packed rounding {n}")
        words = fp.encode(np.array(update), weight, rounding)
        out.append({"value_bits": q, "cohort": cohort, "clip": clip, "update": update, "weight": weight,
                    "rounding_seed": rounding.hex(), "frac_bits": fp.frac_bits, "ring_bits": fp.ring_bits,
                    "bound": fp.bound, "words": words.tolist(), "packed": pack_words(words, fp.ring_bits).tobytes().hex()})
    return out


def main() -> None:
    doc = {"about": "Compressed secure uploads (edge_sdk/secagg/fixedpoint.py, Compression and pack_words); "
                    "written by tests/vectors/make_secagg_packed_vectors.py",
           "packing": packing(), "plans": plans(), "encodings": encodings()}
    OUT.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
