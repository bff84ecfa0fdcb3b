"""Write tests/vectors/secagg_round.json: one device's whole secure round, for both SDKs to reproduce.

Run from the repository root::

    .venv/bin/python tests/vectors/make_secagg_round_vectors.py

A device ("dev-émile") in a cohort of five trains blocks [1, 3) of three; its four neighbours
trained from blocks 0, 2, 1 and 1, and "N-zulu" sends no shares (it dropped out at the share stage),
so block 1 is masked with two partners and block 2 with three; "n-omega" then drops before its
upload, so block 1 has two survivors (below t = 3: not asked for) and block 2 three. Every input is
fixed here (credentials, X25519 keys, the self-mask seed b_u^k of each trained block, the update);
the survivors sign the survivor set (ConsistencyCheck: Ed25519 is deterministic, so the device's
``secagg_reveal`` with its consent is byte for byte); the update's values are multiples of 2^-15, so
stochastic rounding has nothing to round and the masked words are exact. Everything else is
computed by ``edge_sdk.secagg.round.DeviceRound``, and the server's messages are written as the
Python codec encodes them: the advertisement (``secagg_keys``, byte for byte), the masked words, and
the reveal of the neighbours' shares are deterministic. The device's own shares and the sealed
shares it sends are random by design (Shamir, AES-GCM nonces): the tests check them by opening and
combining (each neighbour's X25519 cipher key is in the file to open them).
tests/test_secagg_round_vectors.py and edge_sdk_js/test/secagg-round.test.mjs read the file.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edge_sdk import protocol as p  # noqa: E402
from edge_sdk.secagg import (FixedPoint, Scope, agree, default_degree, identity_public_key, neighbour_graph,  # noqa: E402
                             public_key, seal_shares, seed_commitment, share_key, sign_advertisement,
                             sign_survivors, split_secret)
from edge_sdk.secagg.keys import KeyPair  # noqa: E402
from edge_sdk.secagg.layout import block_vectors  # noqa: E402
from edge_sdk.secagg.round import DeviceRound  # noqa: E402

OUT = Path(__file__).resolve().parent / "secagg_round.json"
SCOPE = Scope("job-secure/attempt-0", 5)
DEVICE = "dev-émile"
#: neighbour -> (first block it trained, whether it sent shares)
NEIGHBOURS = {"n-alpha": (0, True), "n-\U0001F600": (2, True), "N-zulu": (1, False), "n-omega": (1, True)}
BLOCKS = ["b0", "b1", "b2"]
SPLIT, NUM_SAMPLES, WEIGHT_SCALE, CLIP, FRAC_BITS = 1, 32, 64.0, 4.0, 16


def fixed(tag: str) -> bytes:
    """A fixed 32-byte input named by ``tag``."""
    return hashlib.sha256(f"edgetrain secagg round vector {tag}".encode()).digest()


def secret(device: str) -> str:
    return f"credential-of-{device}"


def update() -> dict[str, np.ndarray]:
    """The device's deltas: multiples of 2^-15 (exact under the round's weight 1/2 and 2^16)."""
    rng = np.random.default_rng(38)
    shapes = {"blocks.b1.weight": (3, 2), "blocks.b1.bias": (3,), "blocks.b2.weight": (2, 3), "blocks.b2.bias": (2,)}
    return {n: (rng.integers(-2**14, 2**14, size=s) / 2**15).astype(np.float32) for n, s in shapes.items()}


def commitments(v: str) -> bytes:
    """Neighbour ``v``'s commitments to its fixed block seeds."""
    return b"".join(seed_commitment(fixed(f"{v}/b{b}"), SCOPE, b, v) for b in range(NEIGHBOURS[v][0], len(BLOCKS)))


def peers(members: list[str]) -> p.SecAggPeers:
    n = len(members)
    fp = FixedPoint.plan(n, CLIP, FRAC_BITS)
    graph = neighbour_graph(fixed("graph"), SCOPE, 0, members, default_degree(n))
    keys = {v: (public_key(fixed(f"{v}/c")), public_key(fixed(f"{v}/s"))) for v in NEIGHBOURS}
    t = max(3, graph.threshold[DEVICE])
    return p.SecAggPeers(
        SCOPE.round, fixed("graph"), default_degree(n), members, {v: k[0] for v, k in keys.items()},
        {v: k[1] for v, k in keys.items()},
        {v: sign_advertisement(secret(v), v, SCOPE, *keys[v], NEIGHBOURS[v][0], commitments(v)) for v in NEIGHBOURS},
        {v: identity_public_key(secret(v), v) for v in NEIGHBOURS}, {v: s for v, (s, _) in NEIGHBOURS.items()},
        CLIP, fp.frac_bits, fp.ring_bits, n, WEIGHT_SCALE, graph.threshold[DEVICE],
        commitments={v: commitments(v) for v in NEIGHBOURS}, min_survivors=t)


def inbox(device_cipher_public: bytes, threshold: int) -> tuple[p.SecAggInbox, dict[str, list]]:
    """The neighbours' sealed shares for the device, and the shares inside (hex: the seed shares of
    each block the neighbour trained, then its mask-key share)."""
    sealed, opened = {}, {}
    count = len(NEIGHBOURS) + 1
    for v, (split, sends) in NEIGHBOURS.items():
        if not sends:
            continue
        seed_shares = [split_secret(fixed(f"{v}/b{b}"), count, threshold)[1] for b in range(split, len(BLOCKS))]
        key_share = split_secret(fixed(f"{v}/s"), count, threshold)[1]
        key = share_key(agree(fixed(f"{v}/c"), device_cipher_public), SCOPE, v, DEVICE)
        sealed[v] = seal_shares(key, SCOPE, v, DEVICE, seed_shares, key_share)
        opened[v] = [[s.hex() for s in seed_shares], key_share.hex()]
    return p.SecAggInbox(SCOPE.round, sealed), opened


def main() -> None:
    members = sorted([DEVICE, *NEIGHBOURS], key=str.encode)
    rnd = DeviceRound(DEVICE, secret(DEVICE), SCOPE, SPLIT, len(BLOCKS))
    rnd._cipher = KeyPair(fixed("device/c"), public_key(fixed("device/c")))
    rnd._mask = KeyPair(fixed("device/s"), public_key(fixed("device/s")))
    rnd._seeds = {b: fixed(f"device/b{b}") for b in range(SPLIT, len(BLOCKS))}
    cipher, mask, signature, commits = rnd.advertise()
    relayed = peers(members)
    rnd.share(relayed)
    box, opened = inbox(cipher, relayed.threshold)
    rnd.receive(box.sealed)
    tensors = update()
    words = rnd.mask(block_vectors(tensors, BLOCKS, SPLIT), NUM_SAMPLES)
    survivors = sorted([DEVICE, "n-alpha", "n-\U0001F600"], key=str.encode)
    sign = p.SecAggUnmask(SCOPE.round, survivors, ["n-omega"], [2], survivors)  # ConsistencyCheck: sign the set
    consent = rnd.consent(sign.survivor_set)
    signatures = {v: sign_survivors(secret(v), v, SCOPE, survivors) for v in survivors if v != DEVICE}
    unmask = p.SecAggUnmask(SCOPE.round, survivors, ["n-omega"], [2], survivors, signatures)
    seeds, keys = rnd.reveal(unmask.survivors, unmask.dropped, unmask.blocks, unmask.survivor_set, unmask.signatures)
    vectors = {
        "scope": {"session": SCOPE.session, "round": SCOPE.round}, "device": DEVICE, "secret": secret(DEVICE),
        "split": SPLIT, "blocks": BLOCKS, "num_samples": NUM_SAMPLES,
        "secrets": {"cipher_private": fixed("device/c").hex(), "mask_private": fixed("device/s").hex(),
                    "seeds": [fixed(f"device/b{b}").hex() for b in range(SPLIT, len(BLOCKS))]},
        "identity_public": identity_public_key(secret(DEVICE), DEVICE).hex(),
        "neighbour_cipher_private": {v: fixed(f"{v}/c").hex() for v in NEIGHBOURS},
        "update": {n: {"shape": list(t.shape), "values": t.ravel().tolist()} for n, t in tensors.items()},
        "secagg_keys": p.encode(p.SecAggKeys(SCOPE.round, cipher, mask, signature, commits)).hex(),
        "secagg_peers": p.encode(relayed).hex(), "neighbours": list(rnd.neighbours),
        "secagg_inbox": p.encode(box).hex(), "opened": opened,
        "partners": {str(b): rnd.partners(b) for b in range(SPLIT, len(BLOCKS))},
        "masked": {str(b): w.tolist() for b, w in enumerate(words, start=SPLIT)},
        "secagg_unmask_sign": p.encode(sign).hex(), "consent": p.encode(p.SecAggReveal(SCOPE.round, {}, {}, consent)).hex(),
        "secagg_unmask": p.encode(unmask).hex(),
        "reveal": {"seed_shares": {v: s.hex() for v, s in seeds.items() if v != DEVICE},
                   "key_shares": {v: s.hex() for v, s in keys.items()}},
    }
    OUT.write_text(json.dumps(vectors, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
