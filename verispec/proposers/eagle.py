"""Drafting with an EAGLE feature-level drafter (verispec.models.eagle): the target's own features, one layer.

The drafter's cache holds one entry per pair (h_t, token t+1) whose feature h_t is the *target's* (never a
prediction): the prompt's pairs, then after each round the pairs the verification forward made known,
zip(Outcome.hidden, Outcome.emitted) (the target's features at pending + the accepted drafts, each followed by
the next emitted token). A round feeds those pending pairs in one forward (committed: they are true), then drafts
on with its own predicted features (provisional: rolled back, since the next round brings the target's).

    prompt x0 x1 x2 (pending x2), target features h0 h1      pairs (h0, x1), (h1, x2) -> q for x3 -> d1
    drafting: (f3, d1) -> d2 ...                              f3 = the drafter's output at the last pair
    round accepts d1, emits (d1, r): new pairs (h2, d1), (h3, r)   h2, h3 from the verification forward
"""

from __future__ import annotations

import torch
from torch import Tensor

from verispec.batch import Rows, make_rows
from verispec.models.eagle import EagleDrafter
from verispec.proposers.base import Outcome, Proposal, ProposerStats
from verispec.proposers.draft_model import draft_steps
from verispec.sampling import SamplingParams


class EagleProposer:
    """An EAGLE drafter with its own one-layer KV cache of `rows` rows (see the module docstring)."""

    def __init__(self, drafter: EagleDrafter, max_len: int, vocab_size: int, *, rows: int = 1,
                 max_gamma: int = 16) -> None:
        self.drafter, self.vocab_size = drafter, vocab_size
        self.cache: Rows = make_rows(drafter, rows, max_len, slack=max_gamma + 2)
        self.max_len = self.cache.max_len
        self.tokens: dict[int, list[int]] = {}  # pending pairs' tokens (token t+1) ...
        self.features: dict[int, Tensor] = {}  # ... and the target's features h_t [k, H]
        self.fed: dict[int, int] = {}  # pairs fed in the row's current round (committed in observe)
        self._stats: dict[int, ProposerStats] = {}

    def reset(self, row: int, prompt: list[int], target: Rows | None = None, hidden: Tensor | None = None) -> None:
        if hidden is None and len(prompt) > 1:
            raise ValueError("EAGLE drafting needs the target's hidden states (a native Llama-family target)")
        self.cache.free(row)
        self.tokens[row] = list(prompt[1:])
        self.features[row] = hidden if hidden is not None else torch.empty(0, self.drafter.eagle.hidden_size)
        self.fed[row] = 0
        self._stats[row] = ProposerStats()

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator], shapes: list[Shaper | None] | None = None) -> list[Proposal]:
        # a row with no pair yet (a one-token prompt) drafts from its next round on
        gammas = [0 if not self.tokens[r] else min(g, self.max_len - self.cache.length(r) - len(self.tokens[r]) - 1)
                  for r, g in zip(rows, gammas)]
        drafted = draft_steps(self.cache, rows, [self.tokens[r] for r in rows], gammas, sampling, generators,
                              self._stats, vocab_size=self.vocab_size,
                              features=[self.features[r].to(torch.float32) for r in rows], shapes=shapes)
        for r, n in zip(rows, drafted.fed):
            self.fed[r] = min(n, len(self.tokens[r]))  # the pending pairs; the rest were drafting steps
        return drafted.proposals

    def observe(self, row: int, outcome: Outcome) -> None:
        """Commit the pairs fed this round; the round's new pairs, zip(hidden, emitted), are pending next."""
        if outcome.hidden is None:
            raise ValueError("EAGLE drafting needs the target's hidden states of every round")
        fed = self.fed[row]
        self.cache.commit(row, fed)
        self.tokens[row] = self.tokens[row][fed:] + list(outcome.emitted)
        self.features[row] = torch.cat([self.features[row][fed:], outcome.hidden.float()])
        self.fed[row] = 0

    def move(self, src: int, dst: int) -> None:
        self.cache.move(src, dst)
        for state in (self.tokens, self.features, self.fed, self._stats):
            state[dst] = state.pop(src)

    def free(self, row: int) -> None:
        self.cache.free(row)
        for state in (self.tokens, self.features, self.fed, self._stats):
            state.pop(row, None)

    def stats(self, row: int) -> ProposerStats:
        return self._stats[row]
