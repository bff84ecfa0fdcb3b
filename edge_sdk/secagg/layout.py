"""Which coordinates make up a block's vector: the same on the device (its deltas) and the server (the model).

A block's vector is the concatenation, flattened, of the float entries of that block in the order of
their names' UTF-8 bytes; an entry belongs to the block its name's second component names
(``blocks.<block>.<rest>``, edge_sdk.models.LayeredModel). The instruction of a secure round names
the blocks in order (``secagg_blocks``, comma-separated), so a device needs no model to find them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .labels import SecAggError

__all__ = ["block_entries", "block_parts", "block_vectors", "split_vector"]


def block_entries(names: Sequence[str], block_names: Sequence[str], split: int) -> dict[int, list[str]]:
    """Block index -> its entries' names in vector order, for blocks ``[split, L)``; every name
    must belong to one of them."""
    index = {b: i for i, b in enumerate(block_names)}
    out: dict[int, list[str]] = {i: [] for i in range(split, len(block_names))}
    for name in names:
        parts = name.split(".", 2)
        block = index.get(parts[1]) if len(parts) > 2 and parts[0] == "blocks" else None
        if block is None or block < split:
            raise SecAggError(f"entry {name[:80]!r} is in none of the blocks [{split}, {len(block_names)})")
        out[block].append(name)
    return {b: sorted(names, key=str.encode) for b, names in out.items()}


def block_parts(tensors: Mapping[str, np.ndarray], block_names: Sequence[str], split: int) -> list[list[np.ndarray]]:
    """Each block ``[split, L)``'s vector as the flat views of its float entries, in vector order:
    the vector without the copy (a device masks them slice by slice, edge_sdk.secagg.round)."""
    floats = {n: np.asarray(t) for n, t in tensors.items() if np.asarray(t).dtype.kind == "f"}
    entries = block_entries(list(floats), block_names, split)
    return [[floats[n].ravel() for n in names] for names in entries.values()]


def block_vectors(tensors: Mapping[str, np.ndarray], block_names: Sequence[str], split: int) -> list[np.ndarray]:
    """The float64 vector of each block ``[split, L)`` of ``tensors`` (float entries only)."""
    return [np.concatenate(parts or [np.zeros(0)]).astype(np.float64)
            for parts in block_parts(tensors, block_names, split)]


def split_vector(vector: np.ndarray, names: Sequence[str], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """A block's vector back into its entries (``names`` in vector order)."""
    out, at = {}, 0
    for name in names:
        size = int(np.prod(shapes[name], dtype=np.int64))
        out[name] = vector[at:at + size].reshape(shapes[name])
        at += size
    if at != vector.size:
        raise SecAggError(f"a block vector of {vector.size} values for entries of {at}")
    return out
