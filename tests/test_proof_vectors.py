"""The credential proof vectors (tests/vectors/proofs.json) are what ``edge_sdk.credentials`` makes and
takes; edge_sdk_js/test/proofs.test.mjs checks the JavaScript SDK against the same file."""

from __future__ import annotations

import json

from edge_sdk.credentials import ReplayWindow, derive_key, verify_proof
from tests.vectors.make_proof_vectors import OUT, vectors


def test_the_stored_vectors_are_what_the_python_sdk_makes() -> None:
    assert json.loads(OUT.read_text()) == vectors()


def test_each_vector_proves_its_device_at_its_own_door_only() -> None:
    stored = json.loads(OUT.read_text())
    for v in stored["proofs"]:
        key = derive_key(v["secret"])
        assert verify_proof(v["device_id"], v["proof"], key, ReplayWindow(), purpose=v["purpose"],
                            now=v["seconds"]).nonce == v["nonce"]
        for other in stored["purposes"]:
            if other != v["purpose"]:
                try:
                    verify_proof(v["device_id"], v["proof"], key, ReplayWindow(), purpose=other, now=v["seconds"])
                except ValueError:
                    continue
                raise AssertionError(f"{v['purpose']} proof taken for {other}")
