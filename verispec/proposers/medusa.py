"""Drafting with Medusa heads (verispec.models.medusa): all of a round's guesses from one target feature.

The pending token was chosen by the target's LM head at the feature h_t just before it (the round's Outcome.hidden
ends with it; at reset, the prompt's last feature). Head k reads h_t and guesses the token k+1 after the pending
one, so a chain of up to K tokens comes from one call, for every row at once. A sampled chain draws each token from
its own head's q_k; the heads never see each other's draws, so q_k is exactly what that token was drawn from given
everything before it, and the chain verifier's rule applies unchanged.

With a `MedusaPlan` the tree's widths are chosen every round (theory.medusa_widths) from the row's measured
acceptance by head and rank and this machine's verification-cost curve, down to a plain step where no tree pays.
Every round scores each head's top choices against the tokens the target emitted, whatever was drafted, so the
estimates stay current while the row decodes plainly. The widths depend only on earlier rounds: exact.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from verispec.batch import Rows
from verispec.models.llama import last_block
from verispec.models.medusa import MedusaHeads
from verispec.proposers.base import Outcome, Proposal, ProposerStats, charge, each_hidden
from verispec.proposers.draft_model import probs_on_vocab, to_vocab
from verispec.proposers.tree import draw_children, path_to
from verispec.sampling import SamplingParams, Shaper, argmax, logits_to_probs, sample
from verispec.theory import VerifyCost, flat_cost, medusa_widths

PRIOR_HEAD_ACCEPT = (0.3, 0.06, 0.03, 0.02)  # head 0's acceptance by rank before a row has measured its own;
PRIOR_HEAD_DECAY = 0.6  # head d's is head 0's times this ** d (the real pair's heads: 0.18 alpha, falling with d)


@dataclass(frozen=True)
class MedusaPlan:
    """Tree widths planned per round from measured acceptance (see the module docstring). c: the heads' call over
    a target step (0.07-0.10 measured on the real pair); prior_weight rounds' worth of the prior, forgotten by
    `decay` a round."""

    verify_cost: VerifyCost = flat_cost
    c: float = 0.08
    max_width: int = 4
    prior_weight: float = 4.0
    decay: float = 0.9


@dataclass
class _Counts:
    hits: list[list[float]]  # [head][rank]: rounds in which the head's rank-j choice was the target's token
    chances: list[float]  # [head]: rounds in which the target's token at the head's depth was known
    guesses: list[list[int]] | None = None  # the last round's top choices of each head
    widths: tuple[int, ...] = field(default_factory=tuple)  # the last round's planned widths


class MedusaProposer:
    """Medusa heads over the target's features; no cache of its own.

    widths (w_1, w_2, ..): a token tree instead of a chain, each node at depth d - 1 getting w_d children from head
    d - 1 (its top-w_d when greedy; w_d draws without replacement when sampled, each with the q it was drawn from,
    as verispec.verify.verify_tree needs), breadth first, up to the round's gamma nodes. Empty: a chain."""

    def __init__(self, heads: MedusaHeads, vocab_size: int, widths: tuple[int, ...] = (),
                 plan: MedusaPlan | None = None) -> None:
        if any(w < 1 for w in widths) or len(widths) > heads.medusa.heads:
            raise ValueError(f"tree widths must be >= 1, at most one per head ({heads.medusa.heads}), got {widths}")
        if widths and plan is not None:
            raise ValueError("give fixed tree widths or a plan, not both")
        self.heads, self.vocab_size, self.widths, self.plan = heads, vocab_size, widths, plan
        self.feature: dict[int, Tensor | None] = {}  # [1, H] the target's feature that chose the pending token
        self.counts: dict[int, _Counts] = {}
        self._stats: dict[int, ProposerStats] = {}

    def accept(self, row: int) -> list[list[float]]:
        """The row's estimated acceptance [head][rank] (prior included)."""
        c = self.counts[row]
        return [[h / max(n, 1e-9) for h in hits] for hits, n in zip(c.hits, c.chances)]

    def widths_for(self, row: int, budget: int) -> tuple[int, ...]:
        """This round's widths: the fixed ones, the planned ones, or () for a chain (no plan) / a plain step."""
        if self.plan is None:
            return self.widths
        plan = self.plan
        widths, _ = medusa_widths(self.accept(row), budget, plan.c, plan.verify_cost, plan.max_width)
        self.counts[row].widths = widths
        return widths

    def reset(self, rows: list[int], prompts: list[list[int]], target: Rows | None = None,
              hidden: list[Tensor | None] | None = None) -> None:
        hidden = each_hidden(rows, hidden)
        if any(h is None and len(p) > 1 for h, p in zip(hidden, prompts)):
            raise ValueError("Medusa heads need the target's hidden states (a native Llama-family target)")
        for row, h in zip(rows, hidden):
            self.feature[row] = last_block(h[-1:], self.heads.medusa.hidden_size) \
                if h is not None and len(h) else None  # none for 1-token prompts
            self._stats[row] = ProposerStats()
            if self.plan is not None:
                k, w = self.heads.medusa.heads, self.plan.max_width
                prior = [[a * PRIOR_HEAD_DECAY ** d * self.plan.prior_weight for a in PRIOR_HEAD_ACCEPT[:w]]
                         + [0.0] * (w - len(PRIOR_HEAD_ACCEPT[:w])) for d in range(k)]
                self.counts[row] = _Counts(prior, [self.plan.prior_weight] * k)

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator], shapes: list[Shaper | None] | None = None) -> list[Proposal]:
        out = [Proposal(tokens=torch.empty(0, dtype=torch.long)) for _ in rows]
        live = [i for i, (r, g) in enumerate(zip(rows, gammas)) if g > 0 and self.feature[r] is not None]
        if not live:
            return out
        t0 = time.perf_counter()
        with torch.no_grad():
            logits = self.heads(torch.cat([self.feature[rows[i]] for i in live]))  # [n, K, V']
        if self.plan is not None:
            for r in rows:
                self.counts[r].guesses = None
            top = torch.topk(logits[..., : self.vocab_size], self.plan.max_width, dim=-1).indices.tolist()
        for j, i in enumerate(live):
            shape = shapes[i] if shapes is not None else None
            if self.plan is not None:
                self.counts[rows[i]].guesses = top[j]
            widths = self.widths_for(rows[i], gammas[i])
            if widths:
                out[i] = self._tree(logits[j], gammas[i], sampling[i], generators[i], widths, shape)
                continue
            if self.plan is not None:  # no tree pays: a plain step (the heads' guesses are scored all the same)
                continue
            last = logits[j, : gammas[i], : self.vocab_size]  # [gamma', V'], V' <= V: ids past V' have q = 0
            if shape is not None:
                out[i] = self._shaped_chain(last, sampling[i], generators[i], shape)
            elif sampling[i].greedy:
                out[i] = Proposal(tokens=argmax(last))
            else:
                q = probs_on_vocab(last, sampling[i], self.vocab_size)
                out[i] = Proposal(tokens=sample(q[:, : last.shape[-1]], generators[i]), q=q)  # the zeros cut
        charge(self._stats, [rows[i] for i in live], t0)
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
              widths: tuple[int, ...], shape: Shaper | None = None) -> Proposal:
        """Breadth-first: the children of every node at one depth from that depth's head, until `budget` nodes."""
        tokens: list[int] = []
        parents: list[int] = []
        qs: list[Tensor] = []
        level = [-1]  # the pending token
        for depth, width in enumerate(widths):
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
        # chose the last emitted token, the next round's pending one
        self.feature[row] = last_block(outcome.hidden[-1:], self.heads.medusa.hidden_size)
        if self.plan is not None and self.counts[row].guesses is not None:
            self._score(self.counts[row], outcome.emitted)

    def _score(self, c: _Counts, emitted: list[int]) -> None:
        """Head d's choices against the target's token at depth d + 1, for the depths the round reached (the token
        after d accepted drafts: emitted[d])."""
        assert self.plan is not None and c.guesses is not None
        c.hits = [[h * self.plan.decay for h in hits] for hits in c.hits]
        c.chances = [n * self.plan.decay for n in c.chances]
        for d, (token, guesses) in enumerate(zip(emitted, c.guesses)):
            c.chances[d] += 1
            if token in guesses:
                c.hits[d][guesses.index(token)] += 1

    def move(self, src: int, dst: int) -> None:
        for state in (self.feature, self._stats, self.counts):
            if src in state:
                state[dst] = state.pop(src)

    def free(self, row: int) -> None:
        for state in (self.feature, self._stats, self.counts):
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
