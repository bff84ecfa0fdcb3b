"""One device's side of one secure round, sans-I/O (docs/protocol.md, "Secure aggregation").

The device's steps follow SecAgg+ (Bell et al. 2020, Algorithm 2, which runs Bonawitz et al.
2017's rounds on a neighbour graph), one method per step, each checking what the server relayed
before using it; the connection code (edge_sdk.roundwork) only carries the messages:

0. :meth:`DeviceRound.advertise` (AdvertiseKeys): two fresh X25519 key pairs, c_u (share
   encryption) and s_u (pairwise masks), a fresh self-mask seed b_u^k for each block k it trained
   with its commitment, all signed with the split by the identity key of the device's credential.
1. :meth:`DeviceRound.share` (ShareKeys): given the cohort, rebuild the neighbour graph from its
   public seed, verify each neighbour's signature (keys, split, commitments), refuse a round whose
   t is below the device's own, then split each b_u^k and s_u^SK into deg + 1 Shamir shares (t of
   which rebuild them; the device keeps one) and seal one set of shares for each neighbour.
2. :meth:`DeviceRound.receive` then :meth:`DeviceRound.mask` (MaskedInputCollection): open the
   shares the neighbours sent (those who did not are out of the round; a box that does not open
   is a peer's fault: the device keeps masking with that peer, whose keys it verified, but holds
   none of its shares, and says so at the unmasking), then for each block k it
   trained: clip, weight, quantize (edge_sdk.secagg.fixedpoint) and add the self mask of block k
   and the pairwise mask of block k with each neighbour that trained block k (split <= k) and sent
   shares. A device's masks on block k thus cancel over exactly block k's cohort. With distributed
   DP the device adds its discrete Gaussian share N_Z(0, sigma_k^2 / n_min_k) to block k's value
   words after quantizing and before masking (Kairouz, Liu, Steinke 2021, Algorithm 1, the client's
   lines "add discrete Gaussian noise" then "modular clip"; edge_sdk.dp); the weight word is not noised.
3. :meth:`DeviceRound.consent` then :meth:`DeviceRound.reveal` (ConsistencyCheck, then Unmasking:
   Bonawitz et al. 2017, Rounds 3 and 4): the device signs the survivor set the server names, and
   answers only a request that carries that same set signed by at least t devices (itself
   included), each signature verified against the signer's identity key; so a server that tells
   two devices different survivor sets gets no shares from either. Then the shares of b_v^k for the survivors v and the blocks k
   asked, of s_v^SK for the dropped, never both for one device and once per round (Bonawitz et
   al. 2017, Round 4); and only for blocks whose survivors, counted from the signed splits, reach
   t: no block of any device is unmasked in a sum of fewer than t devices, whatever the server asks.

A server that breaks the protocol (a neighbourhood that is not the graph's, a bad signature, a
share for someone else, a device both survivor and dropped, a block whose cohort leaves this
device alone or short of t) gets a :class:`~edge_sdk.secagg.SecAggError`: the device follows it no further.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from edge_sdk.dp import add_in_ring, noise_share

from .binding import sign_advertisement, sign_survivors, verify_advertisement, verify_survivors
from .fixedpoint import BlockEncoder, Compression, FixedPoint, l2_norm, slices
from .graph import neighbour_graph
from .keys import KEY_BYTES, agree, generate_keypair, pair_mask_seed, seed_commitment, self_mask_seed, share_key
from .labels import Scope, SecAggError
from .masks import MAX_WORDS, MaskStream, ring_mask
from .sealing import open_shares, seal_shares
from .shamir import split_secret

if TYPE_CHECKING:
    from edge_sdk.protocol import SecAggPeers

__all__ = ["DEFAULT_MIN_SURVIVORS", "DeviceRound", "weight_of"]

#: The fewest devices whose sum of a block a device lets be revealed, unless its settings say more:
#: a sum of two tells each of them the other's update.
DEFAULT_MIN_SURVIVORS = 3


def weight_of(num_samples: int, weight_scale: float) -> float:
    """A device's aggregation weight: its sample count over the round's public scale, at most 1."""
    return min(1.0, max(0, num_samples) / weight_scale)


class DeviceRound:
    """Device ``device_id``'s state in one secure round of ``scope``; it trained blocks ``[split, num_blocks)``."""

    def __init__(self, device_id: str, secret: str, scope: Scope, split: int, num_blocks: int, *,
                 min_survivors: int = DEFAULT_MIN_SURVIVORS) -> None:
        if not 0 <= split < num_blocks:
            raise SecAggError(f"a secure round's device trains some block: split {split} of {num_blocks}")
        self.device_id, self.scope, self.split, self.num_blocks = device_id, scope, split, num_blocks
        self._secret = secret
        self._cipher, self._mask = generate_keypair(), generate_keypair()
        self._seeds = {b: os.urandom(KEY_BYTES) for b in range(split, num_blocks)}  # b_u^k, one per trained block
        self.min_survivors = min_survivors  # the device's own t; the round's may be higher
        self.unopened: dict[str, str] = {}  # neighbour -> why its sealed shares did not open
        self.step = "advertise"
        self.neighbours: tuple[str, ...] = ()
        self.splits: dict[str, int] = {}
        self.fixed: FixedPoint | None = None
        self.compression: Compression | None = None  # a compressed round's (edge_sdk.secagg.fixedpoint)
        self.weight_scale = 1.0
        self.weight = -1.0
        self.threshold = 2
        self.noise: dict[int, tuple[float, int]] = {}  # block -> (sigma_b in ring units, n_min_b)
        self._share_keys: dict[str, bytes] = {}
        self._pair_secrets: dict[str, bytes] = {}  # neighbour -> s agreement
        self._own: tuple[list[bytes], bytes] | None = None  # the shares of each b_u^k and s_u^SK the device keeps
        self._held: dict[str, tuple[list[bytes], bytes]] = {}  # neighbour -> its shares for this device
        self._sent: set[str] = set()  # the neighbours that sent shares (opened or not)
        self._members: frozenset[str] = frozenset()  # the key cohort U_0
        self._identities: dict[str, bytes] = {}  # neighbour -> its identity public key
        self._signed: tuple[str, ...] | None = None  # the survivor set this device signed

    def _expect(self, step: str, then: str) -> None:
        if self.step != step:
            raise SecAggError(f"{self.device_id}: the secure round is at {self.step!r}, not {step!r}")
        self.step = then

    # -- 0: AdvertiseKeys ------------------------------------------------------------------------
    def commitments(self) -> bytes:
        """The commitment to each trained block's seed b_u^k, in block order (32 bytes each)."""
        return b"".join(seed_commitment(self._seeds[b], self.scope, b, self.device_id) for b in sorted(self._seeds))

    def advertise(self) -> tuple[bytes, bytes, bytes, bytes]:
        """(c_u^PK, s_u^PK, signature, commitments) for ``SecAggKeys``."""
        self._expect("advertise", "share")
        commitments = self.commitments()
        signature = sign_advertisement(self._secret, self.device_id, self.scope, self._cipher.public,
                                       self._mask.public, self.split, commitments)
        return self._cipher.public, self._mask.public, signature, commitments

    # -- 1: ShareKeys ----------------------------------------------------------------------------
    def share(self, peers: SecAggPeers) -> dict[str, bytes]:
        """Check the cohort the server relayed and seal this device's shares for each neighbour."""
        self._expect("share", "receive")
        me = self.device_id
        if me not in peers.members:
            raise SecAggError(f"{me}: the cohort relayed does not hold this device")
        graph = neighbour_graph(peers.graph_seed, self.scope, 0, peers.members, peers.degree)
        self.neighbours = graph.neighbours[me]
        named = set(self.neighbours)
        for field in ("cipher_keys", "mask_keys", "signatures", "identities", "splits", "commitments"):
            if set(getattr(peers, field)) != named:
                raise SecAggError(f"{me}: the server's {field} are not exactly this device's neighbours")
        if peers.threshold != graph.threshold[me] or peers.cohort < len(peers.members):
            raise SecAggError(f"{me}: threshold {peers.threshold} or cohort {peers.cohort} is not the graph's")
        if peers.min_survivors < self.min_survivors:
            raise SecAggError(f"{me}: the round reveals sums of {peers.min_survivors} devices, fewer than this "
                              f"device's {self.min_survivors}")
        self.threshold, self.min_survivors = peers.threshold, peers.min_survivors
        self._members, self._identities = frozenset(peers.members), dict(peers.identities)
        self.noise = self._noise(peers)
        summed = max((sigma * (peers.cohort / n) ** 0.5 for sigma, n in self.noise.values()), default=0.0)
        self.compression = self._compression(peers)
        if self.compression is None:
            self.fixed = FixedPoint(float(peers.clip), peers.frac_bits, peers.ring_bits, peers.cohort,
                                    summed * 2.0**-peers.frac_bits)  # refuses a ring with no room for the noise
        else:
            self.fixed = self.compression.fixed(peers.cohort, float(peers.clip), 1)
        self.weight_scale = float(peers.weight_scale)
        self.weight = float(peers.weight)  # the server's w for this device (-1: a server that predates it)
        for v in self.neighbours:
            split = peers.splits[v]
            if type(split) is not int or not 0 <= split < self.num_blocks \
                    or len(peers.commitments[v]) != KEY_BYTES * (self.num_blocks - split):
                raise SecAggError(f"{me}: neighbour {v!r} has split {split!r} or commitments for other blocks")
            verify_advertisement(peers.identities[v], v, self.scope, peers.cipher_keys[v], peers.mask_keys[v],
                                 split, peers.commitments[v], peers.signatures[v])
            self.splits[v] = split
            self._share_keys[v] = share_key(agree(self._cipher.private, peers.cipher_keys[v]), self.scope, me, v)
            self._pair_secrets[v] = agree(self._mask.private, peers.mask_keys[v])
        count, t = len(self.neighbours) + 1, peers.threshold
        seeds = [split_secret(self._seeds[b], count, t) for b in sorted(self._seeds)]
        keys = split_secret(self._mask.private, count, t)
        self._own = ([block[0] for block in seeds], keys[0])
        return {v: seal_shares(self._share_keys[v], self.scope, me, v, [block[i + 1] for block in seeds], keys[i + 1])
                for i, v in enumerate(self.neighbours)}

    def _compression(self, peers: SecAggPeers) -> Compression | None:
        """A compressed round's quantisation (``value_bits`` > 0), refused with distributed noise (its
        ring holds no noise tail) or with a ring that is not the one its cohort needs."""
        if not peers.value_bits:
            return None
        compression = Compression(peers.value_bits, float(peers.value_spread))
        if self.noise:
            raise SecAggError(f"{self.device_id}: a compressed round with distributed noise (its ring has no "
                              "room for the noise)")
        if peers.ring_bits != compression.ring_bits(peers.cohort):
            raise SecAggError(f"{self.device_id}: a ring of {peers.ring_bits} bits for {peers.cohort} devices' "
                              f"{peers.value_bits}-bit values, which need {compression.ring_bits(peers.cohort)}")
        return compression

    def fixed_for(self, count: int) -> FixedPoint:
        """The fixed point of a block of ``count`` coordinates: the round's, or a compressed round's
        for that block's size."""
        fixed = self.fixed
        assert fixed is not None
        if self.compression is None:
            return fixed
        return self.compression.fixed(fixed.cohort, fixed.clip, count)

    def _noise(self, peers: SecAggPeers) -> dict[int, tuple[float, int]]:
        """Each trained block's (sigma_b, n_min_b): every trained block or none is noised (a block
        left without noise under distributed DP would be released bare)."""
        noise = {int(b): (float(peers.noise_sigma[b]), int(peers.noise_survivors[b])) for b in peers.noise_sigma}
        trained = set(range(self.split, self.num_blocks))
        if noise and not trained <= set(noise):
            raise SecAggError(f"{self.device_id}: distributed noise for blocks {sorted(noise)}, "
                              f"not every block it trained {sorted(trained)}")
        if any(n > peers.cohort for _, n in noise.values()):
            raise SecAggError(f"{self.device_id}: noise sized for more survivors than the cohort {peers.cohort}")
        return noise

    # -- 2: MaskedInputCollection ----------------------------------------------------------------
    def receive(self, sealed: Mapping[str, bytes]) -> None:
        """Open the shares the neighbours sent (sender -> sealed); those who sent none are out. Shares
        that do not open are the sender's doing (or the relay's): noted in :attr:`unopened`, never a
        reason to leave; the device still masks with that sender (their pairwise masks need no shares)."""
        self._expect("receive", "mask")
        for v, box in sealed.items():
            if v not in self._share_keys:
                raise SecAggError(f"{self.device_id}: shares from {v!r}, who is not a neighbour")
            self._sent.add(v)
            try:
                self._held[v] = open_shares(self._share_keys[v], self.scope, v, self.device_id, box,
                                            self.num_blocks - self.splits[v])
            except SecAggError as exc:
                self.unopened[v] = str(exc)

    def partners(self, block: int) -> list[str]:
        """The neighbours this device masks block ``block`` with: they trained it and sent shares."""
        return [v for v in self.neighbours if v in self._sent and self.splits[v] <= block]

    def mask(self, blocks: Sequence[np.ndarray | Sequence[np.ndarray]], num_samples: int) -> list[np.ndarray]:
        """The masked words of each trained block, the weight coordinate last in each
        (edge_sdk.secagg.fixedpoint). ``blocks[i]`` is block ``split + i``'s flat float values: one
        array, or the arrays whose concatenation is its vector (edge_sdk.secagg.layout.block_parts).

        A block is encoded, noised and masked a slice at a time (:data:`~edge_sdk.secagg.fixedpoint.SLICE_WORDS`
        coordinates) straight into its masked words, so the round holds the update, its masked words
        and one slice's temporaries, never a whole block's float64 copy or a mask per neighbour
        (planned: profiles.accounting.TrainingMemory.secured)."""
        self._expect("mask", "reveal")
        fixed = self.fixed
        assert fixed is not None
        if len(blocks) != self.num_blocks - self.split:
            raise SecAggError(f"{self.device_id}: {len(blocks)} blocks to mask, trained "
                              f"{self.num_blocks - self.split}")
        # The server's weight, fixed from the samples registered for this device (docs/security.md,
        # "Secure groups"); the device's own count only for a server that sends none.
        weight = self.weight if self.weight >= 0 else weight_of(num_samples, self.weight_scale)
        return [self._mask_block(block, [values] if isinstance(values, np.ndarray) else list(values), weight)
                for block, values in enumerate(blocks, start=self.split)]

    def _mask_block(self, block: int, parts: list[np.ndarray], weight: float) -> np.ndarray:
        partners = self.partners(block)
        if not partners:  # alone, its block would be unmasked with its self mask: refuse
            raise SecAggError(f"{self.device_id}: no neighbour of block {block}'s cohort sent shares")
        count = sum(np.asarray(part).size for part in parts)
        if not 1 <= count + 1 <= MAX_WORDS or (self.compression is not None and count < 1):
            raise SecAggError(f"a block has at most {MAX_WORDS - 1} coordinates (and some, in a compressed round)")
        fixed = self.fixed_for(count)
        encoder = BlockEncoder(fixed, l2_norm(slices(parts)), weight)
        seeds = {v: pair_mask_seed(self._pair_secrets[v], self.scope, block, self.device_id, v) for v in partners}
        masks = MaskStream(fixed.ring_bits, self.device_id,
                           self_seed=self_mask_seed(self._seeds[block], self.scope, block, self.device_id), pair_seeds=seeds)
        noise = self.noise.get(block)
        ring = np.uint32(ring_mask(fixed.ring_bits))
        out = np.empty(count + 1, dtype=np.uint32)
        at = 0
        for piece in [*slices(parts), None]:
            words = encoder.weight_word() if piece is None else encoder.values(piece)
            if noise is not None and piece is not None:  # the weight word is not noised
                words = add_in_ring(words, noise_share(words.size, *noise), fixed.ring_bits).astype(np.uint32)
            words += masks.read(words.size)
            words &= ring
            out[at:at + words.size] = words
            at += words.size
        return out

    # -- 3: Unmasking ----------------------------------------------------------------------------
    def consent(self, survivor_set: Sequence[str]) -> bytes:
        """The device's signature on the survivor set (ConsistencyCheck), once: the set must hold this
        device and only devices of the key cohort."""
        if self.step != "reveal" or self._signed is not None:
            raise SecAggError(f"{self.device_id}: a survivor set to sign at step {self.step!r}, or a second one")
        ids = tuple(sorted(survivor_set, key=str.encode))
        if self.device_id not in ids or not set(ids) <= self._members:
            raise SecAggError(f"{self.device_id}: a survivor set without this device, or with devices outside the cohort")
        self._signed = ids
        return sign_survivors(self._secret, self.device_id, self.scope, list(ids))

    def _consistent(self, survivors: Sequence[str], dropped: Sequence[str], survivor_set: Sequence[str],
                    signatures: Mapping[str, bytes]) -> None:
        """The request is about the set this device signed, at least t devices signed it (each
        signature verified), and its survivors and dropped are that set's, as this device sees it."""
        me = self.device_id
        if self._signed is None or tuple(sorted(survivor_set, key=str.encode)) != self._signed:
            raise SecAggError(f"{me}: an unmasking request for a survivor set this device did not sign")
        signers = {me}
        for v, signature in signatures.items():
            if v == me:
                continue
            if v not in self._identities or v not in self._signed:
                raise SecAggError(f"{me}: a signature of {v!r}, not a surviving neighbour")
            verify_survivors(self._identities[v], v, self.scope, list(self._signed), signature)
            signers.add(v)
        if len(signers) < self.min_survivors:
            raise SecAggError(f"{me}: {len(signers)} devices signed the survivor set, fewer than t = {self.min_survivors}")
        if set(survivors) != set(self._signed) & (self._sent | {me}) or set(dropped) & set(self._signed):
            raise SecAggError(f"{me}: survivors or dropped that are not the signed survivor set's")

    def reveal(self, survivors: Sequence[str], dropped: Sequence[str], blocks: Sequence[int],
               survivor_set: Sequence[str] = (), signatures: Mapping[str, bytes] | None = None,
               ) -> tuple[dict[str, bytes], dict[str, bytes]]:
        """(seed shares of the survivors, key shares of the dropped), once, after :meth:`consent`:
        ``survivor_set`` must be the set the device signed and ``signatures`` those of at least t
        devices on it (:meth:`_consistent`). The survivors name this
        device; every other id must be a neighbour that sent it shares. ``blocks``: those the server
        unmasks; a survivor's answer is its shares of b_v^k for each of them it trained (33 bytes
        each, in block order). Refused unless each of those blocks has at least t survivors by the
        signed splits, so no sum of fewer than t devices is ever unmasked (docs/security.md, "Block
        thresholds"); and no device's two secrets are revealed together. A peer whose shares did not
        open is left out of the answer."""
        self._expect("reveal", "done")
        self._consistent(survivors, dropped, survivor_set, signatures or {})
        alive, gone, me = set(survivors), set(dropped), self.device_id
        if alive & gone:
            raise SecAggError(f"{me}: asked to reveal both secrets of {sorted(alive & gone)[:3]}")
        if me not in alive or me in gone:
            raise SecAggError(f"{me}: an unmasking request that does not count this device alive")
        unknown = (alive | gone) - self._sent - {me}
        if unknown:
            raise SecAggError(f"{me}: asked for shares of {sorted(unknown)[:3]}, which it was not given")
        splits = {**self.splits, me: self.split}
        for b in blocks:
            count = sum(splits[v] <= b for v in alive)
            if not 0 <= b < self.num_blocks or count < self.min_survivors:
                raise SecAggError(f"{me}: block {b} would be unmasked with {count} survivors, fewer than "
                                  f"t = {self.min_survivors}")
        assert self._own is not None
        held = {**self._held, me: self._own}
        seeds = {v: b"".join(held[v][0][b - splits[v]] for b in sorted(blocks) if b >= splits[v])
                 for v in sorted(alive) if v in held}
        return ({v: s for v, s in seeds.items() if s},
                {v: held[v][1] for v in sorted(gone) if v in held})
