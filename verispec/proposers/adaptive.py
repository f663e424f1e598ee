"""Adaptive gamma: choose each round's draft length from live estimates of alpha and c.

The speed model (theory.py) says the best gamma is the one maximising E[tokens] / (gamma * c + 1). Both inputs
drift within one request (code is easy to guess, prose is not; c grows with the draft's cache), so a fixed
gamma is right only on average. This wrapper re-solves for gamma every round, capped by the gamma the engine
asks for, from:
  * alpha: per-token acceptance, estimated as accepted / (accepted + rejections), with exponential forgetting.
    Counting tokens drafted after the first rejection as failures (accepted / drafted) would bias alpha down:
    the verifier never tests them.
  * c: the draft's seconds per forward over the rest of a round's wall time (from the end of one propose to
    the start of the next: the target forward, verification and bookkeeping), also forgotten exponentially.
The draft length is a function of the draft's own history, never of the target's current logits, so the
output distribution is untouched.
"""

from __future__ import annotations

import time

import torch

from verispec.metrics import alpha_iid
from verispec.proposers.base import Proposal
from verispec.proposers.draft_model import DraftModelProposer, WrapsDraftModel
from verispec.sampling import SamplingParams
from verispec.theory import optimal_gamma


class AdaptiveGammaProposer(WrapsDraftModel):
    def __init__(self, draft: DraftModelProposer, *, decay: float = 0.9, prior_alpha: float = 0.7,
                 prior_weight: float = 4.0, prior_c: float = 0.25) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.draft, self.decay = draft, decay
        self.prior = (prior_alpha * prior_weight, (1.0 - prior_alpha) * prior_weight, prior_c)
        self.reset_estimates()
        self.gammas: list[int] = []  # the gamma chosen each round (for tests and reports)

    def reset_estimates(self) -> None:
        self.accepted, self.rejected, self.c = self.prior
        self._round_end: float | None = None
        self._asked = 0
        self._draft_seconds = 0.0
        self._draft_forwards = 0

    @property
    def alpha(self) -> float:
        return alpha_iid(self.accepted, self.rejected)  # never None: the prior weighs in

    def reset(self, prompt: list[int]) -> None:
        self.draft.reset(prompt)
        self.reset_estimates()
        self.gammas = []

    def propose(self, gamma: int, sampling: SamplingParams, generator: torch.Generator) -> Proposal:
        now = time.perf_counter()
        if self._round_end is not None and self._draft_forwards:
            rest = now - self._round_end  # target forward + verification + bookkeeping of the last round
            if rest > 0:
                step = self._draft_seconds / self._draft_forwards
                self.c = self.decay * self.c + (1.0 - self.decay) * (step / rest)
        choice = min(gamma, optimal_gamma(self.alpha, self.c, max_gamma=max(1, gamma))) if gamma > 0 else 0
        self.gammas.append(choice)
        s0, f0 = self.draft.seconds, self.draft.forwards
        proposal = self.draft.propose(choice, sampling, generator)
        self._draft_seconds, self._draft_forwards = self.draft.seconds - s0, self.draft.forwards - f0
        self._asked = proposal.tokens.numel()
        self._round_end = time.perf_counter()
        return proposal

    def observe(self, num_accepted: int, emitted: list[int]) -> None:
        rejected = 1.0 if num_accepted < self._asked else 0.0  # a proposal cut short by confidence is no rejection
        self.accepted = self.decay * self.accepted + num_accepted
        self.rejected = self.decay * self.rejected + rejected
        self.draft.observe(num_accepted, emitted)
