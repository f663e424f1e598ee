"""Drafting with a separate, smaller model that shares the target's vocabulary."""

from __future__ import annotations

import time

import torch

from verispec.models.base import CausalLM
from verispec.proposers.base import Proposal
from verispec.sampling import SamplingParams, argmax, logits_to_probs, sample


class DraftModelProposer:
    """Keeps its own KV cache in step with the sequence.

    Invariant between rounds: the cache holds every token of the sequence except `pending` (one token,
    or two after a round in which all drafts were accepted: the last draft, which was never fed to the
    draft model, and the bonus token). The next round feeds `pending` in a single forward, so the draft
    catches up without re-running the prefix.
    """

    def __init__(self, model: CausalLM, max_len: int, vocab_size: int | None = None, confidence: float = 0.0) -> None:
        """confidence: stop drafting after a token the draft itself gave less than this probability (0: always
        draft the gamma asked for). Where the draft is unsure the next guesses are likely wasted draft forwards;
        the proposal length depends on the draft alone, so this cannot change the output distribution."""
        if not 0.0 <= confidence <= 1.0:
            raise ValueError(f"draft confidence must be in [0, 1], got {confidence}")
        self.confidence = confidence
        self.model = model
        self.vocab_size = vocab_size or model.vocab_size  # the target's; embedding tables may be padded
        self.cache = model.new_cache(max_len)
        self.max_len = self.cache.max_len  # the model may cap it at its context length
        self.pending: list[int] = []
        self.fed = 0  # tokens written to the cache in the current round beyond the committed length
        self.forwards = 0
        self.seconds = 0.0

    def reset(self, prompt: list[int]) -> None:
        self.cache.reset()
        if len(prompt) > 1:
            self._forward(prompt[:-1], last_n=1)
            self.cache.commit(len(prompt) - 1)
        self.pending = prompt[-1:]
        self.forwards, self.seconds = 0, 0.0  # count drafting only, not the prefill

    def _forward(self, tokens: list[int], last_n: int) -> torch.Tensor:
        t0 = time.perf_counter()
        x = torch.tensor([tokens], dtype=torch.long, device=self.model.device)
        logits = self.model.forward(x, self.cache, last_n=last_n)[0, -1]  # [V_draft]
        if logits.shape[-1] > self.vocab_size:
            logits = logits[: self.vocab_size]
        elif logits.shape[-1] < self.vocab_size:  # ids the draft lacks get probability 0
            logits = torch.nn.functional.pad(logits, (0, self.vocab_size - logits.shape[-1]), value=float("-inf"))
        self.seconds += time.perf_counter() - t0
        self.forwards += 1
        return logits

    def propose(self, gamma: int, sampling: SamplingParams, generator: torch.Generator) -> Proposal:
        gamma = min(gamma, self.max_len - self.cache.length - len(self.pending) - 1)
        self.fed = 0
        if gamma <= 0:
            return Proposal(tokens=torch.empty(0, dtype=torch.long))
        base = self.cache.length
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        feed = self.pending
        for _ in range(gamma):
            logits = self._forward(feed, last_n=1)
            self.cache.commit(len(feed))  # provisional; undone in observe()
            if sampling.greedy:
                token = int(argmax(logits))
                sure = self.confidence == 0.0 or float(torch.softmax(logits.float(), -1)[token]) >= self.confidence
            else:
                q = logits_to_probs(logits, sampling)
                token = int(sample(q, generator))
                qs.append(q)
                sure = float(q[token]) >= self.confidence
            tokens.append(token)
            feed = [token]
            if not sure:
                break
        self.fed = self.cache.length - base
        self.cache.rollback(self.fed)
        q_all = torch.stack(qs) if qs else None
        return Proposal(tokens=torch.tensor(tokens, dtype=torch.long), q=q_all)

    def observe(self, num_accepted: int, emitted: list[int]) -> None:
        # The cache holds (uncommitted) pending + drafts[:gamma-1]. Keep pending + the accepted drafts that
        # were fed; whatever was emitted beyond that becomes the new pending.
        # Worked example, pending [a], gamma 3, drafts (x, y, z): fed [a, x, y].
        #   2 accepted, emitted [x, y, r] -> keep 3 ([a, x, y]), pending [r]
        #   3 accepted, emitted [x, y, z, b] -> keep 3, pending [z, b]
        keep = min(len(self.pending) + num_accepted, self.fed)
        self.cache.commit(keep)
        self.pending = (self.pending + emitted)[keep:]
        self.fed = 0


class WrapsDraftModel:
    """For proposers built around a DraftModelProposer (`self.draft`): the engine reads the draft forwards and
    seconds from the proposer it holds, so they are passed through."""

    draft: DraftModelProposer

    @property
    def forwards(self) -> int:
        return self.draft.forwards

    @property
    def seconds(self) -> float:
        return self.draft.seconds
