"""Proposers for a batch of sequences, addressed by batch row.

`BatchedDraft` runs the draft model over all speculating rows at once (one forward per draft step, rows of
different lengths in one BatchKVCache): on a memory-bound CPU or GPU, k rows cost little more than one, so
this is what keeps speculation worth it as the batch grows. It keeps DraftModelProposer's bookkeeping per
row (see verispec/proposers/draft_model.py): the cache holds the sequence except `pending`, drafts are
provisional and undone before the target verifies.

`PerSequence` wraps any single-sequence Proposer (n-gram, draft+ngram) and calls it row by row.

Both return, per row, a Proposal or the exception that row's drafting raised, so one failing row never
takes the others down; the scheduler lets such a request continue target-only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from verispec.batch import BatchKVCache, forward_rows
from verispec.models.llama import LlamaModel
from verispec.proposers.base import Proposal, Proposer
from verispec.sampling import SamplingParams, argmax, logits_to_probs, sample

Outcome = Proposal | BaseException


class BatchProposer(Protocol):
    def add(self, row: int, prompt: list[int], max_len: int) -> None: ...
    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator]) -> list[Outcome]: ...
    def observe(self, row: int, num_accepted: int, emitted: list[int]) -> None: ...
    def move(self, src: int, dst: int) -> None: ...
    def free(self, row: int) -> None: ...
    def stats(self, row: int) -> tuple[int, float]: ...  # draft forwards and seconds of the row's request


class BatchedDraft:
    def __init__(self, model: LlamaModel, rows: int, max_len: int, vocab_size: int, gamma: int) -> None:
        self.model, self.vocab_size = model, vocab_size
        self.cache = BatchKVCache(model, rows, max_len, slack=gamma + 2)
        self.pending: list[list[int]] = [[] for _ in range(rows)]
        self.limit = [0] * rows  # per-row max_len, as DraftModelProposer would have it
        self.fed = [0] * rows
        self.forwards = [0] * rows
        self.seconds = [0.0] * rows

    def add(self, row: int, prompt: list[int], max_len: int) -> None:
        cache = self.cache
        cache.free(row)
        self.limit[row] = min(max_len, cache.max_len)
        self.pending[row], self.fed[row], self.forwards[row], self.seconds[row] = prompt[-1:], 0, 0, 0.0
        if len(prompt) > 1:
            x = torch.tensor([prompt[:-1]], dtype=torch.long, device=self.model.device)
            self.model.forward(x, cache.row(row), last_n=1)
            cache.commit(row, len(prompt) - 1)

    def _to_target_vocab(self, logits: Tensor) -> Tensor:
        v = self.vocab_size
        if logits.shape[-1] > v:
            return logits[..., :v]
        if logits.shape[-1] < v:  # ids the draft lacks get probability 0
            return torch.nn.functional.pad(logits, (0, v - logits.shape[-1]), value=float("-inf"))
        return logits

    def _round(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
               generators: list[torch.Generator]) -> list[Proposal]:
        """Draft for `rows` together. On return every row's committed length is what it was on entry."""
        cache = self.cache
        base = {r: cache.lengths[r] for r in rows}
        gammas = [min(g, self.limit[r] - base[r] - len(self.pending[r]) - 1) for r, g in zip(rows, gammas)]
        tokens: dict[int, list[int]] = {r: [] for r in rows}
        qs: dict[int, list[Tensor]] = {r: [] for r in rows}
        feed = {r: self.pending[r] for r in rows}
        try:
            for step in range(max(gammas, default=0)):
                live = [i for i, g in enumerate(gammas) if g > step]
                live_rows = [rows[i] for i in live]
                t0 = time.perf_counter()
                logits = self._forward(live_rows, [feed[r] for r in live_rows])
                for j, i in enumerate(live):
                    r = rows[i]
                    cache.commit(r, len(feed[r]))  # provisional; undone below
                    last = self._to_target_vocab(logits[j][-1])
                    if sampling[i].greedy:
                        token = int(argmax(last))
                    else:
                        q = logits_to_probs(last, sampling[i])
                        token = int(sample(q, generators[i]))
                        qs[r].append(q)
                    tokens[r].append(token)
                    feed[r] = [token]
                share = (time.perf_counter() - t0) / len(live)
                for r in live_rows:
                    self.forwards[r] += 1
                    self.seconds[r] += share
            for r in rows:
                self.fed[r] = cache.lengths[r] - base[r]
        finally:
            for r in rows:
                cache.lengths[r] = base[r]
        return [Proposal(tokens=torch.tensor(tokens[r], dtype=torch.long),
                         q=torch.stack(qs[r]) if qs[r] else None) for r in rows]

    def _forward(self, rows: list[int], chains: list[list[int]]) -> list[Tensor]:
        """Several rows run batched; a lone row runs the model's own forward (what generate computes)."""
        if len(rows) > 1:
            return forward_rows(self.model, chains, self.cache, rows, last_only=True)
        x = torch.tensor([chains[0]], dtype=torch.long, device=self.model.device)
        return [self.model.forward(x, self.cache.row(rows[0]), last_n=1)[0]]

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator]) -> list[Outcome]:
        if not rows:
            return []
        states = [g.get_state() for g in generators]
        try:
            return list(self._round(rows, gammas, sampling, generators))
        except Exception as e:  # noqa: BLE001
            if len(rows) == 1:
                self.fed[rows[0]] = 0
                return [e]
        # The batch failed: retry row by row (from the same random state) so only the failing rows lose drafting.
        out: list[Outcome] = []
        for i, r in enumerate(rows):
            generators[i].set_state(states[i])
            try:
                out.append(self._round([r], [gammas[i]], [sampling[i]], [generators[i]])[0])
            except Exception as e:  # noqa: BLE001 - any draft failure only costs this row its drafting
                self.fed[r] = 0
                out.append(e)
        return out

    def observe(self, row: int, num_accepted: int, emitted: list[int]) -> None:
        # Same rule as DraftModelProposer.observe: keep pending + the accepted drafts that were fed.
        keep = min(len(self.pending[row]) + num_accepted, self.fed[row])
        self.cache.commit(row, keep)
        self.pending[row] = (self.pending[row] + emitted)[keep:]
        self.fed[row] = 0

    def move(self, src: int, dst: int) -> None:
        self.cache.move(src, dst)
        for attr in ("pending", "limit", "fed", "forwards", "seconds"):
            values = getattr(self, attr)
            values[dst] = values[src]
        self.free(src)

    def free(self, row: int) -> None:
        self.cache.free(row)
        self.pending[row], self.fed[row] = [], 0

    def stats(self, row: int) -> tuple[int, float]:
        return self.forwards[row], self.seconds[row]


class PerSequence:
    """Any single-sequence Proposer, one instance per row, built by `factory(max_len)`."""

    def __init__(self, factory: Callable[[int], Proposer]) -> None:
        self.factory = factory
        self.by_row: dict[int, Proposer] = {}

    def add(self, row: int, prompt: list[int], max_len: int) -> None:
        proposer = self.factory(max_len)
        if hasattr(proposer, "bind_target_cache"):
            raise ValueError("self-speculating proposers are not supported by the server")
        proposer.reset(prompt)
        self.by_row[row] = proposer

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator]) -> list[Outcome]:
        out: list[Outcome] = []
        for r, g, s, gen in zip(rows, gammas, sampling, generators):
            try:
                proposal = self.by_row[r].propose(g, s, gen)
                if proposal.extra is not None and proposal.extra.numel():
                    raise ValueError("proposals with extra tokens (lookahead) are not supported by the server")
                out.append(proposal)
            except Exception as e:  # noqa: BLE001
                out.append(e)
        return out

    def observe(self, row: int, num_accepted: int, emitted: list[int]) -> None:
        self.by_row[row].observe(num_accepted, emitted)

    def move(self, src: int, dst: int) -> None:
        proposer = self.by_row.pop(src, None)
        if proposer is None:  # the moved request had fallen back: no proposer to carry
            self.by_row.pop(dst, None)
        else:
            self.by_row[dst] = proposer

    def free(self, row: int) -> None:
        self.by_row.pop(row, None)

    def stats(self, row: int) -> tuple[int, float]:
        p = self.by_row.get(row)
        return getattr(p, "forwards", 0), getattr(p, "seconds", 0.0)
