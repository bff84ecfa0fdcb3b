"""The randomized Hadamard transform and a summation order both SDKs share.

``rotate(x, signs) = H (signs * x) / sqrt(d)`` for d a power of two, H the (unnormalized, symmetric)
Walsh-Hadamard matrix; ``unrotate`` is its inverse ``signs * H y / sqrt(d)`` (H H = d I). Two of them, with
independent signs, stand in for a uniformly random rotation in the EDEN codecs (:mod:`.eden`): O(d log d)
work, 2d sign bits of shared randomness.

Bit-identical in both SDKs: the butterflies run in float32 in one fixed order (pass h = 1, 2, 4, ...;
within a pass, element j and j + h of each block of 2h become a + b and a - b), every sum rounded
to float32 as numpy does (JavaScript computes a float32 sum in float64 and rounds it: the same
result, since float64 holds more than twice float32's precision), then one multiplication by
``float32(1/sqrt(d))``. :func:`tree_sum` adds float64 values pairwise in a fixed tree for the same
reason: numpy's ``sum`` and BLAS choose their own orders.
"""

from __future__ import annotations

import numpy as np

__all__ = ["fwht", "rotate", "unrotate", "tree_sum", "inv_sqrt"]


def fwht(x: np.ndarray) -> np.ndarray:
    """Walsh-Hadamard transform of each row of ``x`` (float32, shape (rows, d), d a power of two)."""
    rows, d = x.shape
    h = 1
    while h < d:
        blocks = x.reshape(rows, d // (2 * h), 2, h)
        a, b = blocks[:, :, 0, :], blocks[:, :, 1, :]
        x = np.stack((a + b, a - b), axis=2).reshape(rows, d)
        h *= 2
    return x


def inv_sqrt(d: int) -> np.float32:
    return np.float32(1.0 / np.sqrt(np.float64(d)))


def rotate(x: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """Rows of ``x`` rotated: ``H (signs * x) * float32(1/sqrt(d))`` in float32; ``signs`` is +-1 float32."""
    return fwht(x * signs) * inv_sqrt(x.shape[1])


def unrotate(y: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """The inverse of :func:`rotate` (up to float32 rounding): ``H y * float32(1/sqrt(d)) * signs``."""
    return fwht(y) * inv_sqrt(y.shape[1]) * signs


def tree_sum(values: np.ndarray) -> np.ndarray:
    """Sum each row of float64 ``values`` (shape (rows, d), d a power of two) pairwise:
    ``v <- v[0::2] + v[1::2]`` until one is left."""
    v = values
    while v.shape[1] > 1:
        v = v[:, 0::2] + v[:, 1::2]
    return v[:, 0]
