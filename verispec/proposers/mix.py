"""Draft model + prompt lookup: copy from the context when it repeats itself, otherwise ask the draft model.

A long enough n-gram match is free (no draft forward) and, on repetitive text, usually longer-lived than the
draft's guesses; elsewhere the draft model keeps acceptance up.
"""

from __future__ import annotations

import torch

from verispec.proposers.base import Proposal
from verispec.proposers.draft_model import DraftModelProposer, WrapsDraftModel
from verispec.proposers.ngram import NgramProposer
from verispec.sampling import SamplingParams


class DraftNgramProposer(WrapsDraftModel):
    """Per round: the n-gram proposal if its suffix match has at least `min_match` tokens, else the draft's.

    Both sub-proposers see every round's outcome. When the n-gram proposal is used the draft model runs no
    forward, so it has fed nothing this round (fed = 0): its observe then commits nothing and appends the whole
    emitted text to its pending tokens, which the next round it drafts feeds in one catch-up forward.
    """

    def __init__(self, draft: DraftModelProposer, ngram: NgramProposer, min_match: int) -> None:
        self.draft, self.ngram, self.min_match = draft, ngram, min_match
        self.used_ngram = False  # which sub-proposer drafted the last round
        self.ngram_rounds = 0  # rounds drafted by the n-gram lookup (for tests and curiosity)

    def reset(self, prompt: list[int]) -> None:
        self.draft.reset(prompt)
        self.ngram.reset(prompt)
        self.used_ngram, self.ngram_rounds = False, 0

    def propose(self, gamma: int, sampling: SamplingParams, generator: torch.Generator) -> Proposal:
        proposal = self.ngram.propose(gamma, sampling, generator)
        self.used_ngram = proposal.tokens.numel() > 0 and self.ngram.last_match_len >= self.min_match
        if self.used_ngram:
            self.draft.fed = 0  # the draft wrote nothing past its committed cache this round
            self.ngram_rounds += 1
            return proposal
        return self.draft.propose(gamma, sampling, generator)

    def observe(self, num_accepted: int, emitted: list[int]) -> None:
        self.ngram.observe(num_accepted, emitted)
        self.draft.observe(num_accepted, emitted)
