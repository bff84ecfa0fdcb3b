"""Write tests/vectors/secagg.json: the values both SDKs' secure-aggregation blocks must reproduce.

Run from the repository root after ``npm ci`` in edge_sdk_js (the JavaScript Shamir shares come
from its ``shamir-secret-sharing``)::

    .venv/bin/python tests/vectors/make_secagg_vectors.py

Every input is fixed here (keys, seeds, ids, updates); every output is computed by
``edge_sdk.secagg``, except the known answers of RFC 7748 (X25519) and RFC 5869 (HKDF, test
case 3: empty salt and info), which come from the RFCs. Shamir shares are random by design: each
run draws new ones (Python's and JavaScript's), and the tests check that the other language
combines them. tests/test_secagg_vectors.py and edge_sdk_js/test/secagg.test.mjs read the file.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edge_sdk.secagg import (FixedPoint, Scope, advertisement_message, agree, combined_mask,  # noqa: E402
                             default_degree, expand_mask, expand_words, identity_public_key, label,
                             neighbour_graph, pair_mask_seed, public_key, remove_masks, seal_shares,
                             seed_commitment, self_mask_seed, share_key, sign_advertisement, sign_survivors,
                             split_secret, sub_mod, survivors_message)
from edge_sdk.secagg.masks import add_mod  # noqa: E402

OUT = Path(__file__).resolve().parent / "secagg.json"
SCOPE = Scope("job-7/attempt-0", 3)
# Ids whose UTF-8 order differs from their UTF-16 order (U+FFFD against U+1F600) and from case order.
IDS = ["alpha", "Zulu", "émile", "\ufffd-replacement", "\U0001F600-grin"]


def seed(tag: str) -> bytes:
    """A fixed 32-byte input named by ``tag``."""
    return hashlib.sha256(f"edgetrain secagg vector {tag}".encode()).digest()


def typed(field: str | int | bytes) -> dict:
    if isinstance(field, int):
        return {"int": field}
    return {"text": field} if isinstance(field, str) else {"hex": field.hex()}


def labels() -> list[dict]:
    cases = [("identity", ["phone-17"]), ("share-key", [SCOPE.session, SCOPE.round, "a", "b"]),
             ("pair-mask", [SCOPE.session, 2**53 - 1, 7, "émile", "\U0001F600"]),
             ("advertise", ["", 0, "x", bytes(range(32)), bytes(32)])]
    return [{"purpose": p, "fields": [typed(f) for f in fields], "bytes": label(p, *fields).hex()} for p, fields in cases]


def x25519() -> dict:
    rfc = {"alice_private": "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
           "alice_public": "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a",
           "bob_private": "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb",
           "bob_public": "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f",
           "shared": "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"}
    keys = [{"id": i, "private": seed(f"mask key {i}").hex(), "public": public_key(seed(f"mask key {i}")).hex()} for i in IDS]
    pairs = [{"a": a["id"], "b": b["id"], "shared": agree(bytes.fromhex(a["private"]), bytes.fromhex(b["public"])).hex()}
             for n, a in enumerate(keys) for b in keys[n + 1:]]
    small_order = ["00" * 32, "01" + "00" * 31, "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"]
    return {"rfc7748": rfc, "keys": keys, "agreements": pairs, "small_order": small_order}


def hkdf_cases(agreements: list[dict]) -> dict:
    first = agreements[0]
    shared = bytes.fromhex(first["shared"])
    a, b = first["a"], first["b"]
    return {
        "rfc5869_case3": {"ikm": "0b" * 22, "info": "", "length": 42,
                          "okm": "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d"
                                 "9d201395faa4b61a96c8"},
        "share_key": {"a": a, "b": b, "shared": first["shared"], "key": share_key(shared, SCOPE, a, b).hex()},
        "pair_mask_seed": [{"block": block, "a": a, "b": b, "shared": first["shared"],
                            "seed": pair_mask_seed(shared, SCOPE, block, a, b).hex()} for block in (0, 1, 5)],
        "self_mask_seed": [{"block": block, "device": a, "seed": seed("self").hex(),
                            "out": self_mask_seed(seed("self"), SCOPE, block, a).hex()} for block in (0, 3)],
        "seed_commitment": [{"block": block, "device": a, "seed": seed("self").hex(),
                             "out": seed_commitment(seed("self"), SCOPE, block, a).hex()} for block in (0, 3)],
    }


#: A survivor set out of UTF-8 byte order (signed sorted): what the consistency round signs.
SURVIVORS = ["émile", "phone-17", "Zulu", "\U0001F600"]


def identity() -> list[dict]:
    out = []
    for device, secret, split in [("phone-17", "4q0Q1m3L0mE9c2cQ3GxJvJ0bV7dC1zY5u9pA2sK6nHw", 0), ("émile", "s", 2)]:
        cipher, mask = public_key(seed(f"c {device}")), public_key(seed(f"s {device}"))
        commitments = seed(f"commit {device}") + seed(f"commit 2 {device}")
        out.append({"device": device, "secret": secret, "public": identity_public_key(secret, device).hex(),
                    "cipher_public": cipher.hex(), "mask_public": mask.hex(), "split": split,
                    "commitments": commitments.hex(),
                    "message": advertisement_message(SCOPE, device, cipher, mask, split, commitments).hex(),
                    "signature": sign_advertisement(secret, device, SCOPE, cipher, mask, split, commitments).hex(),
                    "survivors": SURVIVORS, "survivors_message": survivors_message(SCOPE, SURVIVORS).hex(),
                    "survivors_signature": sign_survivors(secret, device, SCOPE, SURVIVORS).hex()})
    return out


def masks() -> list[dict]:
    out = []
    for bits in (32, 20, 1):
        words = expand_mask(seed(f"mask {bits}"), 1000, bits)
        out.append({"seed": seed(f"mask {bits}").hex(), "bits": bits, "first": words[:8].tolist(),
                    "sha256_1000": hashlib.sha256(words.astype("<u4").tobytes()).hexdigest()})
    return out


def javascript_shares(secret: bytes, shares: int, threshold: int) -> list[str]:
    """Shares split by npm's shamir-secret-sharing (edge_sdk_js/node_modules), as hex."""
    script = ("import { split } from 'shamir-secret-sharing';"
              f"const s = await split(new Uint8Array(Buffer.from('{secret.hex()}', 'hex')), {shares}, {threshold});"
              "console.log(JSON.stringify(s.map((x) => Buffer.from(x).toString('hex'))));")
    done = subprocess.run(["node", "--input-type=module", "-e", script], cwd=ROOT / "edge_sdk_js",
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def shamir() -> dict:
    secret = seed("shamir secret")
    return {"secret": secret.hex(), "threshold": 3,
            "python_shares": [s.hex() for s in split_secret(secret, 5, 3)],
            "javascript_shares": javascript_shares(secret, 5, 3)}


def sealing() -> list[dict]:
    out = []
    for sender, receiver, blocks in [("alpha", "Zulu", 1), ("Zulu", "alpha", 3)]:
        key, nonce = seed("share key"), seed(f"nonce {sender}")[:12]
        seed_shares = [seed(f"seed share {sender} {b}") + b"\x07" for b in range(blocks)]
        key_share = seed(f"key share {sender}") + b"\x2a"
        out.append({"key": key.hex(), "nonce": nonce.hex(), "sender": sender, "receiver": receiver,
                    "seed_shares": [s.hex() for s in seed_shares], "mask_key_share": key_share.hex(),
                    "sealed": seal_shares(key, SCOPE, sender, receiver, seed_shares, key_share, nonce=nonce).hex()})
    return out


def graphs() -> dict:
    cases = [(0, IDS, None), (1, [f"d{i:02d}" for i in range(40)], None), (2, [f"d{i:02d}" for i in range(40)], 6),
             (0, [f"d{i}" for i in range(100)], None)]
    out = []
    for block, members, degree in cases:
        graph = neighbour_graph(seed("graph"), SCOPE, block, members, degree)
        out.append({"seed": seed("graph").hex(), "block": block, "members": members, "degree": degree,
                    "order": list(graph.order), "neighbours": {k: list(v) for k, v in graph.neighbours.items()},
                    "threshold": graph.threshold})
    return {"graphs": out, "default_degree": {str(n): default_degree(n) for n in (2, 3, 32, 33, 100, 1000, 10**6)}}


def dyadic(tag: str, size: int, scale: int) -> list[float]:
    """Multiples of 1/256: their squares sum exactly in any order, so both SDKs get the same norm."""
    rng = np.random.default_rng(int.from_bytes(seed(tag)[:8], "little"))
    return (rng.integers(-scale, scale + 1, size=size) / 256).tolist()


def fixed_point() -> dict:
    cases = [(FixedPoint.plan(5, 1.0), dyadic("small", 16, 40), 0.75),      # norm below the clip
             (FixedPoint.plan(5, 1.0), dyadic("large", 16, 500), 0.5),      # clipped
             (FixedPoint.plan(1000, 3.5, 12), dyadic("ring", 16, 900), 1.0),  # a ring below 32 bits
             (FixedPoint.plan(7, 0.25), dyadic("zero weight", 4, 100), 0.0)]
    out = []
    for n, (fp, update, weight) in enumerate(cases):
        rounding = seed(f"rounding {n}")
        out.append({"clip": fp.clip, "frac_bits": fp.frac_bits, "ring_bits": fp.ring_bits, "cohort": fp.cohort,
                    "update": update, "weight": weight, "rounding_seed": rounding.hex(),
                    "words": fp.encode(np.array(update), weight, rounding).tolist()})
    plans = [{"cohort": c, "clip": clip, "frac_bits": f,
              "planned": {k: v for k, v in FixedPoint.plan(c, clip, f).__dict__.items()
                          if k not in ("noise", "bound")}}
             for c, clip, f in [(1, 1.0, None), (100, 2.0, None), (10**5, 10.0, None), (50, 0.01, 30)]]
    return {"encodings": out, "plans": plans}


def round_scenario() -> dict:
    """One round's masking and unmasking over nested cohorts: devices with split 0 train blocks 0
    and 1, devices with split 1 train block 1; the device ``dropped`` shared its keys and sent no
    upload, so the server rebuilds its mask key and cancels its survivors' pair masks."""
    splits = {IDS[0]: 0, IDS[1]: 0, IDS[2]: 0, IDS[3]: 1, IDS[4]: 1}
    dropped = IDS[1]
    sizes = [6, 4]
    fp = FixedPoint.plan(len(IDS), 1.0)
    sk = {d: seed(f"mask key {d}") for d in IDS}
    pk = {d: public_key(sk[d]) for d in IDS}
    own = {d: seed(f"b {d}") for d in IDS}
    blocks = []
    for block, size in enumerate(sizes):
        cohort = [d for d in IDS if splits[d] <= block]
        survivors = [d for d in cohort if d != dropped]
        uploads, total = {}, np.zeros(size + 1, np.uint32)
        for d in cohort:
            update = dyadic(f"update {d} {block}", size, 200)
            weight = (1 + IDS.index(d)) / 8
            encoded = fp.encode(np.array(update), weight, seed(f"rounding {d} {block}"))
            pairs = {v: pair_mask_seed(agree(sk[d], pk[v]), SCOPE, block, d, v) for v in cohort if v != d}
            mask = combined_mask(size + 1, fp.ring_bits, d, self_seed=self_mask_seed(own[d], SCOPE, block, d),
                                 pair_seeds=pairs)
            masked = add_mod(encoded, mask, fp.ring_bits)
            uploads[d] = {"update": update, "weight": weight, "encoded": encoded.tolist(), "masked": masked.tolist()}
            if d != dropped:
                total = add_mod(total, masked, fp.ring_bits)
        self_seeds = {v: self_mask_seed(own[v], SCOPE, block, v) for v in survivors}
        lost = {dropped: {v: pair_mask_seed(agree(sk[dropped], pk[v]), SCOPE, block, dropped, v) for v in survivors}}
        unmasked = remove_masks(total, fp.ring_bits, self_seeds=self_seeds, dropped=lost if dropped in cohort else {})
        decoded = fp.decode(unmasked)
        blocks.append({"block": block, "size": size, "cohort": cohort, "survivors": survivors, "uploads": uploads,
                       "masked_sum": total.tolist(), "unmasked": unmasked.tolist(),
                       "decoded": {"values": decoded.values.tolist(), "weight": decoded.weight}})
    return {"fixed_point": {k: v for k, v in fp.__dict__.items() if k not in ("noise", "bound")}, "splits": splits, "dropped": dropped,
            "mask_private": {d: sk[d].hex() for d in IDS}, "self_seed": {d: own[d].hex() for d in IDS},
            "blocks": blocks}


def main() -> None:
    keys = x25519()
    vectors = {
        "about": "Secure-aggregation vectors of edge_sdk.secagg and edge_sdk_js/src/secagg; written by "
                 "tests/vectors/make_secagg_vectors.py. Hex for bytes; mask words are uint32.",
        "scope": {"session": SCOPE.session, "round": SCOPE.round},
        "labels": labels(), "x25519": keys, "hkdf": hkdf_cases(keys["agreements"]), "identity": identity(),
        "masks": masks(), "shamir": shamir(), "sealing": sealing(), "graph": graphs(), "fixed_point": fixed_point(),
        "round": round_scenario(),
    }
    OUT.write_text(json.dumps(vectors, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
