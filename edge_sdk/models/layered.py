"""A layered model: an ordered list of named blocks.

A split index k means blocks [0, k) are frozen on a device and blocks [k, L) are trained there
(EmbracingFL, Section 3.1: y = input-side layers, z = output-side layers).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn


class LayeredModel(nn.Module):
    """An ordered sequence of named blocks with helpers to run, slice and address them.

    Parameter and buffer names are ``"<block name>.<name inside the block>"`` so that a state
    entry says which block it belongs to; :meth:`block_of` maps a name back to its block index.
    """

    def __init__(
        self,
        name: str,
        blocks: Sequence[tuple[str, nn.Module]],
        *,
        input_shape: tuple[int, ...],
        input_dtype: torch.dtype = torch.float32,
        task: str = "classification",
        num_outputs: int = 10,
        sparse_blocks: Iterable[str] = (),
    ) -> None:
        super().__init__()
        if not blocks:
            raise ValueError("a layered model needs at least one block")
        names = [n for n, _ in blocks]
        if len(set(names)) != len(names):
            raise ValueError(f"block names must be unique: {names}")
        for n in names:
            if "." in n:
                raise ValueError(f"block name {n!r} must not contain '.'")
        self.name = name
        self.blocks = nn.ModuleDict(dict(blocks))
        self.input_shape = tuple(input_shape)
        self.input_dtype = input_dtype
        self.task = task
        self.num_outputs = num_outputs
        self.sparse_blocks = frozenset(sparse_blocks)
        unknown = self.sparse_blocks - set(names)
        if unknown:
            raise ValueError(f"sparse blocks not in the model: {sorted(unknown)}")

    # -- structure -----------------------------------------------------------------------
    @property
    def block_names(self) -> list[str]:
        return list(self.blocks.keys())

    def __len__(self) -> int:
        return len(self.blocks)

    def block(self, index: int) -> nn.Module:
        return self.blocks[self.block_names[index]]

    def block_of(self, state_name: str) -> int:
        """Index of the block a parameter/buffer name (as in :meth:`state_dict`) belongs to."""
        prefix = state_name.split(".", 2)
        # state_dict names are "blocks.<block>.<rest>"
        if len(prefix) < 2 or prefix[0] != "blocks":
            raise KeyError(state_name)
        return self.block_names.index(prefix[1])

    def chunk(self, start: int, stop: int) -> nn.Sequential:
        """Blocks [start, stop) as an ``nn.Sequential`` sharing this model's modules."""
        self._check_range(start, stop)
        return nn.Sequential(*(self.block(i) for i in range(start, stop)))

    def _check_range(self, start: int, stop: int) -> None:
        if not 0 <= start < stop <= len(self):
            raise ValueError(f"block range [{start}, {stop}) outside [0, {len(self)})")

    # -- running -------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        stop = len(self) if stop is None else stop
        self._check_range(start, stop)
        for i in range(start, stop):
            x = self.block(i)(x)
        return x

    def sample_input(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """A random batch shaped like the model's input (indices for integer inputs)."""
        shape = (batch, *self.input_shape)
        if self.input_dtype.is_floating_point:
            return torch.rand(shape, generator=generator)
        high = getattr(self, "input_high", 2)
        return torch.randint(0, high, shape, generator=generator, dtype=self.input_dtype)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The training loss for this model's task."""
        if self.task == "classification":
            return nn.functional.cross_entropy(output, target.long())
        if self.task == "binary":
            return nn.functional.binary_cross_entropy_with_logits(output.squeeze(-1), target.float())
        if self.task == "regression":
            return nn.functional.mse_loss(output.squeeze(-1), target.float())
        raise ValueError(f"unknown task {self.task!r}")

    # -- addressing state ----------------------------------------------------------------
    def state_names(self, start: int = 0, stop: int | None = None, *, trainable_only: bool = False) -> list[str]:
        """Names (as in :meth:`state_dict`) of the entries of blocks [start, stop)."""
        stop = len(self) if stop is None else stop
        self._check_range(start, stop)
        keep = set(self.block_names[start:stop])
        if trainable_only:
            names = [n for n, p in self.named_parameters() if p.requires_grad]
        else:
            names = list(self.state_dict().keys())
        return [n for n in names if n.split(".", 2)[1] in keep]

    def trainable_parameters(self, start: int = 0, stop: int | None = None) -> int:
        """Number of trainable parameters in blocks [start, stop)."""
        stop = len(self) if stop is None else stop
        self._check_range(start, stop)
        return sum(
            p.numel() for i in range(start, stop) for p in self.block(i).parameters() if p.requires_grad
        )
