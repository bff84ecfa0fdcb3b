"""A decoder-only transformer language model, next-character prediction (the task of ``char_lstm``).

Blocks (EmbracingFL's split: a weak device trains the last blocks and the head, a strong one all):

- ``embed``: token embedding plus a learned position embedding, (N, T) ids -> (N, T, D);
- ``block1`` ... ``blockL``: pre-LayerNorm transformer blocks (Vaswani et al. 2017; the GPT-2
  arrangement): x + attention(LN(x)), then x + MLP(LN(x)), with causal multi-head self-attention
  and a GELU MLP of 4 D;
- ``head``: LayerNorm and a linear layer over the vocabulary on the last position: the logits of
  the character after the window.

The causal mask is built in ``forward`` from the sequence length (a float buffer would be a
constant input of every training graph; exporters/train_export.py says why it refuses one that
is kept in the state). No dropout: a training graph cannot draw the same masks as torch.

Each block's four linear layers (attention's qkv and output projections, the MLP's two) are
:class:`~edge_sdk.models.adapters.AdaptedLinear`: at ``rank`` > 0 they carry LoRA adapters, so a
device may train a block through its adapters instead of whole (edge_sdk.models.adapters). The
attention matrix of a block is H T^2 per sample (softmax's output, kept for backward):
profiles.accounting counts it (``BlockCost.attention_elements``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from edge_sdk.models.adapters import AdaptedLinear
from edge_sdk.models.layered import LayeredModel

__all__ = ["CausalSelfAttention", "TokenEmbedding", "TransformerBlock", "char_transformer", "char_transformer_phone",
           "char_transformer_tiny"]


class TokenEmbedding(nn.Module):
    """Token ids (N, T) -> token embedding + position embedding (N, T, D); GPT-2's 0.02 initialisation."""

    mode_free = True  # the same function in training and evaluation mode (edge_sdk.trainer.mode_free)

    def __init__(self, vocab: int, context: int, dim: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Parameter(torch.empty(context, dim))
        nn.init.normal_(self.tokens.weight, std=0.02)
        nn.init.normal_(self.positions, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tokens(x) + self.positions[: x.shape[1]]


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t attends to positions <= t.

    softmax(Q K^T / sqrt(d_head) + M) V with M = -inf above the diagonal (Vaswani et al., Eq. 1),
    written out in matmuls rather than ``scaled_dot_product_attention`` so the training graph and
    the memory accounting see the (N, H, T, T) attention matrix as what it is."""

    mode_free = True  # the same function in training and evaluation mode (edge_sdk.trainer.mode_free)

    def __init__(self, dim: int, heads: int, rank: int = 0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"width {dim} is not a multiple of {heads} heads")
        self.heads = heads
        self.qkv = AdaptedLinear(dim, 3 * dim, rank)
        self.proj = AdaptedLinear(dim, dim, rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(x).reshape(n, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(d // h))
        mask = torch.full((t, t), float("-inf"), dtype=x.dtype, device=x.device).triu(1)
        weights = torch.softmax(scores + mask, dim=-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(n, t, d))


class TransformerBlock(nn.Module):
    """x + attention(LN(x)), then x + MLP(LN(x)); the MLP is D -> 4 D -> D with GELU."""

    mode_free = True  # the same function in training and evaluation mode (edge_sdk.trainer.mode_free)

    def __init__(self, dim: int, heads: int, rank: int = 0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = CausalSelfAttention(dim, heads, rank)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = AdaptedLinear(dim, 4 * dim, rank)
        self.fc2 = AdaptedLinear(4 * dim, dim, rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


class LastPositionHead(nn.Module):
    """LayerNorm and a linear layer over the vocabulary, on the last position only."""

    mode_free = True  # the same function in training and evaluation mode (edge_sdk.trainer.mode_free)

    def __init__(self, dim: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x[:, -1]))


def _transformer(name: str, *, vocab: int, context: int, dim: int, heads: int, layers: int,
                 rank: int) -> LayeredModel:
    blocks: list[tuple[str, nn.Module]] = [("embed", TokenEmbedding(vocab, context, dim))]
    blocks += [(f"block{i}", TransformerBlock(dim, heads, rank)) for i in range(1, layers + 1)]
    blocks.append(("head", LastPositionHead(dim, vocab)))
    model = LayeredModel(name, blocks, input_shape=(context,), input_dtype=torch.int64, num_outputs=vocab)
    model.input_high = vocab
    model.adapter_rank = rank
    return model


def char_transformer(vocab: int = 65, context: int = 40, dim: int = 64, heads: int = 4, layers: int = 4,
                     rank: int = 0) -> LayeredModel:
    """6 blocks: embed, 4 transformer blocks of width 64 with 4 heads, head; 40 characters of
    context (the ``tinyshakespeare`` windows) over Tiny Shakespeare's 65 characters; 209k parameters.

    ``rank`` > 0 adds LoRA adapters of that rank to every block's linear layers (the zoo's
    ``char_transformer@rank=8``; docs/models.md, "Model options")."""
    return _transformer("char_transformer", vocab=vocab, context=context, dim=dim, heads=heads, layers=layers,
                        rank=rank)


def char_transformer_tiny(vocab: int = 65, context: int = 40, dim: int = 32, heads: int = 2, layers: int = 2,
                          rank: int = 0) -> LayeredModel:
    """4 blocks: embed, 2 transformer blocks of width 32 with 2 heads, head (29k parameters):
    small enough that every split exports in seconds (tests)."""
    return _transformer("char_transformer_tiny", vocab=vocab, context=context, dim=dim, heads=heads, layers=layers,
                        rank=rank)


def char_transformer_phone(vocab: int = 65, context: int = 40, dim: int = 512, heads: int = 8, layers: int = 8,
                           rank: int = 0) -> LayeredModel:
    """10 blocks: embed, 8 transformer blocks of width 512 with 8 heads, head; 25M parameters
    (100 MB in float32): what a strong phone fine-tunes, and a weak one through adapters. A longer
    context is a model option (``char_transformer_phone@context=128``) for text of a device's own."""
    return _transformer("char_transformer_phone", vocab=vocab, context=context, dim=dim, heads=heads, layers=layers,
                        rank=rank)
