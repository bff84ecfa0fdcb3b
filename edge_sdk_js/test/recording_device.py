"""``python -m edge_sdk`` (its arguments as given) that also appends, for a test, each block it encodes
in a secure round to the JSON lines file ``$EDGETRAIN_TEST_ENCODINGS``: the attack test's Python device
process (edge_sdk_js/test/secagg-attack.test.mjs; the records are test/encodings.mjs's). The server
never sees them; the device itself is the command's, unchanged."""

from __future__ import annotations

import json
import os
import threading

from edge_sdk.cli import main
from edge_sdk.secagg.fixedpoint import BlockEncoder
from edge_sdk.secagg.round import DeviceRound

HEAD = 4096  # tests/secagg_attack.py's
_current = threading.local()
_values, _weight_word, _mask_block = BlockEncoder.values, BlockEncoder.weight_word, DeviceRound._mask_block


def _record():
    return getattr(_current, "record", None)


def values(self, piece):
    words = _values(self, piece)
    record = _record()
    if record is not None:
        record["head"] += words[:max(0, HEAD - len(record["head"]))].tolist()
        record["count"] += int(words.size)
    return words


def weight_word(self):
    word = _weight_word(self)
    record = _record()
    if record is not None:
        record.update(weight=int(word[0]), count=record["count"] + 1)
    return word


def mask_block(self, block, parts, weight):
    _current.record = record = {"device": self.device_id, "round": self.scope.round, "block": block,
                                "bits": self.fixed.ring_bits, "count": 0, "head": [], "weight": None}
    try:
        out = _mask_block(self, block, parts, weight)
        with open(os.environ["EDGETRAIN_TEST_ENCODINGS"], "a") as f:
            f.write(json.dumps(record) + "\n")
        return out
    finally:
        _current.record = None


if __name__ == "__main__":
    if not os.environ.get("EDGETRAIN_TEST_ENCODINGS"):
        raise SystemExit("EDGETRAIN_TEST_ENCODINGS names the file the encodings go to")
    BlockEncoder.values, BlockEncoder.weight_word, DeviceRound._mask_block = values, weight_word, mask_block
    main()
