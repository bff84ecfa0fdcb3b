"""Write tests/vectors/proofs.json: the credential proofs (format 2) both device SDKs must produce.

Run from the repository root::

    .venv/bin/python tests/vectors/make_proof_vectors.py

Every input is fixed here (ids, secrets, purposes, times, nonces); every output is computed by
``edge_sdk.credentials``: the message the HMAC signs (hex, so its NUL separators are plain) and the
proof. tests/test_proof_vectors.py and edge_sdk_js/test/proofs.test.mjs read the file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edge_sdk.credentials import PROOF_SCHEME, PURPOSES, make_proof, proof_message  # noqa: E402

OUT = Path(__file__).resolve().parent / "proofs.json"
# An ASCII id, one whose UTF-8 is longer than its UTF-16 (é, U+1F600), and an id with separators of format 1.
CASES = [("dev-0", "s3cret"), ("émile-\U0001F600", "pässwörd-\U0001F511"), ("phone|7", "Zk3_-xq8"), ("a", "")]


def vectors() -> dict[str, object]:
    out = []
    for i, (device_id, secret) in enumerate(CASES):
        for j, purpose in enumerate(PURPOSES):
            seconds = 1_700_000_000 + 97 * i + j
            nonce = f"{i:02x}{j:02x}" * 8
            out.append({"device_id": device_id, "secret": secret, "purpose": purpose, "seconds": seconds,
                        "nonce": nonce, "message_hex": proof_message(purpose, device_id, seconds, nonce).hex(),
                        "proof": make_proof(device_id, secret, purpose=purpose, now=seconds, nonce=nonce)})
    return {"scheme": PROOF_SCHEME, "purposes": list(PURPOSES), "proofs": out}


if __name__ == "__main__":
    OUT.write_text(json.dumps(vectors(), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
