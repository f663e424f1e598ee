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

from verispec.proposers.base import Proposal, Proposer
from verispec.sampling import SamplingParams


class SyntheticProposer:
    def __init__(
        self, inner: Proposer | None, reference: list[int], error_rate: float, vocab_size: int, seed: int = 0
    ) -> None:
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"synthetic error rate must be in [0, 1], got {error_rate}")
        self.inner, self.reference, self.error_rate, self.vocab_size = inner, list(reference), error_rate, vocab_size
        self.rng = random.Random(seed)  # its own stream: never touches the request's generator
        self.done = 0  # reference tokens already emitted

    @property
    def forwards(self) -> int:
        return getattr(self.inner, "forwards", 0)

    @property
    def seconds(self) -> float:
        return getattr(self.inner, "seconds", 0.0)

    def reset(self, prompt: list[int]) -> None:
        if self.inner is not None:
            self.inner.reset(prompt)
        self.done = 0

    def propose(self, gamma: int, sampling: SamplingParams, generator: torch.Generator) -> Proposal:
        if not sampling.greedy:
            raise ValueError("synthetic acceptance is defined for greedy decoding only")
        if self.inner is not None:  # pay for a real draft, then ignore what it said
            gamma = int(self.inner.propose(gamma, sampling, generator).tokens.numel())
        tokens = []
        for i in range(gamma):
            j = self.done + i
            token = self.reference[j] if j < len(self.reference) else 0
            if self.rng.random() < self.error_rate:
                token = (token + 1) % self.vocab_size  # any other token is rejected under greedy
            tokens.append(token)
        return Proposal(tokens=torch.tensor(tokens, dtype=torch.long))

    def observe(self, num_accepted: int, emitted: list[int]) -> None:
        if self.inner is not None:
            self.inner.observe(num_accepted, emitted)
        self.done += len(emitted)
