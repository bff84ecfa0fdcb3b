"""The neighbour graph: whom a device masks with and shares its secrets with (SecAgg+).

Bell et al. 2020 replace SecAgg's complete graph by a sparse random graph of degree k = O(log n):
each device agrees pairwise masks with, and Shamir-shares its secrets to, its k neighbours only.
As in their Harary-graph construction (and Flower's SecAgg+), the cohort is put on a ring in a
random order and each device is joined to the k/2 devices on either side: a k-regular graph with
a random assignment of devices to nodes. A cohort of at most k + 1 devices is complete.

The order comes from a public seed, so every device recomputes the graph and checks its own
neighbourhood: the cohort's ids are sorted by UTF-8 bytes, then shuffled by Fisher-Yates
(i from n - 1 down to 1, swap i with j uniform in [0, i]) drawing j from the AES-256-CTR stream
(:func:`edge_sdk.secagg.masks.expand_words`) keyed by
``HKDF(seed, label("graph", session, round, block))``: a 32-bit word w is kept if
w < 2^32 - (2^32 mod (i + 1)) and gives j = w mod (i + 1) (rejection, no modulo bias).
Under partial training each block's cohort is its own (the devices with split <= block), so the
round protocol can build one graph per distinct cohort (``block`` selects its stream).

Each device gives a share to each neighbour and keeps one: deg + 1 shares, of which
t = floor((deg + 1) / 2) + 1 rebuild a secret (a majority of its neighbourhood, as SecAgg needs
t > n / 2 of the shares' holders).

A server chooses the seed and the cohort; it could try seeds until a graph suits it. The round
protocol can take the seed from a commitment or from the devices' own contributions where that
matters; these blocks only make the graph a pure function of (seed, scope, block, cohort, k).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .keys import KEY_BYTES, hkdf
from .labels import Scope, SecAggError, check_bytes, label
from .masks import expand_words
from .shamir import MAX_SHARES

__all__ = ["Graph", "default_degree", "neighbour_graph", "shuffled"]

COMPLETE_UP_TO = 32


def default_degree(cohort: int) -> int:
    """k for a cohort of n: the whole cohort (n - 1) up to 32 devices, else the smallest even k
    with 2^k >= n^3, i.e. k >= 3 log2 n, in integers so both SDKs agree. The O(log n) is Bell et
    al.'s; the constant 3 is a starting point, not derived from their bounds for a given dropout
    and corruption rate: the protocol's settings own it."""
    if cohort <= COMPLETE_UP_TO:
        return max(cohort - 1, 0)
    k = 2
    while 2**k < cohort**3:
        k += 2
    return min(cohort - 1, k)


@dataclass(frozen=True)
class Graph:
    """The cohort's neighbourhoods: ``neighbours[id]`` sorted by UTF-8 bytes; ``threshold[id]`` is
    how many of that device's deg + 1 shares rebuild its secrets."""

    order: tuple[str, ...]
    neighbours: dict[str, tuple[str, ...]]
    threshold: dict[str, int]


def _uniform_below(words: list[int], position: int, bound: int) -> tuple[int, int]:
    limit = 2**32 - (2**32 % bound)
    while position < len(words):
        w = words[position]
        position += 1
        if w < limit:
            return w % bound, position
    return -1, position


def shuffled(key: bytes, members: Sequence[str]) -> list[str]:
    """``members`` sorted by UTF-8 bytes, then shuffled by Fisher-Yates from ``key``'s stream."""
    order = sorted(members, key=lambda m: m.encode())
    count = 2 * len(order) + 16
    words = expand_words(key, count).tolist()
    position = 0
    for i in range(len(order) - 1, 0, -1):
        j, position = _uniform_below(words, position, i + 1)
        while j < 0:  # the stream ran out: a longer prefix of the same stream
            count *= 2
            words = expand_words(key, count).tolist()
            j, position = _uniform_below(words, position, i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def neighbour_graph(seed: bytes, scope: Scope, block: int, members: Sequence[str], degree: int | None = None) -> Graph:
    """The neighbour graph of ``members`` for ``block`` in ``scope``, from the public 32-byte ``seed``;
    ``degree`` k is even (or n - 1 for a complete graph); None: :func:`default_degree`."""
    n = len(members)
    if n < 2 or len(set(members)) != n:
        raise SecAggError(f"a neighbour graph needs at least 2 distinct devices, got {n}")
    k = default_degree(n) if degree is None else degree
    if not isinstance(k, int) or k < 1 or k + 1 > MAX_SHARES:
        raise SecAggError(f"degree must be an integer in [1, {MAX_SHARES - 1}], got {k!r}")
    key = hkdf(check_bytes("graph seed", seed, KEY_BYTES), label("graph", scope.session, scope.round, block))
    order = shuffled(key, members)
    if k >= n - 1:
        near = {m: [o for o in order if o != m] for m in order}
    elif k % 2:
        raise SecAggError(f"a sparse graph needs an even degree, got {k}")
    else:
        near = {m: [order[(p + d) % n] for d in range(-k // 2, k // 2 + 1) if d] for p, m in enumerate(order)}
    neighbours = {m: tuple(sorted(near[m], key=lambda o: o.encode())) for m in order}
    threshold = {m: (len(neighbours[m]) + 1) // 2 + 1 for m in order}
    return Graph(tuple(order), neighbours, threshold)
