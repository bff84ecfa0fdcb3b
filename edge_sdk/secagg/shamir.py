"""Shamir shares of 32-byte secrets, t of n, in the field GF(2^8) of HashiCorp Vault's scheme.

Split is ``pyshamir`` 1.1.0 (a port of Vault's ``shamir`` package; polynomial coefficients and
x-coordinates from Python's ``secrets``). npm's ``shamir-secret-sharing`` 0.0.4 uses the same field
(AES's, x^8 + x^4 + x^3 + x + 1) and the same share layout, so a secret split by either SDK is
rebuilt by the other (tests/vectors/secagg.json holds shares from both):

    share = y_1 .. y_L x      (L = len(secret) bytes, one polynomial per byte, then the x-coordinate)

x-coordinates are distinct and in 1..255, so a secret has at most 255 shares.

Combining is Lagrange interpolation at 0 over the same field, done here with numpy log/antilog
tables because ``pyshamir.combine`` recomputes the basis for every byte in pure Python
(O(32 t^2) field operations: 8.6 s for t = 51 on the shared 2-core machine, 2026-11-27), which a server
rebuilding one secret per device cannot afford. It is checked against ``pyshamir.combine`` and
the JavaScript library by the tests. Given more than ``threshold`` shares, :func:`combine_shares`
also checks that they lie on one polynomial of degree < t, so a single altered share is detected,
not silently combined into a wrong seed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import pyshamir

from .keys import KEY_BYTES
from .labels import SecAggError, check_bytes

__all__ = ["MAX_SHARES", "SHARE_BYTES", "combine_shares", "robust_combine", "split_secret"]

#: The most t-subsets :func:`robust_combine` tries before it gives up (C(9, 4) = 126 for one bad share
#: in 9 is far below; a cohort with many wrong shares is one where the secret is not rebuilt).
MAX_TRIES = 4096

SHARE_BYTES = KEY_BYTES + 1
MAX_SHARES = 255


def _tables() -> tuple[np.ndarray, np.ndarray]:
    """exp and log of GF(2^8) with the AES polynomial, generator 3 (exp doubled to skip a modulo)."""
    exp = np.zeros(510, dtype=np.uint8)
    log = np.zeros(256, dtype=np.int32)
    x = 1
    for i in range(255):
        exp[i] = x
        log[x] = i
        x ^= ((x << 1) ^ (0x1B if x & 0x80 else 0)) & 0xFF  # x * 3 = x * 2 + x
    exp[255:] = exp[:255]
    return exp, log


_EXP, _LOG = _tables()


def split_secret(secret: bytes, shares: int, threshold: int) -> list[bytes]:
    """``shares`` shares of a 32-byte ``secret``, any ``threshold`` of which rebuild it (2 <= t <= n <= 255)."""
    secret = check_bytes("secret", secret, KEY_BYTES)
    if not 2 <= threshold <= shares <= MAX_SHARES:
        raise SecAggError(f"Shamir needs 2 <= threshold <= shares <= {MAX_SHARES}, got t={threshold}, n={shares}")
    return [bytes(part) for part in pyshamir.split(secret, shares, threshold)]


def _lagrange_at(xs: np.ndarray, at: int) -> np.ndarray:
    """log of the Lagrange basis coefficients of points ``xs`` evaluated at ``at`` (none of xs equals at)."""
    diff = xs[:, None] ^ xs[None, :]
    np.fill_diagonal(diff, 1)  # log 1 = 0: the j = i factor is left out
    numerator = _LOG[xs ^ at].sum() - _LOG[xs ^ at]  # prod over j != i of (at - x_j), as a log
    return (numerator - _LOG[diff].sum(axis=1)) % 255


def _interpolate(xs: np.ndarray, ys: np.ndarray, at: int) -> np.ndarray:
    """The polynomial through (xs[i], ys[i, :]) (one per byte column) evaluated at ``at``."""
    coeffs = _lagrange_at(xs, at)
    terms = np.where(ys == 0, 0, _EXP[(_LOG[ys] + coeffs[:, None]) % 255])
    return np.bitwise_xor.reduce(terms.astype(np.uint8), axis=0)


def _parse(shares: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    rows = [check_bytes("share", share, SHARE_BYTES) for share in shares]
    data = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), SHARE_BYTES)
    xs = data[:, -1].astype(np.int32)
    if (xs == 0).any():
        raise SecAggError("a share has x-coordinate 0")
    if len(np.unique(xs)) != len(xs):
        raise SecAggError("two shares have the same x-coordinate")
    return xs, data[:, :-1].astype(np.int32)


def combine_shares(shares: Sequence[bytes], threshold: int) -> bytes:
    """The 32-byte secret of at least ``threshold`` shares; every share past the first ``threshold``
    must lie on their polynomial (a share that does not is refused)."""
    if not 2 <= threshold <= MAX_SHARES:
        raise SecAggError(f"threshold must be in [2, {MAX_SHARES}], got {threshold}")
    if not threshold <= len(shares) <= MAX_SHARES:
        raise SecAggError(f"combining needs between {threshold} and {MAX_SHARES} shares, got {len(shares)}")
    xs, ys = _parse(shares)
    base_x, base_y = xs[:threshold], ys[:threshold]
    for x, y in zip(xs[threshold:], ys[threshold:]):
        if not np.array_equal(_interpolate(base_x, base_y, int(x)), y):
            raise SecAggError(f"the share with x-coordinate {int(x)} is not on the polynomial of the others")
    return _interpolate(base_x, base_y, 0).tobytes()


def robust_combine(shares: Sequence[bytes], threshold: int, check: Callable[[bytes], bool]) -> tuple[bytes, list[int]]:
    """The secret ``check`` accepts (the owner's signed commitment to it) from ``shares``, some of
    which may be wrong, and the indices of the wrong ones (every share off the polynomial that gave
    it; a malformed one, x = 0 or the wrong size, is wrong too). Tries t-subsets in order, the first
    t first; raises :class:`SecAggError` when fewer than t shares are right (or after :data:`MAX_TRIES`)."""
    if not 2 <= threshold <= MAX_SHARES:
        raise SecAggError(f"threshold must be in [2, {MAX_SHARES}], got {threshold}")
    sized = [i for i, share in enumerate(shares) if isinstance(share, bytes) and len(share) == SHARE_BYTES]
    data = np.frombuffer(b"".join(shares[i] for i in sized), dtype=np.uint8).reshape(len(sized), SHARE_BYTES)
    xs, ys = data[:, -1].astype(np.int32), data[:, :-1].astype(np.int32)
    usable = [k for k in range(len(sized)) if xs[k] != 0]
    for tries, subset in enumerate(itertools.combinations(usable, threshold)):
        if tries >= MAX_TRIES:
            break
        pick = list(subset)
        if len(set(xs[pick].tolist())) < threshold:
            continue
        secret = _interpolate(xs[pick], ys[pick], 0).tobytes()
        if check(secret):
            on = {int(xs[k]): ys[k] for k in pick}

            def fits(k: int) -> bool:
                x = int(xs[k])
                return np.array_equal(on[x] if x in on else _interpolate(xs[pick], ys[pick], x), ys[k])

            right = {sized[k] for k in usable if k in subset or fits(k)}
            return secret, [i for i in range(len(shares)) if i not in right]
    raise SecAggError(f"no {threshold} of the {len(shares)} shares rebuild the committed secret")
