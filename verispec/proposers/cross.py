"""A draft model with a tokenizer of its own (universal assisted generation): its text, re-tokenized, drafts for
the target.

Each round the target's text so far is encoded with the draft's tokenizer; the draft's cache keeps its longest
prefix that still matches (the rest is rolled back and fed again), the draft continues greedily for a few of
its tokens, and their text is encoded with the target's tokenizer after the target's last tokens (so a word cut
at the boundary re-merges as the target would cut it). The target tokens that follow the target's sequence are
the proposal, less the last one (the draft's text may end inside a word).

The proposal is verified as a deterministic one (one-hot q): accepting x with probability p(x) and resampling from
p without x keeps the target's law exactly for any proposal drawn independently of the verification, so the
draft's tokenizer, sampling or mistakes never reach the output distribution.
"""

from __future__ import annotations

import time

import torch

from verispec.models.base import CausalLM
from verispec.models.tokenizer import Tokenizer
from verispec.proposers.base import Proposal, SequenceProposer
from verispec.sampling import SamplingParams, argmax

LOOKBEHIND = 4  # target tokens re-encoded with the draft's text, so a boundary re-merges as the target cuts it


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class CrossTokenizerProposer(SequenceProposer):
    """One sequence: the draft model (its own cache), the draft's tokenizer and the target's."""

    def __init__(self, draft: CausalLM, draft_tokenizer: Tokenizer, target_tokenizer: Tokenizer, max_len: int,
                 *, extra: int = 2) -> None:
        """max_len: draft tokens of the longest sequence; extra: draft tokens generated beyond gamma (a target
        token is often longer than a draft one, and the last proposed token is dropped)."""
        super().__init__()
        self.draft, self.dtok, self.ttok = draft, draft_tokenizer, target_tokenizer
        self.extra = extra
        self.cache = draft.new_cache(max_len)
        self.target_ids: list[int] = []
        self.fed: list[int] = []  # draft tokens committed in the draft's cache

    def reset(self, prompt: list[int]) -> None:
        self.cache.rollback(self.cache.length)
        self.target_ids, self.fed = list(prompt), []
        self.stats.forwards, self.stats.seconds = 0, 0.0

    def _text(self, ids: list[int]) -> str:
        return self.ttok.backend.decode(ids, skip_special_tokens=False)

    def propose(self, gamma: int, sampling: SamplingParams, generator: torch.Generator) -> Proposal:
        if gamma < 1:
            return Proposal(tokens=torch.empty(0, dtype=torch.long))
        t0 = time.perf_counter()
        context = self.dtok.backend.encode(self._text(self.target_ids), add_special_tokens=False).ids
        keep = min(common_prefix(self.fed, context), len(context) - 1)  # feed at least one token
        self.cache.rollback(self.cache.length - keep)
        self.fed = context[:keep]
        feed, drafted = context[keep:], []
        eos = set(self.dtok.eos_ids)
        try:
            for _ in range(gamma + self.extra):
                x = torch.tensor([feed], dtype=torch.long, device=self.draft.device)
                logits = self.draft.forward(x, self.cache, last_n=1)[0, -1]
                self.cache.commit(len(feed))
                self.stats.forwards += 1
                token = int(argmax(logits))
                if token in eos:
                    break
                drafted.append(token)
                feed = [token]
        finally:  # keep the context, forget the drafts
            self.cache.rollback(self.cache.length - len(context))
            self.fed = context
        proposal = self._retokenize(context, drafted, ended=len(drafted) < gamma + self.extra)[:gamma]
        self.stats.seconds += time.perf_counter() - t0
        return Proposal(tokens=torch.tensor(proposal, dtype=torch.long))

    def _retokenize(self, context: list[int], drafted: list[int], ended: bool) -> list[int]:
        """The target tokens the draft's text adds after the target's sequence. The added text is the draft's
        whole text less its context's (a tokenizer may render a token differently at the start of a text)."""
        if not drafted:
            return []
        before = self.dtok.backend.decode(context, skip_special_tokens=False)
        after = self.dtok.backend.decode(context + drafted, skip_special_tokens=False)
        if not after.startswith(before):
            return []
        text = after[len(before):]
        behind = self.target_ids[-LOOKBEHIND:]
        ids = self.ttok.backend.encode(self._text(behind) + text, add_special_tokens=False).ids
        if ids[: len(behind)] != behind:  # the boundary re-merged: propose nothing rather than a wrong cut
            return []
        new = ids[len(behind):]
        return new if ended else new[:-1]  # the draft's text may stop inside a word

    def observe(self, num_accepted: int, emitted: list[int], extra_logits: torch.Tensor | None = None) -> None:
        self.target_ids.extend(emitted)
