"""A model a run starts from: weights trained elsewhere (centrally, on public text; an earlier run),
which the fleet then fine-tunes instead of training from scratch.

:func:`read_start_state` reads a file of weights by state name, checks it against the model the
server trains and gives the state round 1 starts from. Accepted files:

- ``.pt`` / ``.pth``: a torch state dict, as ``edgetrain export`` writes ``model.pt`` (read with
  ``torch.load(weights_only=True)``: tensors only, nothing is unpickled beyond them);
- ``.npz``: one array per state name (``numpy.savez``; read without pickles).

Every entry of the model must be in the file, with its shape, except LoRA adapters
(``edge_sdk.models.adapters``): a plain model's weights (``edgetrain export`` merges adapters into
their layers) start an adapted model with fresh adapters, whose B factors are zero, so the model
starts as the checkpoint's function. An entry the model does not have is refused, as is a shape
that differs: a checkpoint of another model never starts a run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

__all__ = ["read_start_state"]

_ADAPTER_SUFFIXES = (".lora_a", ".lora_b")


def _read(path: Path) -> dict[str, np.ndarray]:
    suffix = path.suffix.lower()
    if suffix in (".pt", ".pth"):
        import torch

        loaded = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(loaded, Mapping) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
            raise ValueError(f"{path} is not a state dict (names to tensors)")
        return {str(k): v.detach().numpy() for k, v in loaded.items()}
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    raise ValueError(f"{path}: a starting model is a .pt state dict (edgetrain export's model.pt) or an .npz of arrays")


def read_start_state(path: str | Path, initial: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str]:
    """The state round 1 starts from: ``initial`` (the model built as the run's seed builds it) with
    every entry the file at ``path`` holds (see the module docstring), and the file's sha256."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no starting model at {path}")
    given = _read(path)
    unknown = sorted(set(given) - set(initial))
    if unknown:
        raise ValueError(f"{path} holds {unknown[:3]}, which the model does not have: a checkpoint of another model")
    missing = sorted(n for n in set(initial) - set(given) if not n.endswith(_ADAPTER_SUFFIXES))
    if missing:
        raise ValueError(f"{path} lacks {missing[:3]} of the model")
    state = {k: np.array(v, copy=True) for k, v in initial.items()}
    for name, value in given.items():
        if tuple(value.shape) != tuple(initial[name].shape):
            raise ValueError(f"{path}: {name} has shape {tuple(value.shape)}, the model's is {tuple(initial[name].shape)}")
        state[name] = np.asarray(value, dtype=initial[name].dtype).copy()
    return state, hashlib.sha256(path.read_bytes()).hexdigest()
