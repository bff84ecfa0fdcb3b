"""Which torch device a process computes on: the CPU, or a CUDA GPU where one is present and wanted.

``EDGETRAIN_TORCH_DEVICE`` chooses, for every torch computation that asks here:

- ``cpu``: the CPU;
- ``cuda`` or ``cuda:N``: that GPU (an error when torch sees none: asking for a GPU that is not
  there is a setup mistake, not something to hide);
- ``auto``: the first GPU when torch sees one, else the CPU.

Unset, a caller's own default applies: the server's evaluation and the lightweight emulator's
workers (many emulated devices sharing one GPU) use ``auto``; a device process uses the CPU (a phone
or a board has no CUDA, and a process per device would each hold a CUDA context). Where tensors live
changes nothing the planner counts: budgets, footprints and roles are the same on either device.

Importing this module does not import torch (``import edge_sdk`` stays lean).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["ENV", "torch_device"]

ENV = "EDGETRAIN_TORCH_DEVICE"


def torch_device(default: str = "cpu") -> torch.device:
    """The device ``EDGETRAIN_TORCH_DEVICE`` names, or ``default`` when it is unset (same spellings)."""
    import torch

    wanted = (os.environ.get(ENV) or default).strip().lower()
    if wanted == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if wanted == "cpu":
        return torch.device("cpu")
    if wanted.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"{ENV}={wanted}, but torch sees no CUDA device (torch {torch.__version__})")
        return torch.device(wanted)
    raise ValueError(f"{ENV} must be cpu, cuda, cuda:N or auto, got {wanted!r}")
