"""Adaptive gamma: choose each round's draft length from live estimates of alpha and c.

The speed model (theory.py) says the best gamma is the one maximising E[tokens] / (gamma * c + 1). Both inputs
drift within one request (code is easy to guess, prose is not; c grows with the draft's cache), so a fixed
gamma is right only on average. This wrapper re-solves for gamma every round, capped by the gamma the engine
asks for, from:
  * alpha: per-token acceptance, estimated as accepted / (accepted + rejections), with exponential forgetting.
    Counting tokens drafted after the first rejection as failures (accepted / drafted) would bias alpha down:
    the verifier never tests them.
  * c: the draft's seconds per forward over a one-token target forward, forgotten exponentially. The target's
    share is measured from the end of a propose to its observe (the verification forward and bookkeeping),
    divided by `verify_cost` of the tokens verified where a wider forward costs more than one token.
With `pause=True` gamma may be 0: when no gamma is predicted to beat a plain step (prose the draft guesses
badly), the row decodes plainly, its pending tokens queue for the draft's next catch-up forward, and after
`probe_every` paused rounds one 1-token proposal re-measures alpha, so drafting resumes where the text turns
predictable again. A rejected probe doubles the wait before the next (up to 8 x probe_every): on prose a probe
costs more than the plain step it replaces.
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
from verispec.theory import VerifyCost, flat_cost, optimal_gamma, predicted_speedup


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
    paused: int = 0  # rounds in a row decoded plainly because drafting did not pay
    wait: int = 0  # paused rounds before the next probe (probe_every, doubled after each rejected probe)
    probing: bool = False  # the last proposal was a probe
    timed: bool = False  # whether the last round's drafting measures c (not a catch-up after a pause)


class AdaptiveGammaProposer:
    def __init__(self, draft: DraftModelProposer, *, decay: float = 0.9, prior_alpha: float = 0.7,
                 prior_weight: float = 4.0, prior_c: float = 0.25, verify_cost: VerifyCost = flat_cost,
                 pause: bool = False, probe_every: int = 4, measure_c: bool = True) -> None:
        """measure_c=False keeps c at prior_c: the draft lengths then depend on acceptance alone, not on wall-clock
        timings, so a seeded sampled run gives the same tokens every time."""
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {probe_every}")
        self.draft, self.decay = draft, decay
        self.verify_cost, self.pause, self.probe_every, self.measure_c = verify_cost, pause, probe_every, measure_c
        self.prior = (prior_alpha * prior_weight, (1.0 - prior_alpha) * prior_weight, prior_c)
        self.rows: dict[int, Estimates] = {}
        self.gammas: list[int] = []  # every gamma chosen, all rows (for tests and reports)

    def alpha(self, row: int) -> float:
        e = self.rows[row]
        return alpha_iid(e.accepted, e.rejected)  # never None: the prior weighs in

    def reset(self, rows: list[int], prompts: list[list[int]], target: Rows | None = None,
              hidden: list[torch.Tensor | None] | None = None) -> None:
        self.draft.reset(rows, prompts, target, hidden)
        for row in rows:
            self.rows[row] = Estimates(*self.prior)

    def _choose(self, row: int, gamma: int) -> int:
        e = self.rows[row]
        choice = 0
        if gamma > 0:
            alpha = self.alpha(row)
            choice = min(gamma, optimal_gamma(alpha, e.c, max_gamma=gamma, verify_cost=self.verify_cost))
            e.probing = False
            if self.pause and predicted_speedup(alpha, choice, e.c, self.verify_cost) < 1.0 / self.verify_cost(1):
                e.paused += 1
                e.wait = e.wait or self.probe_every
                choice = 1 if e.paused > e.wait else 0  # a probe keeps alpha current
                e.paused, e.probing = (0, True) if choice else (e.paused, False)
            else:
                e.paused, e.wait = 0, 0
        self.gammas.append(choice)
        return choice

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator], shapes: list[Shaper | None] | None = None) -> list[Proposal]:
        choices = [self._choose(r, g) for r, g in zip(rows, gammas)]
        # a first forward that feeds the tokens of paused rounds is a small prefill, not a draft step
        timed = {r: len(self.draft.pending[r]) <= 2 for r in rows}
        before = {r: (self.draft.stats(r).seconds, self.draft.stats(r).forwards) for r in rows}
        proposals = self.draft.propose(rows, choices, sampling, generators, shapes)
        end = time.perf_counter()
        for r, proposal in zip(rows, proposals):
            e, after = self.rows[r], self.draft.stats(r)
            e.draft_seconds, e.draft_forwards = after.seconds - before[r][0], after.forwards - before[r][1]
            e.asked, e.round_end, e.timed = proposal.tokens.numel(), end, timed[r]
        return proposals

    def observe(self, row: int, outcome: Outcome) -> None:
        e = self.rows[row]
        if self.measure_c and e.draft_forwards and e.timed and e.round_end is not None:  # time the target's part
            rest = time.perf_counter() - e.round_end  # verification forward + bookkeeping
            if rest > 0:
                step = e.draft_seconds / e.draft_forwards
                unit = rest / self.verify_cost(e.asked + 1)  # a one-token target forward
                e.c = self.decay * e.c + (1.0 - self.decay) * (step / unit)
        if e.asked:  # a round this row did not draft (paused, or another proposer's) tests nothing
            rejected = 1.0 if outcome.num_accepted < e.asked else 0.0  # cut short by confidence: no rejection
            if e.probing:
                e.wait = min(2 * e.wait, 8 * self.probe_every) if rejected else self.probe_every
            e.accepted = self.decay * e.accepted + outcome.num_accepted
            e.rejected = self.decay * e.rejected + rejected
        e.asked, e.draft_forwards, e.draft_seconds = 0, 0, 0.0
        self.draft.observe(row, outcome)

    def move(self, src: int, dst: int) -> None:
        self.draft.move(src, dst)
        self.rows[dst] = self.rows.pop(src)

    def free(self, row: int) -> None:
        self.draft.free(row)
        self.rows.pop(row, None)

    def stats(self, row: int) -> ProposerStats:
        return self.draft.stats(row)
