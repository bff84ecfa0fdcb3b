"""The server's side of one secure round, sans-I/O: what it relays, what it checks, what it learns.

Stages (SecAgg+: Bell et al. 2020, Algorithm 2; the rounds of Bonawitz et al. 2017), each a member
of :class:`SecureStage` that only the round's own methods move on (as websockets' ``State`` and the
protocol's ``SessionState``), each closed by its driver (:mod:`orchestrator.aggregation.secure.stages`)
when every device it awaits has answered or its time is up:

0. keys: :meth:`SecureRound.advertise` takes each device's two public keys with their signature
   (verified against the roster's identity key: a replayed or forged advertisement is refused);
   :meth:`SecureRound.close_keys` fixes the cohort U_0, the neighbour graph (public seed) and the
   fixed point, leaving out a device whose first block's cohort would have it alone. The driver
   passes in what depends on the advertised cohort: the scale of the devices' weights, and the
   noise the devices add (:class:`NoisePlan`, distributed DP); nothing is written into the round.
1. shares: :meth:`SecureRound.take_shares` takes each device's sealed shares, one per neighbour,
   unopened; :meth:`SecureRound.close_shares` fixes U_1 (those who shared) and routes each device
   the shares addressed to it.
2. masked uploads: :meth:`SecureRound.take_masked` adds a device's masked words to each block's
   running sum (memory: the model, not devices x model); a device not in U_1, or presumed dropped,
   is refused.
3. unmasking: :meth:`SecureRound.close_uploads` fixes U_2 (those who uploaded), picks the blocks
   whose surviving cohort reaches t and asks each survivor for its neighbours' shares of those
   blocks' seeds alone (a device has one seed per trained block, so a block left hidden stays
   hidden whatever else is revealed); :meth:`SecureRound.take_reveal` checks an answer names at
   most whom it was asked about (a peer whose sealed shares did not open for it is left out);
   :meth:`SecureRound.finish` rebuilds the survivors' block seeds and the dropped devices' mask
   keys, each checked against what its owner signed (the seed commitment, the mask public key):
   from the shares it has, a subset of t that rebuilds the committed secret is searched, and every
   share off that polynomial names its sender (:attr:`SecureRound.blamed`), whose other shares are
   then set aside; it then removes the masks from each block's sum.

Block k's cohort is the devices of U_2 with split <= k. The round's t (:attr:`SecureRound.t`, a
majority of a neighbourhood as SecAgg+ picks its secret threshold, at least 3, or ``min_survivors``
where that is higher) bounds what is revealed: a block with fewer than t trainers among the cohort
that advertised keys is not trained securely this round (:attr:`SecureRound.unsecured`: it keeps its
value), and one with fewer than t survivors, or a secret that fewer than t good shares reached, is
not revealed (:class:`BlockOutcome` says why). The devices check the same bound before they answer
(edge_sdk.secagg.round). The server learns each revealed block's sum of weighted, clipped updates
and the sum of the weights, nothing of one device's.

Distributed DP (Kairouz, Liu, Steinke 2021, Algorithm 1): with a :class:`NoisePlan` of multiplier z_b
and ``survivors`` (block -> n_min_b) every device adds N_Z(0, sigma_b^2 / n_min_b) to block b's
value words, sigma_b = z_b C 2^f (ring units), so any n_min_b survivors' shares reach sigma_b.
The ring is sized for the cohort's summed noise too (edge_sdk.secagg.fixedpoint). A block with
s_b < n_min_b survivors is not revealed (its noise would fall short of sigma_b); a revealed one
carries the multiplier its survivors' shares give, z_b sqrt(s_b / n_min_b) (:attr:`BlockOutcome.multiplier`),
which is what the ledger accounts. The plan's ``expected`` (block -> n_exp_b >= n_min_b) sizes the shares
for the survivors a run expects instead: each device adds N_Z(0, sigma_b^2 / n_exp_b) (the message's
sigma is scaled by sqrt(n_min_b / n_exp_b)), so n_exp_b survivors reach z_b exactly and a block
revealed with s_b survivors carries z_b sqrt(s_b / n_exp_b), below z_b where fewer survive than
expected (the ledger accounts what was released; n_min_b still withholds a block below it).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from edge_sdk.secagg import (KEY_BYTES, SHARE_BYTES, FixedPoint, Graph, Scope, SecAggError, agree, neighbour_graph,
                             pair_mask_seed, public_key, remove_masks, seed_commitment, self_mask_seed,
                             verify_advertisement, verify_survivors)
from edge_sdk.secagg.fixedpoint import Compression, unpack_words
from edge_sdk.secagg.graph import default_degree
from edge_sdk.secagg.shamir import robust_combine

__all__ = ["BlockOutcome", "NoisePlan", "SecureRefusal", "SecureRound", "SecureStage", "block_fixed", "block_words", "default_threshold",
           "plan_fixed"]

#: Below this many survivors no block sum is revealed, whatever the cohort: a sum of two tells each the other's.
LEAST_THRESHOLD = 3


def default_threshold(graph: Graph) -> int:
    """The round's t: SecAgg+'s secret threshold of the graph (a majority of a neighbourhood,
    floor((deg + 1) / 2) + 1, edge_sdk.secagg.graph; the smallest over the cohort), at least
    :data:`LEAST_THRESHOLD`. A sum of fewer survivors than the shares needed to rebuild one secret is
    never revealed, so a coalition that could rebuild a secret could not also learn a smaller sum."""
    return max(LEAST_THRESHOLD, min(graph.threshold.values()))


class SecureStage(enum.Enum):
    """Where a secure round is; it moves on only by the round's own methods, in this order."""

    KEYS = "keys"  # taking key advertisements; close_keys ->
    SHARES = "shares"  # taking sealed shares; close_shares ->
    MASKED = "masked"  # taking masked uploads; close_uploads ->
    UNMASK = "unmask"  # taking the survivors' shares of secrets; finish ->
    DONE = "done"  # the block sums are out (finish may close the round from any stage)


class SecureRefusal(SecAggError):
    """A device's message breaks the secure round: it is refused (an error frame, journaled)."""


@dataclass
class BlockOutcome:
    """One block's result: the decoded sum (``values``: sum of w_i x_i, ``weight``: sum of w_i),
    or why it was not revealed; ``cohort``: how many uploads it summed; ``recovered``: dropped
    devices whose masks were removed."""

    block: int
    cohort: int
    values: np.ndarray | None = None
    weight: float = 0.0
    reason: str = ""
    recovered: list[str] = field(default_factory=list)
    multiplier: float = 0.0  # distributed DP: the noise standard deviation of the sum over its clip
    group: int = 0  # the secure group whose sum it is (orchestrator.aggregation.secure.groups)


@dataclass(frozen=True)
class NoisePlan:
    """The discrete Gaussian noise the devices of a secure round add (distributed DP), fixed when the
    key stage closes from the cohort that advertised: the multiplier z_b of every noised block,
    ``survivors`` (block -> n_min_b, the fewest survivors whose shares reach sigma_b = z_b C 2^f) and
    ``expected`` (block -> n_exp_b >= n_min_b, the survivors the shares are sized for; n_min_b where
    absent). The empty plan: no noise."""

    multiplier: float = 0.0
    survivors: Mapping[int, int] = field(default_factory=dict)
    expected: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.multiplier > 0) != bool(self.survivors) or any(n < 1 for n in self.survivors.values()):
            raise SecAggError("distributed noise needs a multiplier > 0 and each block's n_min >= 1, or neither")
        if any(b not in self.survivors or n < self.survivors[b] for b, n in self.expected.items()):
            raise SecAggError("a block's expected survivors must be at least its n_min, for a block with noise")

    def sized_for(self, b: int, cohort: int) -> tuple[int, int]:
        """Block ``b``'s (n_min_b, n_exp_b) in a cohort of ``cohort`` members (neither above it)."""
        n_min = min(self.survivors[b], cohort)
        return n_min, max(n_min, min(self.expected.get(b, n_min), cohort))

    def summed(self, clip: float, cohort: int) -> float:
        """The largest block's noise standard deviation (update units) if all ``cohort`` devices add a share."""
        return max((self.multiplier * clip * (cohort / max(1, self.sized_for(b, cohort)[1])) ** 0.5
                    for b in self.survivors), default=0.0)

    def fields(self, fixed: FixedPoint) -> dict[str, object]:
        """Each block's sigma and n_min as the devices take them (``SecAggPeers``): a share of variance
        sigma^2 / n_min, which with sigma = z_b C 2^f sqrt(n_min_b / n_exp_b) is (z_b C 2^f)^2 / n_exp_b."""
        if not self.survivors:
            return {}
        sigma = self.multiplier * fixed.clip * 2.0**fixed.frac_bits
        sized = {b: self.sized_for(b, fixed.cohort) for b in self.survivors}
        return {"noise_sigma": {str(b): sigma * (n_min / n_exp) ** 0.5 for b, (n_min, n_exp) in sized.items()},
                "noise_survivors": {str(b): n_min for b, (n_min, _) in sized.items()}}


class Revealed:
    """The shares the unmasking answers brought, by whose secret and from whom, and the secrets they
    rebuild (each once), checked against what its owner signed: a seed against its commitment, a mask
    key against its public key. Shares of a holder already blamed are set aside; a share off the
    committed polynomial blames its holder (:attr:`blamed`)."""

    def __init__(self, scope: Scope, keys: Mapping[str, _Device]) -> None:
        self.scope, self.keys = scope, keys
        self.seeds: dict[tuple[str, int], list[tuple[str, bytes]]] = {}  # (owner, block) -> (holder, share)
        self.masks: dict[str, list[tuple[str, bytes]]] = {}  # owner -> (holder, share)
        self.blamed: dict[str, str] = {}  # holder -> the wrong share it sent
        self._cache: dict[tuple[str, int], bytes | str] = {}

    def _check(self, device: str, block: int) -> Callable[[bytes], bool]:
        if block < 0:
            return lambda s: public_key(s) == self.keys[device].mask
        at = block - self.keys[device].split
        want = self.keys[device].commitments[at * KEY_BYTES:(at + 1) * KEY_BYTES]
        return lambda s: seed_commitment(s, self.scope, block, device) == want

    def rebuild(self, device: str, block: int, graph: Graph) -> bytes | str:
        """The secret of ``device`` (its seed of ``block``; block -1: its mask key), or why not."""
        if (device, block) not in self._cache:
            got = self.seeds.get((device, block), []) if block >= 0 else self.masks.get(device, [])
            got = [(holder, share) for holder, share in got if holder not in self.blamed]
            t = graph.threshold[device]
            what = f"{device!r}'s seed of block {block}" if block >= 0 else f"{device!r}'s mask key"
            try:
                secret, wrong = robust_combine([share for _, share in got], t, self._check(device, block))
            except SecAggError as exc:
                self._cache[device, block] = f"{what}: {len(got)} good shares reached the server, {t} needed ({exc})"
            else:
                for i in wrong:
                    self.blamed.setdefault(got[i][0], f"sent a wrong share of {what}")
                self._cache[device, block] = secret
        return self._cache[device, block]


def plan_fixed(cohort: int, clip: float, noise: NoisePlan, compression: Compression | None
               ) -> tuple[FixedPoint, Compression | None]:
    """The round's fixed point for ``cohort`` members: the 32-bit ring with room for the noise, or a
    compressed round's (its q lowered where the cohort's sum would not fit 32-bit words; refused with
    distributed noise, for which its ring has no room)."""
    if compression is None:
        return FixedPoint.plan(cohort, clip, noise=noise.summed(clip, cohort)), None
    if noise.survivors:
        raise SecAggError("a compressed secure round cannot carry distributed noise: its ring has no room for it")
    compression = compression.fitting(cohort)
    return compression.fixed(cohort, clip, 1), compression


def block_fixed(fixed: FixedPoint | None, compression: Compression | None, size: int) -> FixedPoint:
    """The fixed point of a block of ``size`` coordinates: the round's, or a compressed round's for that size."""
    assert fixed is not None
    return fixed if compression is None else compression.fixed(fixed.cohort, fixed.clip, size)


def block_words(device: str, b: int, words: np.ndarray, fixed: FixedPoint, size: int) -> np.ndarray:
    """One block of a masked upload as ring words, checked: ``size`` + 1 words of Z_{2^b}; a compressed
    round's unpacked first (exactly the packed length, uint8, its padding bits zero)."""
    if fixed.packed:
        try:
            words = unpack_words(words, size + 1, fixed.ring_bits)
        except SecAggError as exc:
            raise SecureRefusal(f"{device!r}'s block {b}: {exc}") from None
    if words.dtype != np.uint32 or words.shape != (size + 1,):
        raise SecureRefusal(f"{device!r}'s block {b} is not {size + 1} ring words")
    if fixed.ring_bits < 32 and int(words.max(initial=0)) >> fixed.ring_bits:
        raise SecureRefusal(f"{device!r}'s block {b} holds words outside Z_2^{fixed.ring_bits}")
    return words


@dataclass
class _Device:
    split: int
    cipher: bytes
    mask: bytes
    signature: bytes
    commitments: bytes  # 32 bytes per trained block, in block order


class SecureRound:
    """One round's secure aggregation over ``num_blocks`` blocks, in ``scope``."""

    def __init__(self, scope: Scope, num_blocks: int, sizes: Mapping[int, int], *, clip: float,
                 identities: Mapping[str, bytes], degree: int = 0, min_survivors: int = 0,
                 compression: Compression | None = None) -> None:
        self.scope, self.num_blocks, self.sizes = scope, num_blocks, dict(sizes)  # block -> coordinates
        self.clip, self.identities = clip, identities
        self.degree, self.min_survivors, self.compression = degree, min_survivors, compression  # compression: q, k
        self.weight_scale = 1.0  # fixed by close_keys
        self.noise = NoisePlan()  # fixed by close_keys
        self.graph_seed = os.urandom(KEY_BYTES)
        self.keys: dict[str, _Device] = {}
        self.left_out: dict[str, str] = {}  # device -> why it is not in the cohort
        self.graph: Graph | None = None
        self.fixed: FixedPoint | None = None
        self.shared: dict[str, dict[str, bytes]] = {}  # U_1: sender -> receiver -> sealed
        self.masked: set[str] = set()  # U_2
        self.sums: dict[int, np.ndarray] = {}
        self.t = LEAST_THRESHOLD  # fixed by close_keys
        self.unsecured: dict[int, str] = {}  # block -> why it is not trained securely this round
        self.revealing: list[int] = []  # the blocks whose seeds the unmasking asks for
        self.asked: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
        self.book = Revealed(scope, self.keys)  # the unmasking answers' shares and what they rebuild
        self.seed_shares, self.key_shares, self.blamed = self.book.seeds, self.book.masks, self.book.blamed
        self.unopened: dict[str, list[str]] = {}  # holder -> peers whose sealed shares did not open for it
        self.consents: dict[str, bytes] = {}  # survivor -> its signature on the survivor set
        self._stage = SecureStage.KEYS

    @property
    def stage(self) -> SecureStage:
        """Where the round is (:class:`SecureStage`): read by its driver, moved on by its own methods only."""
        return self._stage

    def _at(self, stage: SecureStage, device: str, what: str) -> None:
        if self._stage is not stage:
            raise SecureRefusal(f"{what} from {device!r} in stage {self._stage.value!r} of the secure round, "
                                f"not {stage.value!r}")

    def advertised_cohorts(self) -> dict[int, int]:
        """Block -> how many devices that advertised keys train it (their split is at most the block)."""
        splits = [device.split for device in self.keys.values()]
        return {b: sum(s <= b for s in splits) for b in range(self.num_blocks)}

    # -- 0: keys ---------------------------------------------------------------------------------
    def advertise(self, device: str, split: int, cipher: bytes, mask: bytes, signature: bytes,
                  commitments: bytes) -> None:
        """Take a device's key advertisement (once per round; keys, split and seed commitments signed by
        its roster identity key)."""
        self._at(SecureStage.KEYS, device, "a key advertisement")
        if device in self.keys:
            raise SecureRefusal(f"{device!r} advertised keys twice in one round (a replay)")
        identity = self.identities.get(device)
        if identity is None:
            raise SecureRefusal(f"{device!r} has no identity key in the roster: it cannot join a secure round")
        if not 0 <= split < self.num_blocks:
            raise SecureRefusal(f"{device!r} trains no block (split {split})")
        if len(commitments) != KEY_BYTES * (self.num_blocks - split):
            raise SecureRefusal(f"{device!r} committed to {len(commitments) // KEY_BYTES} block seeds, trained "
                                f"{self.num_blocks - split} (an advertisement without commitments is refused)")
        verify_advertisement(identity, device, self.scope, cipher, mask, split, commitments, signature)
        self.keys[device] = _Device(split, cipher, mask, signature, bytes(commitments))

    def close_keys(self, *, weight_scale: float, noise: NoisePlan | None = None) -> dict[str, dict[str, object]]:
        """Fix U_0 and the graph; per member, the fields of its ``SecAggPeers``. A device whose first
        block would have no neighbour that trained it is left out (alone, its mask would be its own).
        ``weight_scale``: the devices' weights are w = min(1, samples / weight_scale); ``noise``: the
        discrete Gaussian noise they add (:class:`NoisePlan`, sized from :meth:`advertised_cohorts`; None: none)."""
        self._at(SecureStage.KEYS, "the server", "closing the key stage")
        self.weight_scale, self.noise = weight_scale, noise or NoisePlan()
        members = sorted(self.keys, key=str.encode)
        while True:
            if len(members) < 2:
                self.left_out.update({m: "fewer than 2 devices advertised keys" for m in members})
                members = []
                break
            graph = neighbour_graph(self.graph_seed, self.scope, 0, members, self._degree(len(members)))
            alone = [m for m in members
                     if not any(self.keys[v].split <= self.keys[m].split for v in graph.neighbours[m])]
            if not alone:
                break
            self.left_out.update({m: "no neighbour trained its first block" for m in alone})
            members = [m for m in members if m not in alone]
        self._stage = SecureStage.SHARES
        if not members:
            return {}
        self.graph = graph
        self.t = max(self.min_survivors, default_threshold(graph))
        for b in range(self.num_blocks):
            trainers = sum(self.keys[m].split <= b for m in members)
            if trainers < self.t:
                self.unsecured[b] = (f"{trainers} devices of the cohort train block {b}, fewer than t = {self.t}: "
                                     "not trained securely this round (it keeps its value)")
        self.fixed, self.compression = plan_fixed(len(members), self.clip, self.noise, self.compression)
        return {m: self._peers(m, members) for m in members}

    def fixed_for(self, block: int) -> FixedPoint:
        """Block ``block``'s fixed point: the round's, or a compressed round's for the block's size."""
        return block_fixed(self.fixed, self.compression, self.sizes[block])

    def _degree(self, n: int) -> int:
        k = self.degree or default_degree(n)
        return n - 1 if k >= n - 1 else k + (k % 2)

    def _peers(self, device: str, members: list[str]) -> dict[str, object]:
        graph, fixed = self.graph, self.fixed
        assert graph is not None and fixed is not None
        near = graph.neighbours[device]
        return {"graph_seed": self.graph_seed, "degree": self._degree(len(members)), "members": members,
                "cipher_keys": {v: self.keys[v].cipher for v in near}, "mask_keys": {v: self.keys[v].mask for v in near},
                "signatures": {v: self.keys[v].signature for v in near},
                "identities": {v: self.identities[v] for v in near}, "splits": {v: self.keys[v].split for v in near},
                "commitments": {v: self.keys[v].commitments for v in near}, "min_survivors": self.t,
                "clip": fixed.clip, "frac_bits": fixed.frac_bits, "ring_bits": fixed.ring_bits, "cohort": fixed.cohort,
                "weight_scale": self.weight_scale, "threshold": graph.threshold[device], **self.noise.fields(fixed),
                **({} if self.compression is None else self.compression.fields())}

    # -- 1: shares -------------------------------------------------------------------------------
    def take_shares(self, device: str, sealed: Mapping[str, bytes]) -> None:
        """Take a member's sealed shares: exactly one for each of its neighbours."""
        self._at(SecureStage.SHARES, device, "shares")
        graph = self.graph
        if graph is None or device not in graph.neighbours:
            raise SecureRefusal(f"shares from {device!r}, which is not in the round's cohort")
        if device in self.shared:
            raise SecureRefusal(f"{device!r} sent its shares twice")
        if set(sealed) != set(graph.neighbours[device]):
            raise SecureRefusal(f"{device!r}'s shares name devices other than its neighbours")
        self.shared[device] = dict(sealed)

    def close_shares(self) -> dict[str, dict[str, bytes]]:
        """Fix U_1; per member of U_1, the sealed shares addressed to it by other members of U_1."""
        self._at(SecureStage.SHARES, "the server", "closing the share stage")
        self._stage = SecureStage.MASKED
        assert self.graph is not None
        while alone := [u for u in self.shared
                        if not any(self.keys[v].split <= self.keys[u].split for v in self.neighbours(u))]:
            for u in alone:  # its neighbours that trained its first block did not share: it would be alone
                self.left_out[u] = "no neighbour that trained its first block shared keys"
                del self.shared[u]
        return {u: {v: self.shared[v][u] for v in self.neighbours(u)} for u in self.shared}

    def neighbours(self, device: str) -> list[str]:
        """The device's neighbours that are in U_1."""
        assert self.graph is not None
        return [v for v in self.graph.neighbours[device] if v in self.shared]

    # -- 2: masked uploads -----------------------------------------------------------------------
    def check_masked(self, device: str, blocks: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        """Refuse an upload that is not exactly the words of the blocks the device trained; its words (:func:`block_words`)."""
        self._at(SecureStage.MASKED, device, "a masked update")
        if device not in self.shared:
            raise SecureRefusal(f"a masked update from {device!r}, which did not share its keys this round")
        if device in self.masked:
            raise SecureRefusal(f"{device!r} sent a second masked update")
        fixed = self.fixed
        assert fixed is not None
        expected = set(range(self.keys[device].split, self.num_blocks))
        if set(blocks) != expected:
            raise SecureRefusal(f"{device!r}'s masked update covers blocks {sorted(blocks)}, not {sorted(expected)}")
        return {b: block_words(device, b, words, fixed, self.sizes[b]) for b, words in blocks.items()}

    def take_masked(self, device: str, blocks: Mapping[int, np.ndarray]) -> None:
        """Add a checked masked update to the blocks' running sums."""
        for b, words in self.check_masked(device, blocks).items():
            total = self.sums.get(b)
            self.sums[b] = words.copy() if total is None else total + words  # uint32: mod 2^32, reduced later
        self.masked.add(device)

    # -- 3: unmasking ----------------------------------------------------------------------------
    def close_uploads(self) -> dict[str, tuple[list[str], list[str], list[int]]]:
        """Fix U_2 and the blocks to reveal (each one's surviving cohort reaches t); per survivor,
        (its survivors incl. itself, its dropped that trained a block revealed, the blocks revealed)
        among its U_1 neighbours. Nothing is asked when no block can be revealed."""
        self._at(SecureStage.MASKED, "the server", "closing the uploads")
        self._stage = SecureStage.UNMASK
        self.revealing = [b for b in range(self.num_blocks)
                          if b in self.sums and b not in self.unsecured and len(self.cohort(b)) >= self.t]
        if not self.revealing:
            return {}
        last = max(self.revealing)
        for u in sorted(self.masked, key=str.encode):
            near = self.neighbours(u)
            alive = sorted([u, *(v for v in near if v in self.masked)], key=str.encode)
            gone = sorted((v for v in near if v not in self.masked and self.keys[v].split <= last), key=str.encode)
            self.asked[u] = (frozenset(alive), frozenset(gone))
        return {u: (sorted(a, key=str.encode), sorted(g, key=str.encode), list(self.revealing))
                for u, (a, g) in self.asked.items()}

    def cohort(self, block: int) -> list[str]:
        """Block ``block``'s survivors: the devices of U_2 that trained it."""
        return [u for u in self.masked if self.keys[u].split <= block]

    def survivor_set(self) -> list[str]:
        """U_2, every device whose masked upload the sums hold: the set the survivors sign (ConsistencyCheck)."""
        return sorted(self.masked, key=str.encode)

    def take_consent(self, device: str, signature: bytes) -> None:
        """A survivor's signature on :meth:`survivor_set` (Bonawitz et al. 2017, ConsistencyCheck), once."""
        self._at(SecureStage.UNMASK, device, "a signature on the survivor set")
        if device not in self.asked or device in self.consents:
            raise SecureRefusal(f"a survivor-set signature from {device!r}, which was not asked (or signed already)")
        verify_survivors(self.identities[device], device, self.scope, self.survivor_set(), signature)
        self.consents[device] = bytes(signature)

    def consistent(self) -> bool:
        """Whether at least t survivors signed the survivor set: the devices answer with shares only then."""
        return len(self.consents) >= self.t

    def signatures_for(self, device: str) -> dict[str, bytes]:
        """The signatures ``device`` can check: its own and its neighbours' (it holds their identity keys)."""
        assert self.graph is not None
        near = set(self.graph.neighbours[device]) | {device}
        return {v: sig for v, sig in self.consents.items() if v in near}

    def abandon_unmasking(self) -> None:
        """Fewer than t survivors signed the survivor set: no share is asked for, nothing is unmasked."""
        self._at(SecureStage.UNMASK, "the server", "abandoning the unmasking")
        self.asked.clear()

    def forget_asked(self, device: str) -> None:
        """A survivor gone since its upload cannot answer the unmasking: it is not awaited."""
        self._at(SecureStage.UNMASK, device, "forgetting an unmasking request")
        self.asked.pop(device, None)

    def take_reveal(self, device: str, seed_shares: Mapping[str, bytes], key_shares: Mapping[str, bytes]) -> None:
        """Take a survivor's shares: at most those it was asked for (one per revealed block a survivor
        trained), once; those it leaves out are peers whose sealed shares did not open for it."""
        self._at(SecureStage.UNMASK, device, "an unmasking answer")
        asked = self.asked.pop(device, None)
        if asked is None or device not in self.consents:
            raise SecureRefusal(f"an unmasking answer from {device!r}, which was not asked (or answered already, "
                                "or did not sign the survivor set)")
        seeds_due = {v for v in asked[0] if self._blocks_of(v)}
        if not set(seed_shares) <= seeds_due or not set(key_shares) <= asked[1] \
                or (device in seeds_due and device not in seed_shares):
            raise SecureRefusal(f"{device!r}'s unmasking answer names devices it was not given")
        for v, shares in seed_shares.items():
            blocks = self._blocks_of(v)
            if len(shares) != SHARE_BYTES * len(blocks):
                raise SecureRefusal(f"{device!r}'s answer holds {len(shares)} bytes of {v!r}'s seed shares, not "
                                    f"{SHARE_BYTES} for each of {len(blocks)} blocks")
            for i, b in enumerate(blocks):
                self.seed_shares.setdefault((v, b), []).append((device, bytes(shares[i * SHARE_BYTES:(i + 1) * SHARE_BYTES])))
        for v, share in key_shares.items():
            self.key_shares.setdefault(v, []).append((device, bytes(share)))
        missing = (seeds_due - set(seed_shares)) | (asked[1] - set(key_shares))
        if missing:
            self.unopened[device] = sorted(missing, key=str.encode)

    def _blocks_of(self, device: str) -> list[int]:
        """The revealed blocks ``device`` trained: whose seeds' shares the unmasking asks for."""
        return [b for b in self.revealing if self.keys[device].split <= b]

    def finish(self) -> list[BlockOutcome]:
        """Each block's outcome: its unmasked, decoded sum, or why it stays hidden. Closes the round
        from any stage (one closed before its uploads has no block to reveal)."""
        self._stage = SecureStage.DONE
        fixed, graph = self.fixed, self.graph
        if fixed is None or graph is None:
            return [BlockOutcome(b, 0, reason="no cohort shared keys") for b in range(self.num_blocks)]
        return [self._block(b, self.fixed_for(b), graph) for b in range(self.num_blocks)]

    def _block(self, b: int, fixed: FixedPoint, graph: Graph) -> BlockOutcome:
        cohort = self.cohort(b)
        outcome = BlockOutcome(b, len(cohort))
        if b not in self.revealing:
            outcome.reason = self.unsecured.get(b) or (f"{len(cohort)} masked updates of block {b}, fewer than the "
                                                       f"threshold t = {self.t}")
            return outcome
        if self.noise.survivors:
            n_min, n_exp = self.noise.sized_for(b, fixed.cohort)
            if len(cohort) < n_min:
                outcome.reason = (f"{len(cohort)} survivors of block {b}, fewer than the {n_min} its noise is "
                                  f"sized for: the sum would be under-noised")
                return outcome
            outcome.multiplier = self.noise.multiplier * (len(cohort) / n_exp) ** 0.5
        self_seeds: dict[str, bytes] = {}
        for u in cohort:
            seed = self.book.rebuild(u, b, graph)
            if isinstance(seed, str):
                outcome.reason = seed
                return outcome
            self_seeds[u] = self_mask_seed(seed, self.scope, b, u)
        dropped: dict[str, dict[str, bytes]] = {}
        for d in (v for v in self.shared if v not in self.masked and self.keys[v].split <= b):
            partners = [u for u in self.neighbours(d) if u in cohort]
            if not partners:
                continue
            key = self.book.rebuild(d, -1, graph)
            if isinstance(key, str):
                outcome.reason = key
                return outcome
            dropped[d] = {u: pair_mask_seed(agree(key, self.keys[u].mask), self.scope, b, d, u) for u in partners}
        words = remove_masks(self.sums[b] & np.uint32((1 << fixed.ring_bits) - 1), fixed.ring_bits,
                             self_seeds=self_seeds, dropped=dropped)
        decoded = fixed.decode(words)
        outcome.values, outcome.weight, outcome.recovered = decoded.values, decoded.weight, sorted(dropped)
        return outcome
