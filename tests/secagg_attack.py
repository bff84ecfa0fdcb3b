"""The attacker of secure aggregation that holds every message the server received (and sent): what
it can rebuild of the devices' updates (docs/security.md, "Block thresholds").

Two tests use it. ``tests/test_secagg_thresholds.py`` runs a round sans-I/O on the protocol's own
objects and hands :func:`rebuild_secrets` the shares the server got. ``edge_sdk_js/test/secagg-attack.test.mjs``
records, through a websocket relay in front of a real ``edgetrain serve --secure-aggregation``, every
frame Python, Node and tab devices exchanged with it, and runs ``python -m tests.secagg_attack
RECORDING ENCODINGS... --model M``: the frames are decoded with the SDK's codec (msgpack; nothing is
unpickled), each upload the server acked reassembled with its transfers and read with the server's
own masked-upload format, and the attack printed as JSON for the test to judge against the devices'
own quantized words (ENCODINGS: JSON lines the test's devices wrote as they encoded, never sent).

The attack works at the level of the protocol's secrets, so it holds whatever the words' packing:

1. For each device u of a round, every t_u-subset of all the 33-byte shares of u's secrets the
   server received (Shamir, Bonawitz et al. 2017, Round 4; t_u the graph's threshold the server told
   u), whatever they were labelled, is interpolated; a result is one of u's seeds b_u^k when it
   matches u's signed commitment to it (``seed_commitment``), u's mask key s_u^SK when its public
   key is u's advertised one.
2. For each block k and each subset S of the devices whose masked upload of k the server received,
   the attacker removes what it can: each member's self mask (needs b_u^k) and each pair mask
   between a member and a partner outside S (needs either one's s^SK; pairs inside S cancel), and
   compares the result with the sum over S of the members' own words of block k, modulo 2^b (the
   first :data:`HEAD` words and the weight word, the last). A sum it rebuilds is a sum it learnt.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np

from edge_sdk import protocol as p
from edge_sdk.secagg import (SHARE_BYTES, Scope, agree, expand_mask, pair_mask_seed, pairwise_sign, public_key,
                             seed_commitment, self_mask_seed)
from edge_sdk.secagg.exchange import BLOCKS_KEY
from edge_sdk.secagg.shamir import robust_combine

__all__ = ["HEAD", "Advertised", "Own", "attack_recording", "rebuild_secrets", "rebuilt", "subset_sums"]

#: The words of each block compared, besides the weight word: a block's first HEAD coordinates.
HEAD = 4096
#: What the attacker's codec takes: frames of any size the server's limits allow, uploads up to 1 GiB.
LIMITS = p.Limits(max_frame_bytes=16 << 20, max_message_bytes=64 << 20, max_transfer_bytes=1 << 30)


class Advertised(NamedTuple):
    """What a device's SecAggKeys told the server: its split, mask public key, seed commitments."""

    split: int
    mask_public: bytes
    commitments: bytes


class Own(NamedTuple):
    """A device's own quantized words of one block (before masking): its count of words (the weight
    word included), the first :data:`HEAD` and the weight word, in Z_{2^bits}."""

    count: int
    head: np.ndarray
    weight: int
    bits: int


def rebuilt(shares: Sequence[bytes], t: int) -> list[bytes]:
    """Every secret any ``t`` of ``shares`` (distinct x) interpolate to: the attacker tries them all."""
    found = []
    for subset in itertools.combinations(shares, t):
        if len({s[-1] for s in subset}) == t:
            found.append(robust_combine(list(subset), t, lambda _: True)[0])
    return found


def rebuild_secrets(advertised: Mapping[str, Advertised], shares: Mapping[str, Sequence[bytes]],
                    thresholds: Mapping[str, int],
                    scope: Scope) -> tuple[dict[tuple[str, int], bytes], dict[str, bytes]]:
    """(device, block) -> the seed b_u^k and device -> the mask key s_u^SK that some t_u of the shares
    of u the server received rebuild, each checked against what u advertised (step 1 above)."""
    seeds: dict[tuple[str, int], bytes] = {}
    keys: dict[str, bytes] = {}
    for u, adv in advertised.items():
        if u not in thresholds:
            continue
        commits = [adv.commitments[i:i + 32] for i in range(0, len(adv.commitments), 32)]
        for secret in rebuilt(list(shares.get(u, ())), thresholds[u]):
            for i, commit in enumerate(commits):
                if seed_commitment(secret, scope, adv.split + i, u) == commit:
                    seeds[(u, adv.split + i)] = secret
            if public_key(secret) == adv.mask_public:
                keys[u] = secret
    return seeds, keys


def _compared(count: int) -> np.ndarray:
    """The indices of a block of ``count`` words that are compared: its head and its weight word."""
    return np.unique(np.r_[np.arange(min(HEAD, count - 1)), count - 1])


@dataclass
class Seen:
    """One secure round as the server saw it: what each device sent and what it was told."""

    round: int
    scope: Scope | None = None
    num_blocks: int = 0
    splits: dict[str, int] = field(default_factory=dict)  # from the train instructions
    advertised: dict[str, Advertised] = field(default_factory=dict)
    thresholds: dict[str, int] = field(default_factory=dict)  # t_u, from each SecAggPeers
    t: int = 0  # the round's min_survivors
    ring_bits: int = 0
    members: list[str] = field(default_factory=list)
    shared: set[str] = field(default_factory=set)  # sent SecAggShares
    inbox: dict[str, set[str]] = field(default_factory=dict)  # device -> the senders of its inbox
    uploads: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)
    shares: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))  # owner -> every share
    asked: set[int] = field(default_factory=set)  # the blocks the unmasking named
    survivor_set: list[str] = field(default_factory=list)
    dropped: set[str] = field(default_factory=set)

    def partners(self, u: str, block: int) -> set[str]:
        """The devices whose pair mask u added to ``block``: its inbox's senders that trained it."""
        return {v for v in self.inbox.get(u, ()) if self.splits.get(v, self.num_blocks) <= block}


class _Connection:
    """One recorded connection, read in order: whose it is and the upload it is in."""

    def __init__(self, words: Callable[[bytes, int], dict[int, np.ndarray]]) -> None:
        self.device = ""
        self.reports: dict[str, p.Report] = {}
        self.incoming: tuple[p.IncomingTransfer, p.Report] | None = None
        self.uploaded: dict[int, bytes] = {}  # round -> the upload whose report the server has not acked yet
        self._words = words

    def received(self, msg: p.Message, rounds: dict[int, Seen]) -> None:
        """A message the server received on this connection."""
        if isinstance(msg, p.Hello):
            self.device = msg.device_id
        elif isinstance(msg, p.SecAggKeys):  # the server takes a device's first advertisement of a round
            seen = rounds[msg.round]
            adv = Advertised(seen.splits[self.device], msg.mask_public, msg.commitments)
            seen.advertised.setdefault(self.device, adv)
        elif isinstance(msg, p.SecAggShares):
            rounds[msg.round].shared.add(self.device)
        elif isinstance(msg, p.SecAggReveal):
            for v, data in [*msg.seed_shares.items(), *msg.key_shares.items()]:
                rounds[msg.round].shares[v] += [data[i:i + SHARE_BYTES] for i in range(0, len(data), SHARE_BYTES)]
        elif isinstance(msg, p.Report) and msg.phase == "train":
            self.reports[msg.transfer_id] = msg
        elif isinstance(msg, p.TransferBegin) and msg.transfer_id in self.reports:
            self.incoming = (p.IncomingTransfer(msg, LIMITS), self.reports[msg.transfer_id])
        elif isinstance(msg, (p.TransferFrame, p.TransferEnd)) and self.incoming is not None:
            self._upload(msg)

    def _upload(self, msg: p.TransferFrame | p.TransferEnd) -> None:
        incoming, report = self.incoming
        if isinstance(msg, p.TransferFrame):
            incoming.feed(msg)
        else:
            incoming.finish(msg)
        if incoming.finished:
            self.incoming = None
            self.uploaded[report.round] = incoming.result()

    def _acked(self, msg: p.Ack, rounds: dict[int, Seen]) -> None:
        """The server took (or refused) this device's train report of ``msg.round``: a secure round's
        upload it took is in its sums (its first; the server takes one a device and round)."""
        payload, seen = self.uploaded.pop(msg.round, None), rounds[msg.round]
        if msg.accepted and payload is not None and seen.scope is not None and self.device not in seen.uploads:
            seen.uploads[self.device] = self._words(payload, seen.splits[self.device])

    def sent(self, msg: p.Message, rounds: dict[int, Seen]) -> None:
        """A message the server sent on this connection."""
        if isinstance(msg, p.Instruction) and msg.phase == "train" and p.SECAGG_KEY in msg.config:
            seen = rounds[msg.round]
            seen.scope = Scope(str(msg.config[p.SECAGG_KEY]), msg.round)
            seen.num_blocks = len(str(msg.config[BLOCKS_KEY]).split(","))
            seen.splits[self.device] = msg.split
        elif isinstance(msg, p.SecAggPeers):
            seen = rounds[msg.round]
            seen.thresholds[self.device], seen.t, seen.ring_bits = msg.threshold, msg.min_survivors, msg.ring_bits
            seen.members = list(msg.members)
            for v, mask in msg.mask_keys.items():  # what the server took of each neighbour's advertisement
                seen.advertised[v] = Advertised(int(msg.splits[v]), mask, msg.commitments[v])
        elif isinstance(msg, p.Ack) and msg.phase == "train":
            self._acked(msg, rounds)
        elif isinstance(msg, p.SecAggInbox):
            rounds[msg.round].inbox[self.device] = set(msg.sealed)
        elif isinstance(msg, p.SecAggUnmask):
            seen = rounds[msg.round]
            seen.asked |= set(msg.blocks)
            seen.survivor_set = list(msg.survivor_set) or seen.survivor_set
            seen.dropped |= set(msg.dropped)


def masked_reader(model: str) -> Callable[[bytes, int], dict[int, np.ndarray]]:
    """(payload, split) -> block -> its masked words as the server reads them: the server's own
    masked-upload format (orchestrator.aggregation.secure.upload) over the run's model."""
    from edge_sdk.models.zoo import build_model
    from orchestrator.aggregation.secure.upload import MaskedUpload
    from orchestrator.config import ServerConfig

    upload = MaskedUpload(ServerConfig(), build_model(model), LIMITS)

    def words(payload: bytes, split: int) -> dict[int, np.ndarray]:
        work = SimpleNamespace(selection=SimpleNamespace(split=split))
        return dict(upload.words(work, upload.decode(payload)))
    return words


def read_recording(path: str, model: str) -> dict[int, Seen]:
    """The secure rounds of a relay's recording: a msgpack stream of ``[connection, to_server, frame]``."""
    import msgpack

    words = masked_reader(model)
    rounds = _Rounds()
    connections: dict[int, _Connection] = {}
    with open(path, "rb") as f:
        for conn, to_server, frame in msgpack.Unpacker(f, raw=False, max_buffer_size=1 << 30):
            c = connections.setdefault(conn, _Connection(words))
            msg = p.decode(frame, LIMITS)
            c.received(msg, rounds) if to_server else c.sent(msg, rounds)
    return {r: seen for r, seen in rounds.items() if seen.scope is not None}


class _Rounds(dict):
    """Round -> :class:`Seen`, made at its first message."""

    def __missing__(self, r: int) -> Seen:
        self[r] = Seen(r)
        return self[r]


def read_own(paths: Iterable[str]) -> dict[tuple[str, int, int], Own]:
    """(device, round, block) -> the device's own words, from the JSON lines its recorder wrote."""
    own = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)  # a device masks a block once a round: its first record
                    mine = Own(r["count"], np.array(r["head"], np.uint32), r["weight"], r["bits"])
                    own.setdefault((r["device"], r["round"], r["block"]), mine)
    return own


def subset_sums(seen: Seen, block: int, seeds: Mapping[tuple[str, int], bytes], keys: Mapping[str, bytes],
                own: Mapping[tuple[str, int, int], Own]) -> list[dict[str, object]]:
    """Step 2 above for ``block``: per non-empty subset S of its uploaders, whether the attacker
    could remove every mask that does not cancel within S (``computed``) and whether what it got
    is the sum of S's own words (``rebuilt``)."""
    uploaders = sorted(u for u, w in seen.uploads.items() if block in w)
    if not uploaders:
        return []
    bits, count = seen.ring_bits, seen.uploads[uploaders[0]][block].size
    at, ring = _compared(count), np.uint32((1 << bits) - 1)
    masks = _Masks(seen, block, count, bits, at, keys)
    out = []
    for size in range(1, len(uploaders) + 1):
        for members in itertools.combinations(uploaders, size):
            total = masks.unmasked(members, seeds)
            truth = _own_sum(own, [(u, seen.round, block) for u in members], count)
            found = total is not None and truth is not None and np.array_equal(total & ring, truth & ring)
            out.append({"devices": list(members), "computed": total is not None, "rebuilt": bool(found),
                        "own": truth is not None})
    return out


def _own_sum(own: Mapping[tuple[str, int, int], Own], which: Sequence[tuple[str, int, int]],
             count: int) -> np.ndarray | None:
    """The sum (uint32, wrapping) of the own words of ``which`` at the compared indices; None when a
    device did not record one of them (or recorded a block of another length)."""
    total = np.zeros(_compared(count).size, dtype=np.uint32)
    for key in which:
        o = own.get(key)
        if o is None or o.count != count:
            return None
        total += np.r_[o.head[:min(HEAD, count - 1)], np.uint32(o.weight)].astype(np.uint32)
    return total


class _Masks:
    """The masks of one block at the compared indices, expanded once each."""

    def __init__(self, seen: Seen, block: int, count: int, bits: int, at: np.ndarray, keys: Mapping[str, bytes]):
        self.seen, self.block, self.count, self.bits, self.at, self.keys = seen, block, count, bits, at, keys
        self._cache: dict[bytes, np.ndarray] = {}

    def _expand(self, seed: bytes) -> np.ndarray:
        if seed not in self._cache:
            self._cache[seed] = expand_mask(seed, self.count, self.bits)[self.at]
        return self._cache[seed]

    def _pair(self, u: str, v: str) -> bytes | None:
        adv = self.seen.advertised
        if u in self.keys:
            shared = agree(self.keys[u], adv[v].mask_public)
        elif v in self.keys:
            shared = agree(self.keys[v], adv[u].mask_public)
        else:
            return None
        return pair_mask_seed(shared, self.seen.scope, self.block, u, v)

    def unmasked(self, members: Sequence[str], seeds: Mapping[tuple[str, int], bytes]) -> np.ndarray | None:
        """The sum of ``members``' masked words without every mask that does not cancel among them,
        or None when a secret it needs was not rebuilt."""
        total = np.zeros(self.at.size, dtype=np.uint32)
        for u in members:
            total += self.seen.uploads[u][self.block][self.at]
            if (u, self.block) not in seeds:
                return None
            total -= self._expand(self_mask_seed(seeds[(u, self.block)], self.seen.scope, self.block, u))
            for v in self.seen.partners(u, self.block) - set(members):
                seed = self._pair(u, v)
                if seed is None:
                    return None
                mask = self._expand(seed)
                total = total + mask if pairwise_sign(u, v) < 0 else total - mask
        return total


def attack_round(seen: Seen, own: Mapping[tuple[str, int, int], Own]) -> dict[str, object]:
    """Everything the attacker rebuilt of one round, with what the round was."""
    seeds, keys = rebuild_secrets(seen.advertised, seen.shares, seen.thresholds, seen.scope)
    blocks = []
    for k in range(seen.num_blocks):
        trainers = [u for u in seen.members if seen.splits.get(u, seen.num_blocks) <= k]
        blocks.append({"block": k, "trainers": len(trainers), "uploaders": sorted(u for u, w in seen.uploads.items()
                                                                                 if k in w),
                       "revealed": k in seen.asked, "subsets": subset_sums(seen, k, seeds, keys, own)})
    return {"round": seen.round, "t": seen.t, "ring_bits": seen.ring_bits, "members": seen.members,
            "advertised": sorted(seen.advertised), "shared": sorted(seen.shared), "uploaded": sorted(seen.uploads),
            "splits": seen.splits, "survivor_set": seen.survivor_set, "dropped": sorted(seen.dropped),
            "asked": sorted(seen.asked), "seeds": sorted([u, k] for u, k in seeds), "keys": sorted(keys),
            "own": sorted(f"{u}/{k}" for u, r, k in own if r == seen.round), "blocks": blocks}


def attack_recording(recording: str, encodings: Sequence[str], model: str) -> dict[str, object]:
    """The attack on every secure round of ``recording`` (step 1 and 2 above)."""
    own = read_own(encodings)
    rounds = read_recording(recording, model)
    return {"head": HEAD, "rounds": [attack_round(rounds[r], own) for r in sorted(rounds)]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.secagg_attack", description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", help="the relay's recording: a msgpack stream of [connection, to_server, frame]")
    parser.add_argument("encodings", nargs="*", help="JSON lines of the devices' own words")
    parser.add_argument("--model", default="digits_mlp", help="the run's model (the masked upload's layout)")
    args = parser.parse_args(argv)
    json.dump(attack_recording(args.recording, args.encodings, args.model), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
