"""Prompt lookup decoding (Saxena 2023): draft by copying what followed the last occurrence of the current suffix.

No model and no training: when the output repeats its input (renaming a variable, quoting, editing code), the
tokens after an earlier occurrence of the last n tokens are a good guess. Worked example, ngram_max 3, gamma 2:

    sequence  5 7 8 9 | 1 5 7 8        the suffix (5, 7, 8) occurred at positions 0..2, followed by 9 1
    proposal  9 1

The proposal is deterministic (q = None): the verifier treats it as one-hot q, accepting x with probability p(x)
and resampling from p without x on rejection, so the target's law is kept exactly.
"""

from __future__ import annotations

import time

import torch

from verispec.proposers.base import Proposal, SequenceProposer
from verispec.sampling import SamplingParams


class NgramProposer(SequenceProposer):
    """Longest suffix first (ngram_max down to ngram_min), most recent earlier occurrence wins.

    index[n] maps an n-gram to the position of the token that followed its latest occurrence. An n-gram is
    indexed only once a token follows it, so the current suffix never matches itself; appending a token updates
    one entry per n, which keeps each round O(ngram_max) however long the sequence grows.
    """

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min} and {ngram_max}")
        super().__init__()  # stats.seconds: lookup and indexing time; there is no model, so no forwards
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self.tokens: list[int] = []
        self.index: dict[int, dict[tuple[int, ...], int]] = {}
        self.last_match_len = 0  # n of the last propose's match, 0 if none (read by the draft+ngram mix)

    def reset(self, prompt: list[int]) -> None:
        self.tokens = []
        self.index = {n: {} for n in range(self.ngram_min, self.ngram_max + 1)}
        self.last_match_len = 0
        self.stats.seconds = 0.0
        self._extend(prompt)

    def _extend(self, new: list[int]) -> None:
        """Append tokens; each one indexes the n-grams that end just before it."""
        t0 = time.perf_counter()
        seq, index = self.tokens, self.index
        for tok in new:
            j = len(seq)  # position of tok
            for n, table in index.items():
                if j >= n:
                    table[tuple(seq[j - n : j])] = j
            seq.append(tok)
        self.stats.seconds += time.perf_counter() - t0

    def lookup(self, gamma: int) -> tuple[list[int], int]:
        """(up to gamma tokens that followed the longest matching suffix, its length n), or ([], 0)."""
        seq = self.tokens
        for n in range(min(self.ngram_max, len(seq)), self.ngram_min - 1, -1):
            start = self.index[n].get(tuple(seq[-n:]))
            if start is not None:
                return seq[start : start + gamma], n  # truncated at the end of the sequence
        return [], 0

    def propose(self, gamma: int, sampling: SamplingParams, generator: torch.Generator) -> Proposal:
        t0 = time.perf_counter()
        tokens, self.last_match_len = self.lookup(gamma) if gamma > 0 else ([], 0)
        self.stats.seconds += time.perf_counter() - t0
        return Proposal(tokens=torch.tensor(tokens, dtype=torch.long))

    def observe(self, num_accepted: int, emitted: list[int], extra_logits: torch.Tensor | None = None) -> None:
        self._extend(emitted)
