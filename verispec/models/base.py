"""The narrow model protocol every backend implements."""

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
