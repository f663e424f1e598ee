"""Draft model + prompt lookup: copy from the context when it repeats itself, otherwise ask the draft model.

A long enough n-gram match is free (no draft forward) and, on repetitive text, usually longer-lived than the
draft's guesses; elsewhere the draft model keeps acceptance up.
"""

from __future__ import annotations

import torch

from verispec.batch import Rows
from verispec.proposers.base import Outcome, Proposal, Proposer, ProposerStats
from verispec.proposers.ngram import NgramProposer
from verispec.sampling import SamplingParams


class DraftNgramProposer:
    """Per round and row: the n-gram proposal if its suffix match has at least `min_match` tokens, else the
    draft's (the draft model runs once for all rows that need it). Both sub-proposers see every round's outcome.
    When the n-gram proposal is used the draft model runs no forward for that row, so it has fed nothing this
    round: its observe then commits nothing and appends the whole emitted text to the row's pending tokens,
    which the next round it drafts feeds in one catch-up forward.
    """

    def __init__(self, draft: Proposer, ngram_max: int, min_match: int) -> None:
        """draft: the draft model's proposer (a DraftModelProposer, or one that chooses its length per round)."""
        self.draft, self.ngram_max, self.min_match = draft, ngram_max, min_match
        self.ngrams: dict[int, NgramProposer] = {}
        self.ngram_rounds = 0  # rounds (of any row) drafted by the n-gram lookup (for tests and curiosity)

    def reset(self, rows: list[int], prompts: list[list[int]], target: Rows | None = None,
              hidden: list[torch.Tensor | None] | None = None) -> None:
        self.draft.reset(rows, prompts, target, hidden)
        for row, prompt in zip(rows, prompts):
            self.ngrams[row] = NgramProposer(self.ngram_max, self.min_match)
            self.ngrams[row].reset(prompt)

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator], shapes: list[Shaper | None] | None = None) -> list[Proposal]:
        out: list[Proposal | None] = []
        for r, g, s, gen in zip(rows, gammas, sampling, generators):
            proposal = self.ngrams[r].propose(g, s, gen)
            found = proposal.tokens.numel() > 0 and self.ngrams[r].last_match_len >= self.min_match
            self.ngram_rounds += found
            out.append(proposal if found else None)
        rest = [i for i, p in enumerate(out) if p is None]
        if rest:
            drafted = self.draft.propose([rows[i] for i in rest], [gammas[i] for i in rest],
                                         [sampling[i] for i in rest], [generators[i] for i in rest],
                                         None if shapes is None else [shapes[i] for i in rest])
            for i, proposal in zip(rest, drafted):
                out[i] = proposal
        return out  # type: ignore[return-value]

    def observe(self, row: int, outcome: Outcome) -> None:
        self.ngrams[row].observe(outcome.num_accepted, outcome.emitted)
        self.draft.observe(row, outcome)

    def move(self, src: int, dst: int) -> None:
        self.draft.move(src, dst)
        self.ngrams[dst] = self.ngrams.pop(src)

    def free(self, row: int) -> None:
        self.draft.free(row)
        self.ngrams.pop(row, None)

    def stats(self, row: int) -> ProposerStats:
        return self.draft.stats(row)
