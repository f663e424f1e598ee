"""A preallocated KV cache with explicit commit / rollback.

A forward pass writes keys and values for its new tokens at slots [length, length + T) and reads
slots [0, length + T). Nothing is committed by the forward itself: the caller decides after verification
how many of those T slots are real (`commit(n)`), and the rest are scratch that the next forward
overwrites. So a rejected draft costs nothing to undo, and no prefix is ever re-run.
"""

from __future__ import annotations

import torch
from torch import Tensor


class CommitLog:
    """The commit/rollback bookkeeping every cache shares: how many written tokens are real."""

    length: int
    max_len: int

    def commit(self, n: int) -> None:
        """Keep n of the slots the last forward wrote (n may be 0)."""
        if n < 0 or self.length + n > self.max_len:
            raise ValueError(f"cannot commit {n} tokens at length {self.length} (max {self.max_len})")
        self.length += n

    def rollback(self, n: int) -> None:
        """Forget the last n committed tokens."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot roll back {n} of {self.length} tokens")
        self.length -= n


class KVCache(CommitLog):
    """Keys/values for one model: [layers, batch, kv_heads, max_len, head_dim]."""

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        max_len: int,
        *,
        batch: int = 1,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0  # committed tokens

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v ([B, kv_heads, T, head_dim]) after the committed prefix; return all visible keys/values."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise CacheFullError(f"sequence of {end} tokens exceeds the cache size of {self.max_len}")
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def reset(self) -> None:
        self.length = 0


class CacheFullError(RuntimeError):
    pass
