"""Batched forwards over sequences of different lengths, for serving several requests at once.

One `BatchKVCache` holds up to `rows` sequences, each with its own committed length. Live sequences occupy
rows 0 .. n-1 (the caller keeps them packed with `move`), so a batched forward reads plain slices, never a
gather. A round runs all n rows in one forward: row b feeds t_b new tokens (right-padded to T), query i of
row b sits at position length_b + i and sees the keys 0 .. length_b + i of its own row only.

Worked example, two rows, lengths (3, 5), new tokens (2, 1), so T = 2 and the keys read are 0 .. 6:
    row 0: tokens at positions 3, 4 (slots 3, 4); query 0 sees keys 0..3, query 1 sees 0..4
    row 1: token at position 5 (slot 5) + one pad (slot 6, never seen by a real query); query 0 sees 0..5
The pad's key/value land in a scratch slot past the row's end, which the next forward overwrites, exactly as
rejected drafts do in verispec.cache.

`RowCache` is one row seen through the single-sequence `KVCache` interface, so a lone sequence (and every
prefill) runs the model's ordinary forward: bit for bit what `verispec generate` computes.

Only the native Llama-family model (verispec.models.llama) is supported: `forward_rows` drives its blocks
directly and leaves LlamaModel.forward untouched.
"""

from __future__ import annotations

import torch
from torch import Tensor

from verispec.cache import CacheFullError
from verispec.models.llama import EXACT_ATTENTION_MAX, LlamaModel, seen_prefixes


class BatchKVCache:
    """Keys/values [layers, rows, kv_heads, capacity, head_dim] with one committed length per row.

    capacity = max_len + slack: a forward may write up to `slack` scratch slots (pads, drafts) past max_len.
    """

    def __init__(self, model: LlamaModel, rows: int, max_len: int, slack: int = 16) -> None:
        cfg = model.cfg
        self.max_len = min(max_len, cfg.max_position_embeddings)
        self.capacity = self.max_len + slack
        shape = (cfg.num_hidden_layers, rows, cfg.num_key_value_heads, self.capacity, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=model.attention_dtype, device=model.device)
        self.v = torch.zeros(shape, dtype=model.attention_dtype, device=model.device)
        self.lengths = [0] * rows  # committed tokens per row
        # Set by forward_rows for the duration of one batched forward:
        self._rows: Tensor | None = None  # [n] the rows in this forward
        self._prefix = False  # they are rows 0 .. n-1 (read with a slice, not a gather)
        self._slots: Tensor | None = None  # [n, T] slot written by each new token
        self._read = 0  # keys 0 .. _read - 1 are returned

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def row(self, r: int) -> "RowCache":
        return RowCache(self, r)

    def commit(self, r: int, n: int) -> None:
        if n < 0 or self.lengths[r] + n > self.max_len:
            raise ValueError(f"cannot commit {n} tokens at length {self.lengths[r]} (max {self.max_len})")
        self.lengths[r] += n

    def rollback(self, r: int, n: int) -> None:
        if not 0 <= n <= self.lengths[r]:
            raise ValueError(f"cannot roll back {n} of {self.lengths[r]} tokens")
        self.lengths[r] -= n

    def free(self, r: int) -> None:
        self.lengths[r] = 0

    def move(self, src: int, dst: int) -> None:
        """Copy row src's committed keys/values into row dst (to keep live rows packed); src becomes free."""
        n = self.lengths[src]
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.lengths[dst], self.lengths[src] = n, 0

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Batched write (inside forward_rows): k, v [n, kv_heads, T, head_dim] -> keys/values [n, kv, S, D]."""
        assert self._rows is not None and self._slots is not None, "write() outside forward_rows"
        rows = self._rows[:, None]  # [n, 1]
        self.k[layer][rows, :, self._slots] = k.transpose(1, 2).to(self.k.dtype)  # indexed view is [n, T, kv, D]
        self.v[layer][rows, :, self._slots] = v.transpose(1, 2).to(self.v.dtype)
        if self._prefix:
            n = k.shape[0]
            return self.k[layer, :n, :, : self._read], self.v[layer, :n, :, : self._read]
        return self.k[layer][self._rows, :, : self._read], self.v[layer][self._rows, :, : self._read]


class RowCache:
    """One row of a BatchKVCache behind the single-sequence KVCache interface (length, write, commit)."""

    def __init__(self, batch: BatchKVCache, r: int) -> None:
        self.batch, self.r = batch, r
        self.max_len = batch.max_len

    @property
    def length(self) -> int:
        return self.batch.lengths[self.r]

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        start = self.length
        end = start + k.shape[2]
        if end > self.batch.capacity:
            raise CacheFullError(f"sequence of {end} tokens exceeds the cache size of {self.max_len}")
        b, r = self.batch, self.r
        b.k[layer, r : r + 1, :, start:end] = k
        b.v[layer, r : r + 1, :, start:end] = v
        return b.k[layer, r : r + 1, :, :end], b.v[layer, r : r + 1, :, :end]

    def commit(self, n: int) -> None:
        self.batch.commit(self.r, n)

    def rollback(self, n: int) -> None:
        self.batch.rollback(self.r, n)

    def reset(self) -> None:
        self.batch.free(self.r)


def pad_rows(chains: list[list[int]], pad: int = 0) -> tuple[Tensor, list[int]]:
    """Right-pad token lists into [n, T]; return it with each row's real length."""
    width = max(len(c) for c in chains)
    tokens = torch.full((len(chains), width), pad, dtype=torch.long)
    for b, c in enumerate(chains):
        tokens[b, : len(c)] = torch.tensor(c, dtype=torch.long)
    return tokens, [len(c) for c in chains]


@torch.inference_mode()
def forward_rows(model: LlamaModel, chains: list[list[int]], cache: BatchKVCache,
                 rows: list[int] | None = None, *, last_only: bool = False) -> list[Tensor]:
    """One forward over `rows` of `cache` (default 0 .. n-1), row rows[b] feeding chains[b] (each non-empty).

    Returns per row the logits [len(chains[b]), V] of its real tokens. Writes keys/values after each row's
    committed length and commits nothing (the verispec.cache contract, per row). Rows 0 .. n-1 are read as
    slices; any other set of rows is gathered (a copy of their keys/values per layer). With `last_only`, each
    row gets only its last real token's logits [1, V] (a draft step: the LM head skips the rest).
    """
    n = len(chains)
    rows = list(range(n)) if rows is None else rows
    assert len(rows) == n and len(set(rows)) == n, rows
    tokens, lens = pad_rows(chains)
    device = model.device
    tokens = tokens.to(device)
    t = tokens.shape[1]
    starts = torch.tensor([cache.lengths[r] for r in rows], dtype=torch.long)  # [n]
    offsets = torch.arange(t, dtype=torch.long)
    slots = starts[:, None] + offsets[None, :]  # [n, T]
    if int(slots.max()) >= cache.capacity:
        raise CacheFullError(f"a batched forward needs {int(slots.max()) + 1} slots; the cache has {cache.capacity}")
    real = offsets[None, :] < torch.tensor(lens)[:, None]  # [n, T]
    # Pads take position 0 (any valid rope row would do: no real query ever sees a pad's key).
    positions = torch.where(real, slots, torch.zeros_like(slots))
    read = int(slots.max()) + 1
    keys = torch.arange(read, dtype=torch.long)
    mask = keys[None, None, :] <= slots[:, :, None]  # [n, T, S]: query (b, i) sees keys 0 .. start_b + i
    cos = model.cos[positions].to(model.dtype)[:, None].to(device)  # [n, 1, T, D], broadcast over heads
    sin = model.sin[positions].to(model.dtype)[:, None].to(device)
    cache._rows = torch.tensor(rows, dtype=torch.long, device=device)
    cache._prefix = rows == list(range(n))
    cache._slots, cache._read = slots.to(device), read
    # Small rounds attend each query alone, as a lone sequence's forward does (models.llama.EXACT_ATTENTION_MAX).
    seen = [seen_prefixes(m) for m in mask] if n * t <= EXACT_ATTENTION_MAX else None
    try:
        x = model.embed(tokens)
        mask = mask[:, None].to(device)  # [n, 1, T, S]
        for i, layer in enumerate(model.layers):
            x = layer(x, i, cache, cos, sin, mask, seen)
        if last_only:
            x = x[torch.arange(n, device=device), torch.tensor(lens, device=device) - 1][:, None]  # [n, 1, H]
            lens = [1] * n
        logits = model.lm_head(model.norm(x))  # [n, T or 1, V]
    finally:
        cache._rows, cache._slots, cache._read = None, None, 0
    return [logits[b, : lens[b]] for b in range(n)]
