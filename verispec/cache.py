"""Preallocated KV caches with explicit commit / rollback: one sequence (`KVCache`) or many rows (`BatchKVCache`).

A forward pass writes keys and values for its new tokens at slots [length, length + T) and reads
slots [0, length + T). Nothing is committed by the forward itself: the caller decides after verification
how many of those T slots are real (`commit(n)`), and the rest are scratch that the next forward
overwrites. So a rejected draft costs nothing to undo, and no prefix is ever re-run.

A `BatchKVCache` keeps one committed length per row; `row(r)` is one row behind the single-sequence interface
(so a lone sequence runs the model's ordinary forward), and `rows_view(...)` is the explicit description of one
batched forward (which rows, which slot each new token writes, how many keys it reads), handed to the model's
layers for that forward only: the cache itself holds no per-call state.
"""

from __future__ import annotations

import torch
from torch import Tensor


class CacheFullError(RuntimeError):
    pass


Plan = tuple[Tensor, Tensor, int]  # one forward's cache rows [B], slots [B, T] its new tokens write, keys read


def contiguous_plan(first_row: int, batch: int, start: int, t: int, device: torch.device) -> Plan:
    """Rows first_row .. first_row + batch - 1 each write their t new tokens at slots start .. start + t - 1."""
    rows = torch.arange(first_row, first_row + batch, device=device)
    slots = torch.arange(start, start + t, device=device).expand(batch, t).contiguous()
    return rows, slots, start + t


class CommitLog:
    """The commit/rollback bookkeeping every single-sequence cache shares: how many written tokens are real."""

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

    def layer_kv(self, layer: int) -> tuple[Tensor, Tensor]:
        """The layer's whole key and value buffers [batch, kv_heads, max_len, head_dim], for a compiled layer that
        writes and reads them itself following `plan`."""
        return self.k[layer], self.v[layer]

    def buffers(self) -> tuple[Tensor, Tensor]:
        """Every layer's buffers [layers, batch, kv_heads, max_len, head_dim], for compiled layers run in one call."""
        return self.k, self.v

    def plan(self, batch: int, t: int) -> Plan:
        """What `write` does for a forward of t new tokens, as explicit rows, slots and keys read."""
        if self.length + t > self.max_len:
            raise CacheFullError(f"sequence of {self.length + t} tokens exceeds the cache size of {self.max_len}")
        return contiguous_plan(0, batch, self.length, t, self.k.device)

    def reset(self) -> None:
        self.length = 0


class BatchKVCache:
    """Keys/values [layers, rows, kv_heads, capacity, head_dim] with one committed length per row.

    capacity = max_len + slack: a forward may write up to `slack` scratch slots (pads, drafts, a lookahead
    window) past max_len, but only max_len tokens of a row are ever committed.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_len: int, *, rows: int, slack: int = 16,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        self.max_len = max_len
        self.capacity = max_len + slack
        shape = (n_layers, rows, n_kv_heads, self.capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = [0] * rows  # committed tokens per row

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

    def commit_path(self, r: int, offsets: list[int]) -> None:
        """Keep the slots at length + offsets[j] (increasing, offsets[j] >= j), moved to length + j, and commit
        them: a token tree's accepted path, whose nodes the forward wrote wherever the tree put them.

        Worked example: a forward wrote [pending, a, b, c] at slots L .. L+3, b's parent being pending; keeping
        pending and b is offsets [0, 2]: slot L+2 moves to L+1 and the length becomes L+2. A destination never
        overwrites a source still to be read (each moves down, in order)."""
        if any(o < j for j, o in enumerate(offsets)) or offsets != sorted(set(offsets)):
            raise ValueError(f"path offsets must increase with offsets[j] >= j, got {offsets}")
        start = self.lengths[r]
        if offsets and start + offsets[-1] >= self.capacity:
            raise ValueError(f"path offset {offsets[-1]} past the cache's {self.capacity} slots (length {start})")
        moved = [(start + j, start + o) for j, o in enumerate(offsets) if o != j]
        if moved:
            dst = torch.tensor([d for d, _ in moved], device=self.k.device)
            src = torch.tensor([s for _, s in moved], device=self.k.device)
            for t in (self.k, self.v):
                t[:, r, :, dst] = t[:, r, :, src]  # the right side is gathered (a copy) before the write
        self.commit(r, len(offsets))

    def free(self, r: int) -> None:
        self.lengths[r] = 0

    def move(self, src: int, dst: int) -> None:
        """Copy row src's committed keys/values into row dst (to keep live rows packed); src becomes free."""
        self.copy(src, dst)
        self.lengths[src] = 0

    def copy(self, src: int, dst: int) -> None:
        """Row dst becomes a copy of row src's committed keys/values (src keeps them): rows that start from the
        same prompt share one prefill."""
        n = self.lengths[src]
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.lengths[dst] = n

    def snapshot(self, r: int) -> tuple[tuple[Tensor, Tensor], int]:
        """A copy of row r's committed keys/values, and its bytes (for verispec.prefix)."""
        n = self.lengths[r]
        k, v = self.k[:, r, :, :n].clone(), self.v[:, r, :, :n].clone()
        return (k, v), 2 * k.numel() * k.element_size()

    def restore(self, r: int, snapshot: tuple[Tensor, Tensor], n: int) -> None:
        """Row r holds the first n tokens of a snapshot, committed."""
        k, v = snapshot
        if not 0 < n <= k.shape[2] or n > self.max_len:
            raise ValueError(f"cannot restore {n} tokens of a {k.shape[2]}-token snapshot (max {self.max_len})")
        self.k[:, r, :, :n] = k[:, :, :n]
        self.v[:, r, :, :n] = v[:, :, :n]
        self.lengths[r] = n

    def rows_view(self, rows: list[int], slots: Tensor, read: int) -> "RowsView":
        """The write/read plan of one batched forward: rows[b] writes its new token i at slots[b, i]."""
        if int(slots.max()) >= self.capacity:
            raise CacheFullError(f"a batched forward needs {int(slots.max()) + 1} slots; the cache has {self.capacity}")
        return RowsView(self, rows, slots, read)


class RowsView:
    """One batched forward's view of a BatchKVCache (made by `rows_view`, used by the layers, then dropped)."""

    def __init__(self, cache: BatchKVCache, rows: list[int], slots: Tensor, read: int) -> None:
        self.cache, self.read = cache, read
        self.prefix = rows == list(range(len(rows)))  # rows 0 .. n-1 are read as a slice, not gathered
        self.index = torch.tensor(rows, dtype=torch.long, device=cache.k.device)  # [n]
        self.slots = slots.to(cache.k.device)  # [n, T]

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v [n, kv_heads, T, head_dim] -> all readable keys/values [n, kv_heads, read, head_dim]."""
        c, rows = self.cache, self.index[:, None]  # [n, 1]
        c.k[layer][rows, :, self.slots] = k.transpose(1, 2).to(c.k.dtype)  # the indexed view is [n, T, kv, D]
        c.v[layer][rows, :, self.slots] = v.transpose(1, 2).to(c.v.dtype)
        if self.prefix:
            n = k.shape[0]
            return c.k[layer, :n, :, : self.read], c.v[layer, :n, :, : self.read]
        return c.k[layer][self.index, :, : self.read], c.v[layer][self.index, :, : self.read]

    def layer_kv(self, layer: int) -> tuple[Tensor, Tensor]:
        return self.cache.k[layer], self.cache.v[layer]

    def buffers(self) -> tuple[Tensor, Tensor]:
        return self.cache.k, self.cache.v

    def plan(self, batch: int, t: int) -> Plan:
        return self.index, self.slots, self.read


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

    def layer_kv(self, layer: int) -> tuple[Tensor, Tensor]:
        return self.batch.k[layer], self.batch.v[layer]

    def buffers(self) -> tuple[Tensor, Tensor]:
        return self.batch.k, self.batch.v

    def plan(self, batch: int, t: int) -> Plan:
        if self.length + t > self.batch.capacity:
            raise CacheFullError(f"sequence of {self.length + t} tokens exceeds the cache size of {self.max_len}")
        return contiguous_plan(self.r, 1, self.length, t, self.batch.k.device)

    def commit(self, n: int) -> None:
        self.batch.commit(self.r, n)

    def rollback(self, n: int) -> None:
        self.batch.rollback(self.r, n)

    def reset(self) -> None:
        self.batch.free(self.r)
