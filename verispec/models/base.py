"""The narrow model protocol every backend implements, and what a decoding step of one reads."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from verispec.cache import KVCache


@runtime_checkable
class CausalLM(Protocol):
    """A decoder that reads/writes a KVCache; see verispec.cache for the commit/rollback contract."""

    vocab_size: int
    device: torch.device
    dtype: torch.dtype

    def new_cache(self, max_len: int, batch: int = 1) -> KVCache: ...

    def forward(self, tokens: Tensor, cache: KVCache, *, last_n: int | None = None) -> Tensor:
        """tokens [B, T] at positions cache.length .. cache.length + T - 1 -> logits [B, T or last_n, V].

        Writes the new keys/values after the committed prefix and commits nothing.
        """
        ...


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights a one-token forward reads: every parameter except the embedding table (one row of it
    is read) — and the LM head counts fully even when tied to the embedding."""
    total = 0
    seen: set[int] = set()
    embed = getattr(model, "embed", None)
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if embed is not None and p is embed.weight and getattr(model, "lm_head", None) is not None \
                and model.lm_head.weight is not p:
            total += p.shape[-1] * p.element_size()  # one row
            continue
        total += p.numel() * p.element_size()
    for name, b in model.named_buffers():  # quantized weights, their scales, offsets and biases live in buffers
        if name.endswith(("weight", "scale", "scales", "codes", "units", "bias", "qweight", "scales_and_zeros")):
            total += b.numel() * b.element_size()
    return total
