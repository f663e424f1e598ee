"""Drafting with Medusa heads (verispec.models.medusa): all of a round's guesses from one target feature.

The pending token was chosen by the target's LM head at the feature h_t just before it (the round's Outcome.hidden
ends with it; at reset, the prompt's last feature). Head k reads h_t and guesses the token k+1 after the pending
one, so a chain of up to K tokens comes from one call, for every row at once. A sampled chain draws each token from
its own head's q_k; the heads never see each other's draws, so q_k is exactly what that token was drawn from given
everything before it, and the chain verifier's rule applies unchanged.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from verispec.batch import Rows
from verispec.models.medusa import MedusaHeads
from verispec.proposers.base import Outcome, Proposal, ProposerStats
from verispec.proposers.draft_model import probs_on_vocab, to_vocab
from verispec.proposers.tree import draw_children, path_to
from verispec.sampling import SamplingParams, Shaper, argmax, logits_to_probs, sample


class MedusaProposer:
    """Medusa heads over the target's features; no cache of its own.

    widths (w_1, w_2, ..): a token tree instead of a chain, each node at depth d - 1 getting w_d children from head
    d - 1 (its top-w_d when greedy; w_d draws without replacement when sampled, each with the q it was drawn from,
    as verispec.verify.verify_tree needs), breadth first, up to the round's gamma nodes. Empty: a chain."""

    def __init__(self, heads: MedusaHeads, vocab_size: int, widths: tuple[int, ...] = ()) -> None:
        if any(w < 1 for w in widths) or len(widths) > heads.medusa.heads:
            raise ValueError(f"tree widths must be >= 1, at most one per head ({heads.medusa.heads}), got {widths}")
        self.heads, self.vocab_size, self.widths = heads, vocab_size, widths
        self.feature: dict[int, Tensor | None] = {}  # [1, H] the target's feature that chose the pending token
        self._stats: dict[int, ProposerStats] = {}

    def reset(self, row: int, prompt: list[int], target: Rows | None = None, hidden: Tensor | None = None) -> None:
        if hidden is None and len(prompt) > 1:
            raise ValueError("Medusa heads need the target's hidden states (a native Llama-family target)")
        self.feature[row] = hidden[-1:] if hidden is not None and len(hidden) else None  # none for 1-token prompts
        self._stats[row] = ProposerStats()

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator], shapes: list[Shaper | None] | None = None) -> list[Proposal]:
        out = [Proposal(tokens=torch.empty(0, dtype=torch.long)) for _ in rows]
        live = [i for i, (r, g) in enumerate(zip(rows, gammas)) if g > 0 and self.feature[r] is not None]
        if not live:
            return out
        t0 = time.perf_counter()
        with torch.no_grad():
            logits = self.heads(torch.cat([self.feature[rows[i]] for i in live]))  # [n, K, V']
        for j, i in enumerate(live):
            shape = shapes[i] if shapes is not None else None
            if self.widths:
                out[i] = self._tree(logits[j], gammas[i], sampling[i], generators[i], shape)
                continue
            last = logits[j, : gammas[i], : self.vocab_size]  # [gamma', V'], V' <= V: ids past V' have q = 0
            if shape is not None:
                out[i] = self._shaped_chain(last, sampling[i], generators[i], shape)
            elif sampling[i].greedy:
                out[i] = Proposal(tokens=argmax(last))
            else:
                q = probs_on_vocab(last, sampling[i], self.vocab_size)
                out[i] = Proposal(tokens=sample(q, generators[i]), q=q)
        share = (time.perf_counter() - t0) / len(live)
        for i in live:
            self._stats[rows[i]].forwards += 1
            self._stats[rows[i]].seconds += share
        return out

    def _shaped_chain(self, logits: Tensor, sampling: SamplingParams, generator: torch.Generator,
                      shape: Shaper) -> Proposal:
        """A chain from the heads' logits [gamma', V'], head k's shaped after the k tokens drawn before it."""
        tokens: list[int] = []
        qs = []
        for head in logits:
            shaped = shape(to_vocab(head, self.vocab_size), tokens)
            if sampling.greedy:
                tokens.append(int(argmax(shaped)))
            else:
                q = logits_to_probs(shaped, sampling)
                tokens.append(int(sample(q, generator)))
                qs.append(q)
        return Proposal(tokens=torch.tensor(tokens, dtype=torch.long), q=torch.stack(qs) if qs else None)

    def _tree(self, logits: Tensor, budget: int, sampling: SamplingParams, generator: torch.Generator,
              shape: Shaper | None = None) -> Proposal:
        """Breadth-first: the children of every node at one depth from that depth's head, until `budget` nodes."""
        tokens: list[int] = []
        parents: list[int] = []
        qs: list[Tensor] = []
        level = [-1]  # the pending token
        for depth, width in enumerate(self.widths):
            below = []
            for parent in level:
                head = logits[depth]
                if shape is not None:
                    head = shape(to_vocab(head, self.vocab_size), path_to(tokens, parents, parent))
                for token, q in zip(*_children(head, min(width, budget - len(tokens)), sampling, generator,
                                               self.vocab_size)):
                    below.append(len(tokens))
                    tokens.append(token)
                    parents.append(parent)
                    qs.append(q)
            level = below
            if len(tokens) >= budget or not level:
                break
        return Proposal(tokens=torch.tensor(tokens, dtype=torch.long),
                        q=None if sampling.greedy or not qs else torch.stack(qs),
                        parents=torch.tensor(parents, dtype=torch.long))

    def observe(self, row: int, outcome: Outcome) -> None:
        if outcome.hidden is None:
            raise ValueError("Medusa heads need the target's hidden states of every round")
        self.feature[row] = outcome.hidden[-1:]  # chose the last emitted token, the next round's pending one

    def move(self, src: int, dst: int) -> None:
        for state in (self.feature, self._stats):
            state[dst] = state.pop(src)

    def free(self, row: int) -> None:
        for state in (self.feature, self._stats):
            state.pop(row, None)

    def stats(self, row: int) -> ProposerStats:
        return self._stats[row]


def _children(logits: Tensor, k: int, sampling: SamplingParams, generator: torch.Generator,
              vocab_size: int) -> tuple[list, list]:
    """draw_children, with a None q per child when greedy (greedy tree verification reads no q)."""
    if k < 1:
        return [], []
    tokens, qs = draw_children(logits, k, sampling, generator, vocab_size)
    return tokens, qs if qs else [None] * len(tokens)
