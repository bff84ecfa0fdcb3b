"""Error feedback: what compression left out of one round's update is added to the next round's.

Stich et al. 2018 ("Sparsified SGD with Memory") and Karimireddy et al. 2019 ("Error Feedback Fixes
SignSGD and other Gradient Compression Schemes", Algorithm 2, EF-SGD): the device keeps a residual
``e`` per tensor, sends ``c = C(delta + e)`` and keeps ``e <- delta + e - decode(c)``. A biased
compressor (nearest rounding, float16) then loses nothing in the long run; for an unbiased one it
is optional. The residual lives on the device, one float32 array per tensor name, and is dropped
with :meth:`reset` (a new model version whose shapes differ, a device that changed its split).
"""

from __future__ import annotations

import numpy as np

from .base import Codec
from .registry import decode

__all__ = ["ErrorFeedback"]


class ErrorFeedback:
    """Residuals per tensor name; :meth:`encode` compresses a delta with the residual folded in."""

    def __init__(self) -> None:
        self.residuals: dict[str, np.ndarray] = {}

    def encode(self, name: str, delta: np.ndarray, codec: Codec, *, seed: int | None = None) -> bytes:
        """The record of ``delta + residual[name]``; the residual becomes what the record misses."""
        delta = np.asarray(delta, dtype=np.float32)
        held = self.residuals.get(name)
        target = delta if held is None or held.shape != delta.shape else delta + held
        record = codec.encode(target, seed=seed)
        self.residuals[name] = target - decode(record)
        return record

    def reset(self, name: str | None = None) -> None:
        """Forget one tensor's residual, or all of them."""
        if name is None:
            self.residuals.clear()
        else:
            self.residuals.pop(name, None)
