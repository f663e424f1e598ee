"""A model over B cache rows: what the round (verispec.engine) calls to run a target or a draft forward.

`Rows` is the one interface: `forward(rows, chains)` runs row rows[b] over chains[b] in one call, writes their
keys/values after each row's committed length and commits nothing (the verispec.cache contract, per row).

  * `NativeRows` (the Llama-family model, verispec.models.llama): one `BatchKVCache`; a lone row runs the
    model's own single-sequence forward (so B = 1 is bit for bit what a plain decoding step computes), several
    rows run `forward_rows`, one forward over all of them, right-padded.
  * `LoopRows` (any other CausalLM, e.g. the transformers adapter): one cache per row, a forward per row.

Worked example of `forward_rows`, two rows, lengths (3, 5), new tokens (2, 1), so T = 2 and the keys read are
0 .. 6:
    row 0: tokens at positions 3, 4 (slots 3, 4); query 0 sees keys 0..3, query 1 sees 0..4
    row 1: token at position 5 (slot 5) + one pad (slot 6, never seen by a real query); query 0 sees 0..5
The pad's key/value land in a scratch slot past the row's end, which the next forward overwrites, exactly as
rejected drafts do. A row may bring a `Tree`: positions of its new tokens relative to its length and which new
tokens each one sees (lookahead's window, token trees); the committed prefix is always seen.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from verispec.cache import BatchKVCache, CacheFullError, CommitLog
from verispec.models.base import CausalLM
from verispec.models.llama import LlamaModel
from verispec.prefix import PrefixCache


@dataclass(frozen=True)
class Tree:
    """A row's new tokens as a tree: positions [T] offsets from the row's length, mask [T, K + T] bool (which of
    the row's last K committed tokens and of the new tokens each new token sees; K = 0 in a verification, K > 0
    where a drafter feeds a tree one depth at a time, its earlier depths provisionally committed). A chain is
    positions 0..T-1 with a causal [T, T] mask. Tokens before the last K are always seen."""

    positions: Tensor
    mask: Tensor


def tree_layout(parents: list[int]) -> Tree:
    """The Tree of [pending] + a proposal tree (parents[i] < i, -1 the pending token): node i sits at its depth
    (the root's children at 1) and sees the pending token, its ancestors and itself.

    Worked example, parents [-1, -1, 0]: nodes a, b under pending, c under a -> positions [0, 1, 1, 2] and c's
    mask row [1, 1, 0, 1] (pending, a, c)."""
    n = len(parents)
    depth = [0] * (n + 1)
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[0, 0] = True
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"node {i} has parent {parent}: a parent must come before its children")
        depth[i + 1] = depth[parent + 1] + 1
        mask[i + 1] = mask[parent + 1]
        mask[i + 1, i + 1] = True
    return Tree(positions=torch.tensor(depth, dtype=torch.long), mask=mask)


class Rows(Protocol):
    """A model and a KV cache of `rows` sequences, each with its own committed length."""

    model: CausalLM
    rows: int
    max_len: int  # tokens a row can commit
    capacity: int  # slots a row can hold, scratch included (max_len + slack)

    def length(self, r: int) -> int: ...
    def forward(self, rows: list[int], chains: list[list[int]], *, last_only: bool = False,
                layers: int | None = None, trees: list[Tree | None] | None = None,
                features: list[Tensor] | None = None, hidden: bool = False) -> Any:
        """Logits per row: [len(chains[b]), V], or [1, V] of the last token with last_only. features[b]
        [len(chains[b]), F]: inputs beside the tokens (a feature-level drafter). hidden: return (logits, hidden
        states) with each row's last-block outputs [len(chains[b]), H] (every position, also with last_only)."""
    def commit(self, r: int, n: int) -> None: ...
    def commit_path(self, r: int, offsets: list[int]) -> None:
        """Commit the slots the last forward wrote at offsets (a tree's accepted path), compacted; see
        BatchKVCache.commit_path."""
    def rollback(self, r: int, n: int) -> None: ...
    def free(self, r: int) -> None: ...
    def move(self, src: int, dst: int) -> None: ...
    def copy(self, src: int, dst: int) -> None:
        """Row dst becomes a copy of row src's committed tokens (src keeps them)."""
    def snapshot(self, r: int) -> tuple[Any, int]:
        """A copy of row r's committed tokens' cache, and its bytes: what restore() takes."""
    def restore(self, r: int, snapshot: Any, n: int) -> None:
        """Row r holds the first n tokens of a snapshot, committed."""


def make_rows(model: CausalLM, rows: int, max_len: int, slack: int) -> Rows:
    """NativeRows for the Llama-family model, else LoopRows."""
    if isinstance(model, LlamaModel):
        return NativeRows(model, rows, max_len, slack)
    return LoopRows(model, rows, max_len, slack)


def prefill_rows(target: Rows, rows: list[int], tokens: list[list[int]],
                 prefix: PrefixCache | None = None) -> list[Tensor | None]:
    """Write and commit tokens[i] into the empty row rows[i] (a prompt but its last token), every row in one
    forward: its overhead is paid once (most of a tiny model's time, or a batch of short prompts'). Rows with the
    same tokens (a request's n choices) are computed once and copied; with a prefix cache, a row starts from the
    longest stored prompt its tokens begin with, forwards only the rest, and is stored in turn. Returns each row's
    last-block outputs there [len(tokens[i]), H] (None where the model gives none, or no tokens). A row gets what a
    forward of its own would write where the model's rows do not depend on each other (the w4a8 kernel's; every
    query attends on its own)."""
    for r in rows:
        target.free(r)
    first: dict[tuple[int, ...], int] = {}  # each distinct prompt's first index: the one computed
    for i, t in enumerate(tokens):
        if t:
            first.setdefault(tuple(t), i)
    todo = sorted(first.values())
    out: list[Tensor | None] = [None] * len(rows)
    if not todo:
        return out
    reused: dict[int, Tensor | None] = {}  # index: the restored prefix's outputs
    for i in todo:
        found = prefix.match(tokens[i]) if prefix is not None else None
        if found is not None:
            entry, n = found
            n = min(n, len(tokens[i]) - 1)  # the last token is forwarded: it brings the row's outputs up to date
            if n > 0:
                target.restore(rows[i], entry.snapshot, n)
                reused[i] = None if entry.hidden is None else entry.hidden[:n]
    start = {i: target.length(rows[i]) for i in todo}
    _, states = target.forward([rows[i] for i in todo], [tokens[i][start[i]:] for i in todo], last_only=True,
                               hidden=True)
    for i, state in zip(todo, states):
        target.commit(rows[i], len(tokens[i]) - start[i])
        if i in reused:
            before = reused[i]
            state = None if before is None or state is None else torch.cat([before, state])
        out[i] = state
        if prefix is not None:
            snapshot, nbytes = target.snapshot(rows[i])
            prefix.put(tokens[i], snapshot, state, nbytes)
    for i, t in enumerate(tokens):
        j = first.get(tuple(t), i)
        if j != i:
            target.copy(rows[j], rows[i])
            state = out[j]
            out[i] = None if state is None else state.clone()
    return out


class NativeRows:
    def __init__(self, model: LlamaModel, rows: int, max_len: int, slack: int) -> None:
        self.model, self.rows = model, rows
        self.cache = model.new_batch_cache(rows, max_len, slack)
        self.max_len, self.capacity = self.cache.max_len, self.cache.capacity

    def length(self, r: int) -> int:
        return self.cache.lengths[r]

    def forward(self, rows: list[int], chains: list[list[int]], *, last_only: bool = False,
                layers: int | None = None, trees: list[Tree | None] | None = None,
                features: list[Tensor] | None = None, hidden: bool = False) -> Any:
        if len(rows) > 1:
            return forward_rows(self.model, chains, self.cache, rows, last_only=last_only, layers=layers, trees=trees,
                                features=features, hidden=hidden)
        tree = trees[0] if trees else None
        x = torch.tensor([chains[0]], dtype=torch.long, device=self.model.device)
        out = self.model.forward(x, self.cache.row(rows[0]), last_n=1 if last_only else None, layers=layers,
                                 positions=None if tree is None else tree.positions,
                                 tree_mask=None if tree is None else tree.mask,
                                 features=None if features is None else features[0][None], hidden=hidden)
        return ([out[0][0]], [out[1][0]]) if hidden else [out[0]]

    def commit(self, r: int, n: int) -> None:
        self.cache.commit(r, n)

    def commit_path(self, r: int, offsets: list[int]) -> None:
        self.cache.commit_path(r, offsets)

    def rollback(self, r: int, n: int) -> None:
        self.cache.rollback(r, n)

    def free(self, r: int) -> None:
        self.cache.free(r)

    def move(self, src: int, dst: int) -> None:
        self.cache.move(src, dst)

    def copy(self, src: int, dst: int) -> None:
        self.cache.copy(src, dst)

    def snapshot(self, r: int) -> tuple[Any, int]:
        return self.cache.snapshot(r)

    def restore(self, r: int, snapshot: Any, n: int) -> None:
        self.cache.restore(r, snapshot, n)


class LoopRows:
    """Any CausalLM: a cache per row from model.new_cache, one forward per row. No trees, no layer ranges."""

    def __init__(self, model: CausalLM, rows: int, max_len: int, slack: int) -> None:
        self.model, self.rows, self.capacity = model, rows, max_len + slack
        self.caches: list[CommitLog] = [model.new_cache(max_len + slack) for _ in range(rows)]
        self.max_len = max_len

    def length(self, r: int) -> int:
        return self.caches[r].length

    def forward(self, rows: list[int], chains: list[list[int]], *, last_only: bool = False,
                layers: int | None = None, trees: list[Tree | None] | None = None,
                features: list[Tensor] | None = None, hidden: bool = False) -> Any:
        if layers is not None or (trees and any(t is not None for t in trees)) or features is not None:
            raise ValueError(f"{type(self.model).__name__} runs neither layer ranges, token trees nor input features: "
                             "those strategies need the native Llama-family model")
        out = []
        for r, chain in zip(rows, chains):
            x = torch.tensor([chain], dtype=torch.long, device=self.model.device)
            out.append(self.model.forward(x, self.caches[r], last_n=1 if last_only else None)[0])
        return (out, [None] * len(out)) if hidden else out  # this model gives no hidden states

    def commit(self, r: int, n: int) -> None:
        if self.caches[r].length + n > self.max_len:
            raise ValueError(f"cannot commit {n} tokens at length {self.caches[r].length} (max {self.max_len})")
        self.caches[r].commit(n)

    def commit_path(self, r: int, offsets: list[int]) -> None:
        if offsets != list(range(len(offsets))):  # only a chain: these rows run no trees
            raise ValueError(f"{type(self.model).__name__} cannot keep a tree's path")
        self.commit(r, len(offsets))

    def rollback(self, r: int, n: int) -> None:
        self.caches[r].rollback(n)

    def free(self, r: int) -> None:
        self.caches[r].rollback(self.caches[r].length)

    def move(self, src: int, dst: int) -> None:
        self.caches[src], self.caches[dst] = self.caches[dst], self.caches[src]
        self.free(src)

    def copy(self, src: int, dst: int) -> None:
        self.caches[dst] = copy.deepcopy(self.caches[src])

    def snapshot(self, r: int) -> tuple[Any, int]:
        snap = copy.deepcopy(self.caches[r])
        return snap, _tensor_bytes(snap)

    def restore(self, r: int, snapshot: Any, n: int) -> None:
        if not 0 < n <= snapshot.length or n > self.max_len:
            raise ValueError(f"cannot restore {n} tokens of a {snapshot.length}-token snapshot (max {self.max_len})")
        self.caches[r] = copy.deepcopy(snapshot)
        self.caches[r].rollback(snapshot.length - n)


def _tensor_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes of the tensors an object holds (a cache of another library's making), each counted once."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    try:
        fields = vars(obj)
    except TypeError:  # no attributes of its own (an int, a slotted object)
        return 0
    return sum(_tensor_bytes(v, seen) for v in fields.values())


def pad_rows(chains: list[list[int]], pad: int = 0) -> tuple[Tensor, list[int]]:
    """Right-pad token lists into [n, T]; return it with each row's real length."""
    width = max(len(c) for c in chains)
    tokens = torch.full((len(chains), width), pad, dtype=torch.long)
    for b, c in enumerate(chains):
        tokens[b, : len(c)] = torch.tensor(c, dtype=torch.long)
    return tokens, [len(c) for c in chains]


@torch.inference_mode()
def forward_rows(model: LlamaModel, chains: list[list[int]], cache: BatchKVCache,
                 rows: list[int] | None = None, *, last_only: bool = False, layers: int | None = None,
                 trees: list[Tree | None] | None = None, features: list[Tensor] | None = None,
                 hidden: bool = False) -> Any:
    """One forward over `rows` of `cache` (default 0 .. n-1), row rows[b] feeding chains[b] (each non-empty).

    Returns per row the logits [len(chains[b]), V] of its real tokens ([1, V] of the last with `last_only`: a
    draft step, the LM head skips the rest). `layers`: run the first `layers` blocks only (self-speculation).
    `trees[b]`: row b's new tokens as a Tree (default a causal chain). Rows 0 .. n-1 are read as slices; any
    other set is gathered (a copy of their keys/values per layer).
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
    read = int(slots.max()) + 1
    keys = torch.arange(read, dtype=torch.long)
    # Causal by default: query (b, i) sees keys 0 .. start_b + i (a pad sees its own slot, never a NaN row).
    mask = keys[None, None, :] <= slots[:, :, None]  # [n, T, S]
    # Pads take position 0 (any valid rope row would do: no real query ever sees a pad's key).
    positions = torch.where(real, slots, torch.zeros_like(slots))
    for b, tree in enumerate(trees or []):
        if tree is None:
            continue
        lb, sb = lens[b], int(starts[b])
        positions[b, :lb] = sb + tree.positions.to(torch.long).cpu()
        back = tree.mask.shape[1] - lb  # K: committed slots the tree's mask reaches back over
        mask[b, :lb, sb - back : sb + lb] = tree.mask.to(torch.bool).cpu()
    # each key slot's position: its index, but for the new tokens (pads at 0, where no real query sees them)
    key_positions = keys.expand(n, read).scatter(1, slots, positions)  # [n, S]
    view = cache.rows_view(rows, slots, read)
    # rope rows and attention per layer, each query attended as a lone sequence's forward attends it
    plan = model.layer_plan(positions, key_positions, mask[:, None].to(device), n)  # mask [n, 1, T, S]
    feats = None
    if features is not None:  # right-padded like the tokens
        feats = torch.zeros(n, t, features[0].shape[-1], dtype=features[0].dtype, device=device)
        for b, f in enumerate(features):
            feats[b, : f.shape[0]] = f
    x, h = model.run_layers(model.inputs(tokens, feats), view, plan, layers, hidden)
    states = [h[b, : lens[b]] for b in range(n)]
    if last_only:
        x = x[torch.arange(n, device=device), torch.tensor(lens, device=device) - 1][:, None]  # [n, 1, H]
        lens = [1] * n
    logits = model.lm_head(model.norm(x))  # [n, T or 1, V]
    out = [logits[b, : lens[b]] for b in range(n)]
    return (out, states) if hidden else out
