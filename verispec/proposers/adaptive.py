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
from dataclasses import dataclass

import torch

from verispec.batch import Rows
from verispec.metrics import alpha_iid
from verispec.proposers.base import Outcome, Proposal, ProposerStats
from verispec.proposers.draft_model import DraftModelProposer
from verispec.sampling import SamplingParams
from verispec.theory import optimal_gamma


@dataclass
class Estimates:
    """One row's live alpha and c (exponentially forgotten, started from the prior)."""

    accepted: float
    rejected: float
    c: float
    round_end: float | None = None  # when the row's last propose returned
    asked: int = 0  # tokens proposed in the row's last round
    draft_seconds: float = 0.0  # its last round's drafting
    draft_forwards: int = 0


class AdaptiveGammaProposer:
    def __init__(self, draft: DraftModelProposer, *, decay: float = 0.9, prior_alpha: float = 0.7,
                 prior_weight: float = 4.0, prior_c: float = 0.25) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.draft, self.decay = draft, decay
        self.prior = (prior_alpha * prior_weight, (1.0 - prior_alpha) * prior_weight, prior_c)
        self.rows: dict[int, Estimates] = {}
        self.gammas: list[int] = []  # every gamma chosen, all rows (for tests and reports)

    def alpha(self, row: int) -> float:
        e = self.rows[row]
        return alpha_iid(e.accepted, e.rejected)  # never None: the prior weighs in

    def reset(self, row: int, prompt: list[int], target: Rows | None = None) -> None:
        self.draft.reset(row, prompt, target)
        self.rows[row] = Estimates(*self.prior)

    def _choose(self, row: int, gamma: int, now: float) -> int:
        e = self.rows[row]
        if e.round_end is not None and e.draft_forwards:
            rest = now - e.round_end  # target forward + verification + bookkeeping of the last round
            if rest > 0:
                step = e.draft_seconds / e.draft_forwards
                e.c = self.decay * e.c + (1.0 - self.decay) * (step / rest)
        choice = min(gamma, optimal_gamma(self.alpha(row), e.c, max_gamma=max(1, gamma))) if gamma > 0 else 0
        self.gammas.append(choice)
        return choice

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator]) -> list[Proposal]:
        now = time.perf_counter()
        choices = [self._choose(r, g, now) for r, g in zip(rows, gammas)]
        before = {r: (self.draft.stats(r).seconds, self.draft.stats(r).forwards) for r in rows}
        proposals = self.draft.propose(rows, choices, sampling, generators)
        end = time.perf_counter()
        for r, proposal in zip(rows, proposals):
            e, after = self.rows[r], self.draft.stats(r)
            e.draft_seconds, e.draft_forwards = after.seconds - before[r][0], after.forwards - before[r][1]
            e.asked, e.round_end = proposal.tokens.numel(), end
        return proposals

    def observe(self, row: int, outcome: Outcome) -> None:
        e = self.rows[row]
        rejected = 1.0 if outcome.num_accepted < e.asked else 0.0  # a proposal cut short by confidence is no rejection
        e.asked = 0  # a round in which the row does not draft (speculation paused) tests nothing
        e.accepted = self.decay * e.accepted + outcome.num_accepted
        e.rejected = self.decay * e.rejected + rejected
        self.draft.observe(row, outcome)

    def move(self, src: int, dst: int) -> None:
        self.draft.move(src, dst)
        self.rows[dst] = self.rows.pop(src)

    def free(self, row: int) -> None:
        self.draft.free(row)
        self.rows.pop(row, None)

    def stats(self, row: int) -> ProposerStats:
        return self.draft.stats(row)
