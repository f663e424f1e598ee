"""Recent prompts' keys and values, kept so that a prompt which starts the same way prefills only the rest.

A chat client sends the whole conversation again at every turn, and many requests share a system prompt: without
this, each request prefills every token of it (on a 2-core CPU ~14 ms a token with the AVX2 build, so a 1000-token
conversation waits ~14 s for its first token). `PrefixCache` holds, for the last prompts a batch prefilled and the
sequences that ended (prompt and answer), a copy of their rows' keys/values and last-block outputs
(`Rows.snapshot`), within a byte budget, least recently used out. A new prompt takes the longest stored prefix of
its own tokens (`Rows.restore`) and prefills the remainder after it: a conversation's next turn, only the new
message.

Exactness: a token's key and value depend only on the tokens before it, and the native model computes each of them
the same way in a prefill of one token or of many (the w4a8 kernel's rows do not depend on each other, and every
query attends on its own), so a restored prefix holds what the prompt's own prefill would have written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor


@dataclass
class Prefix:
    """A stored prompt: its tokens, its row's snapshot (Rows.snapshot) and last-block outputs [len(tokens), H]."""

    tokens: tuple[int, ...]
    snapshot: Any
    hidden: Tensor | None
    nbytes: int


class PrefixCache:
    """Prompts' keys/values within `budget` bytes, the least recently used dropped first. Only prompts of at least
    `min_tokens` are stored or reused: a short one costs less to prefill than to look up and copy."""

    def __init__(self, budget: int, min_tokens: int = 16) -> None:
        if budget < 0:
            raise ValueError(f"the prefix cache's budget must be >= 0 bytes, got {budget}")
        self.budget, self.min_tokens = budget, max(1, min_tokens)
        self.entries: list[Prefix] = []  # least recently used first
        self.hits = self.reused_tokens = 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def match(self, tokens: list[int]) -> tuple[Prefix, int] | None:
        """The stored prompt sharing the longest prefix with `tokens` (at least min_tokens) and that length."""
        best, best_n = None, 0
        for entry in self.entries:
            n = _common(entry.tokens, tokens)
            if n > best_n:
                best, best_n = entry, n
        if best is None or best_n < self.min_tokens:
            return None
        self.entries.remove(best)
        self.entries.append(best)  # most recently used
        self.hits += 1
        self.reused_tokens += best_n
        return best, best_n

    def put(self, tokens: list[int], snapshot: Any, hidden: Tensor | None, nbytes: int) -> None:
        """Store a prompt's row (tokens: what the snapshot holds; nbytes: the snapshot's bytes, the features' are
        added here). A stored prompt that this one extends, or the same one, is replaced; prompts past the budget
        are dropped, oldest first."""
        if hidden is not None:
            nbytes += hidden.numel() * hidden.element_size()
        if len(tokens) < self.min_tokens or nbytes > self.budget:
            return
        key = tuple(tokens)
        self.entries = [e for e in self.entries if e.tokens != key[: len(e.tokens)]]
        self.entries.append(Prefix(key, snapshot, hidden, nbytes))
        while self.nbytes > self.budget:
            self.entries.pop(0)


def _common(a: tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
