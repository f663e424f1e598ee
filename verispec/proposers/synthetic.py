"""Synthetic acceptance: a proposer that guesses the target's own greedy tokens with a set error rate.

For measuring the loop, not for output. On a GPU machine the real weights cannot travel, and a randomly
initialised draft agrees with a randomly initialised target ~never, so every round would reject at the first
token and say nothing about the loop at realistic acceptance. This proposer pays the full cost of a real one
(it runs `inner.propose` and discards its tokens) but proposes tokens from a reference continuation -- the
target's greedy output for the prompt, computed beforehand -- each replaced by a wrong token with probability
`error_rate`. Under greedy verification token i is then accepted with probability (1 - error_rate), given the
ones before it were, so the per-token acceptance rate is 1 - error_rate. vLLM's rejection sampler has a
`synthetic` mode for the same purpose.

Greedy only: the reference is the greedy continuation, and one-hot proposals at temperature > 0 would measure
a different acceptance. Verification is the ordinary one, so the output still equals plain greedy decoding
(the engine cannot tell; the tests check it).
"""

from __future__ import annotations

import random

import torch

from verispec.batch import Rows
from verispec.proposers.base import Outcome, Proposal, Proposer, ProposerStats
from verispec.sampling import SamplingParams


class SyntheticProposer:
    """Every row it serves follows the same `reference` (the benchmark runs one prompt at a time)."""

    def __init__(
        self, inner: Proposer | None, reference: list[int], error_rate: float, vocab_size: int, seed: int = 0,
        prompt_len: int | None = None,
    ) -> None:
        """reference: the target's greedy continuation of a prompt of prompt_len tokens (None: a row starts at its
        beginning); a row that starts later has emitted the first tokens of it already."""
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"synthetic error rate must be in [0, 1], got {error_rate}")
        self.inner, self.reference, self.error_rate, self.vocab_size = inner, list(reference), error_rate, vocab_size
        self.rng = random.Random(seed)  # its own stream: never touches the request's generator
        self.done: dict[int, int] = {}  # reference tokens already emitted, per row
        self.prompt_len = prompt_len

    def reset(self, rows: list[int], prompts: list[list[int]], target: Rows | None = None,
              hidden: list[torch.Tensor | None] | None = None) -> None:
        if self.inner is not None:
            self.inner.reset(rows, prompts, target, hidden)
        for row, prompt in zip(rows, prompts):
            self.done[row] = 0 if self.prompt_len is None else len(prompt) - self.prompt_len

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator], shapes: list[Shaper | None] | None = None) -> list[Proposal]:
        if not all(s.greedy for s in sampling):
            raise ValueError("synthetic acceptance is defined for greedy decoding only")
        if self.inner is not None:  # pay for a real draft, then ignore what it said
            gammas = [int(p.tokens.numel()) for p in self.inner.propose(rows, gammas, sampling, generators, shapes)]
        out = []
        for row, gamma in zip(rows, gammas):
            tokens = []
            for i in range(gamma):
                j = self.done[row] + i
                token = self.reference[j] if j < len(self.reference) else 0
                if self.rng.random() < self.error_rate:
                    token = (token + 1) % self.vocab_size  # any other token is rejected under greedy
                tokens.append(token)
            out.append(Proposal(tokens=torch.tensor(tokens, dtype=torch.long)))
        return out

    def observe(self, row: int, outcome: Outcome) -> None:
        if self.inner is not None:
            self.inner.observe(row, outcome)
        self.done[row] += len(outcome.emitted)

    def move(self, src: int, dst: int) -> None:
        if self.inner is not None:
            self.inner.move(src, dst)
        self.done[dst] = self.done.pop(src)

    def free(self, row: int) -> None:
        if self.inner is not None:
            self.inner.free(row)
        self.done.pop(row, None)

    def stats(self, row: int) -> ProposerStats:
        return self.inner.stats(row) if self.inner is not None else ProposerStats()
