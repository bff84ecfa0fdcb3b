"""Low-rank adapters (LoRA: Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", 2021):
a linear layer whose weight W is trained, or frozen and adapted as W + (alpha / r) B A.

Eq. (3) of the paper: h = W0 x + Delta W x = W0 x + B A x, with B (out x r) initialised to zero and
A (r x in) at random, so the adapted layer starts as the plain one; scaled by alpha / r (Section
4.1). A block whose linear layers are :class:`AdaptedLinear` can be trained two ways:

- *fully*: every parameter, W, its bias, A and B included (a strong device, EmbracingFL's split);
- *through its adapters*: A and B and every parameter outside an adapted layer (normalisations,
  embeddings, a head) train, while each adapted layer's W and bias stay frozen
  (:func:`adapter_frozen`). Its upload, gradients and optimizer state are those of the adapters.

Merging (Section 4.1, "No additional inference latency"): W' = W + (alpha / r) B A gives a plain
linear layer with the same function; the model a server exports has its adapters merged so
(``exporters.model_export.merged_model``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["AdaptedLinear", "adapter_frozen", "adapter_update_names", "has_adapters"]


class AdaptedLinear(nn.Module):
    """``nn.Linear`` plus, at ``rank`` > 0, a low-rank adapter B A scaled by ``alpha / rank``.

    ``weight`` and ``bias`` have ``nn.Linear``'s names, shapes and initialisation; ``lora_a``
    (rank x in) starts as ``nn.Linear`` initialises a weight (Kaiming uniform, as the paper's code
    does) and ``lora_b`` (out x rank) at zero."""

    mode_free = True  # the same function in training and evaluation mode (edge_sdk.trainer.mode_free)

    def __init__(self, in_features: int, out_features: int, rank: int = 0, alpha: float | None = None) -> None:
        super().__init__()
        if rank < 0:
            raise ValueError(f"adapter rank must be >= 0, not {rank}")
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(in_features)
        nn.init.uniform_(self.bias, -bound, bound)
        self.scale = (float(rank) if alpha is None else float(alpha)) / rank if rank else 0.0
        if rank:
            self.lora_a = nn.Parameter(torch.empty(rank, in_features))
            self.lora_b = nn.Parameter(torch.zeros(out_features, rank))
            nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = nn.functional.linear(x, self.weight, self.bias)
        if self.rank:
            out = out + nn.functional.linear(nn.functional.linear(x, self.lora_a), self.lora_b) * self.scale
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}"


def _adapted(modules: Iterable[tuple[str, nn.Module]]) -> list[tuple[str, AdaptedLinear]]:
    return [(n, m) for n, m in modules if isinstance(m, AdaptedLinear) and m.rank]


def has_adapters(model: nn.Module) -> bool:
    """Whether any layer of ``model`` carries an adapter."""
    return bool(_adapted(model.named_modules()))


def adapter_frozen(model: nn.Module, prefix: str = "") -> list[str]:
    """State names (with ``prefix``) of the parameters a device training ``model`` through its
    adapters keeps frozen: the weight and bias of every adapted layer."""
    return [f"{prefix}{n}.{p}" if n else f"{prefix}{p}" for n, _ in _adapted(model.named_modules())
            for p in ("weight", "bias")]


def adapter_update_names(model: nn.Module, split: int) -> list[str]:
    """State names of blocks [split, L) of a layered model that a device training them through
    their adapters changes and returns: every floating entry but :func:`adapter_frozen`'s."""
    frozen = set(adapter_frozen(model))
    state = model.state_dict()
    return [n for n in model.state_names(split) if n not in frozen and state[n].is_floating_point()]
