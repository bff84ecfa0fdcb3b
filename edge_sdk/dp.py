"""Differential privacy on the device: per-block clipping and distributed discrete Gaussian noise shares.

User-level DP-FedAvg (McMahan et al., 2018, "Learning Differentially Private Recurrent Language
Models", Algorithm 1) bounds each device's influence by clipping its update, then adds Gaussian
noise to the sum. Under partial training a device sends only the blocks it trains, so the clip is
per block (McMahan et al., 2018, Section 3, "per-layer clipping"): block b is clipped to ``C_b``;
the whole update's norm is then at most sqrt(sum_b C_b^2). :func:`clip_blocks` is that rule, the
one the server applies to plain updates (``orchestrator.aggregation.privacy.clipping``) and the JavaScript
device applies too (``edge_sdk_js/src/dp.ts``): per block, ``g <- g * min(1, C_b / ||g||_2)``, the
norm taken over the block's float tensors in float64. A block over its clip is scaled by the factor
times ``1 - 8 eps`` of its dtype (float32: ~1e-6), so that rounding the scaled values never leaves
a norm above ``C_b``; a block within its clip is returned unchanged, bit for bit.

Under secure aggregation the server only sees the sum, so the devices add the noise themselves,
as integers in the modular ring of the masked sum (Kairouz, Liu, Steinke, 2021, "The Distributed
Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation"). Each device adds a
discrete Gaussian share of variance ``sigma^2 / n_min`` (:func:`noise_share`), so that any
``n_min`` surviving devices' shares together have variance at least ``sigma^2``: dropouts after the
noise was added cannot leave the sum under-noised as long as ``n_min`` devices survive. (A sum of
discrete Gaussians is not exactly a discrete Gaussian; Kairouz et al., Proposition 14, bound the
difference, negligible for shares with standard deviation of a few units or more.)

:func:`discrete_gaussian` samples N_Z(0, sigma^2), P(x) proportional to exp(-x^2 / (2 sigma^2)) on the
integers, with Algorithm 3 of Canonne, Kamath, Steinke (2020, "The Discrete Gaussian for
Differential Privacy"): a discrete Laplace proposal of scale t = floor(sigma) + 1 (the difference of
two geometric variables), accepted with probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)). Like
TensorFlow Privacy's vectorised sampler it computes the geometric draws and the acceptance
probability in float64 rather than in exact rational arithmetic, so the probabilities are exact to
about 1e-16 relative; the outputs are integers, so no floating-point output lattice leaks (the
attack of Mironov, 2012, on floating-point noise; see ``orchestrator.aggregation.privacy.noise``). The discrete
Gaussian, not Skellam (Agarwal, Kairouz, Liu, 2021), because its sampler needs only uniforms, a log
and an exp, which both SDKs compute the same way; Skellam needs a Poisson sampler per language.

Every random bit comes from the operating system's CSPRNG (``os.urandom``: getrandom(2) on
Linux), never from numpy's generators, which are predictable from their output.

numpy only: importing this module loads neither torch nor onnx, and ``import edge_sdk`` does not
import it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "Clipped",
    "add_in_ring",
    "clip_blocks",
    "clip_factor",
    "discrete_gaussian",
    "noise_share",
    "secure_uniform",
    "share_sigma",
]

_UNIT = 2.0**-53


def secure_uniform(n: int) -> np.ndarray:
    """``n`` uniforms on (0, 1] with 53 random bits each, from the OS CSPRNG (``os.urandom``):
    (w >> 11 + 1) * 2^-53 for a random 64-bit word w. Never 0, so ``log`` is always finite."""
    if n <= 0:
        return np.zeros(0, dtype=np.float64)
    words = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
    return ((words >> np.uint64(11)).astype(np.float64) + 1.0) * _UNIT


# -- clipping -------------------------------------------------------------------------------------
def clip_factor(norm: float, clip: float, eps: float = float(np.finfo(np.float32).eps)) -> float:
    """The factor a block of L2 norm ``norm`` is multiplied by to clip it to ``clip``: exactly 1
    within the clip, else ``clip / norm`` shrunk by ``8 eps`` (the dtype's machine epsilon) so that
    the scaled values, rounded to that dtype, still have a norm of at most ``clip``."""
    if not clip > 0 or not math.isfinite(clip):
        raise ValueError(f"a clip must be a finite number > 0, got {clip}")
    if not math.isfinite(norm):
        raise ValueError(f"cannot clip an update whose norm is {norm}")
    if norm <= clip:
        return 1.0
    return clip / norm * (1.0 - 8.0 * eps)


@dataclass
class Clipped:
    """An update clipped block by block: the tensors, each block's norm before clipping, and the
    factor each block was multiplied by (1.0: within its clip, unchanged)."""

    tensors: dict[str, np.ndarray]
    norms: dict[Hashable, float] = field(default_factory=dict)
    factors: dict[Hashable, float] = field(default_factory=dict)


def clip_blocks(tensors: Mapping[str, np.ndarray], block_of: Mapping[str, Hashable],
                clips: Mapping[Hashable, float]) -> Clipped:
    """Clip each block of ``tensors`` (name -> array; ``block_of`` maps each name to its block) to
    its L2 norm bound ``clips[block]``. Float tensors only: integer counters are not parameters
    and pass through (as in the server's norm bound). A block with no clip is an error: an update
    must never leave the device, or reach the sum, unbounded."""
    groups: dict[Hashable, list[str]] = {}
    for name, t in tensors.items():
        if np.asarray(t).dtype.kind == "f":
            groups.setdefault(block_of[name], []).append(name)
    out = dict(tensors)
    clipped = Clipped(out)
    for block, names in groups.items():
        if block not in clips:
            raise ValueError(f"no clip for block {block!r}")
        arrays = [np.asarray(tensors[n]) for n in names]
        norm = math.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in arrays))
        eps = max(float(np.finfo(a.dtype).eps) for a in arrays)
        factor = clip_factor(norm, float(clips[block]), eps)
        clipped.norms[block], clipped.factors[block] = norm, factor
        if factor < 1.0:
            for n, a in zip(names, arrays):
                out[n] = (a.astype(np.float64) * factor).astype(a.dtype)
    return clipped


# -- distributed discrete Gaussian noise -----------------------------------------------------------
def discrete_gaussian(sigma: float, size: int | tuple[int, ...]) -> np.ndarray:
    """Samples of the discrete Gaussian N_Z(0, sigma^2) (int64), by Canonne, Kamath, Steinke (2020),
    Algorithm 3, vectorised: draw a batch of discrete Laplace proposals Y = G1 - G2 with
    G = floor(t * E), E ~ Exp(1) (geometric with P(G >= k) = exp(-k / t)), keep each with
    probability exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2)), repeat for the rest. The acceptance
    rate is at least about 0.6 for any sigma, so a few batches suffice."""
    shape = (size,) if isinstance(size, int) else tuple(size)
    n = int(np.prod(shape, dtype=np.int64))
    if not (sigma >= 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma}")
    if sigma == 0 or n == 0:
        return np.zeros(shape, dtype=np.int64)
    t = math.floor(sigma) + 1.0
    shift, scale = sigma * sigma / t, 2.0 * sigma * sigma
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        draw = int((n - filled) * 1.8) + 64
        u = secure_uniform(3 * draw).reshape(3, draw)
        y = np.floor(-t * np.log(u[0])) - np.floor(-t * np.log(u[1]))
        keep = y[u[2] <= np.exp(-np.square(np.abs(y) - shift) / scale)]
        take = min(keep.size, n - filled)
        out[filled:filled + take] = keep[:take]
        filled += take
    return out.reshape(shape)


def share_sigma(noise_multiplier: float, clip: float, scale: float, min_survivors: int) -> float:
    """Standard deviation, in ring units, of one device's noise share: the sum's noise
    ``noise_multiplier * clip`` (in update units) times the quantisation ``scale`` (ring units per
    update unit), divided by sqrt(min_survivors) so that any ``min_survivors`` shares sum to at
    least the full variance."""
    if min_survivors < 1:
        raise ValueError(f"min_survivors must be >= 1, got {min_survivors}")
    if not (noise_multiplier >= 0 and clip > 0 and scale > 0):
        raise ValueError("noise_multiplier must be >= 0 and clip and scale > 0")
    return noise_multiplier * clip * scale / math.sqrt(min_survivors)


def noise_share(size: int | tuple[int, ...], sigma: float, min_survivors: int) -> np.ndarray:
    """One device's integer noise share for a sum whose noise must have standard deviation
    ``sigma`` (ring units) once any ``min_survivors`` devices' shares are added:
    N_Z(0, sigma^2 / min_survivors) per coordinate."""
    if min_survivors < 1:
        raise ValueError(f"min_survivors must be >= 1, got {min_survivors}")
    return discrete_gaussian(sigma / math.sqrt(min_survivors), size)


def add_in_ring(values: np.ndarray, noise: np.ndarray, bits: int) -> np.ndarray:
    """``(values + noise) mod 2^bits`` as uint64, for quantised values already in the ring
    [0, 2^bits) and signed integer noise (two's-complement wrap-around, then the mask)."""
    if not 1 <= bits <= 64:
        raise ValueError(f"a ring of 2^{bits} is not supported (1 to 64 bits)")
    total = np.asarray(values).astype(np.uint64) + np.asarray(noise, dtype=np.int64).astype(np.uint64)
    return total if bits == 64 else total & np.uint64((1 << bits) - 1)
