"""Drafting with an EAGLE feature-level drafter (verispec.models.eagle): the target's own features, one layer.

The drafter's cache holds one entry per pair (h_t, token t+1) whose feature h_t is the *target's* (never a
prediction; with EAGLE-3's feature layers, their fusion, computed once as the pair becomes known): the prompt's
pairs, then after each round the pairs the verification forward made known, zip(Outcome.hidden, Outcome.emitted)
(the target's features at pending + the accepted drafts, each followed by the next emitted token). A round feeds
those pending pairs in one forward (committed: they are true), then drafts on with its own predicted features
(provisional: rolled back, since the next round brings the target's).

    prompt x0 x1 x2 (pending x2), target features h0 h1      pairs (h0, x1), (h1, x2) -> q for x3 -> d1
    drafting: (f3, d1) -> d2 ...                              f3 = the drafter's output at the last pair
    round accepts d1, emits (d1, r): new pairs (h2, d1), (h3, r)   h2, h3 from the verification forward

With a `DynamicTree` (EAGLE-2), a greedy row drafts a token tree instead of a chain: each depth expands the top_k
nodes most likely under the drafter (the product of its probabilities along the path) with their top_k tokens,
one tree forward per depth (each node sees its ancestors; its input feature is the drafter's output at its
parent), then the gamma most likely nodes of all drawn are verified. Which nodes are kept depends on their own
probabilities, which only greedy verification allows (a sampled round must verify draws it did not select by
value), so sampled rows draft a chain as before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from verispec.batch import Rows, make_rows
from verispec.models.eagle import EagleDrafter
from verispec.proposers.base import Outcome, Proposal, ProposerStats, charge, each_hidden
from verispec.proposers.draft_model import checked_confidence, draft_steps, to_vocab
from verispec.proposers.tree import depth_tree, path_to
from verispec.sampling import SamplingParams, Shaper


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2's draft tree: top_k nodes expanded per depth, top_k children each, `depth` depths; gamma nodes kept."""

    top_k: int = 4
    depth: int = 4

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.depth < 1:
            raise ValueError(f"an EAGLE tree needs top-k >= 1 and depth >= 1, got {self.top_k} and {self.depth}")


@dataclass
class _Grow:
    """One row's tree while it grows: every drawn node's token, parent, log-probability of its path and depth;
    the nodes run so far (in slot order) and the drafter's input feature for each node's children."""

    tokens: list[int]
    parents: list[int]
    scores: list[float]
    depths: list[int]
    fed: list[int]
    child_feature: dict[int, Tensor]


class EagleProposer:
    """An EAGLE drafter with its own one-layer KV cache of `rows` rows (see the module docstring)."""

    def __init__(self, drafter: EagleDrafter, max_len: int, vocab_size: int, *, rows: int = 1,
                 max_gamma: int = 16, tree: DynamicTree | None = None, confidence: float = 0.0) -> None:
        """confidence: a chain stops after a token the drafter gave less than this probability (0: never), so a
        deep gamma costs verification rows only where the drafter is sure; trees ignore it."""
        self.drafter, self.vocab_size, self.tree = drafter, vocab_size, tree
        self.confidence = checked_confidence(confidence)
        grown = 0 if tree is None else tree.top_k * (tree.depth - 1)  # slots a tree's growing writes past pending
        self.cache: Rows = make_rows(drafter, rows, max_len, slack=max(max_gamma, grown) + 2)
        self.max_len = self.cache.max_len
        self.tokens: dict[int, list[int]] = {}  # pending pairs' tokens (token t+1) ...
        self.features: dict[int, Tensor] = {}  # ... and the target's features h_t [k, H]
        self.fed: dict[int, int] = {}  # pairs fed in the row's current round (committed in observe)
        self._stats: dict[int, ProposerStats] = {}

    def reset(self, rows: list[int], prompts: list[list[int]], target: Rows | None = None,
              hidden: list[Tensor | None] | None = None) -> None:
        hidden = each_hidden(rows, hidden)
        if any(h is None and len(p) > 1 for h, p in zip(hidden, prompts)):
            raise ValueError("EAGLE drafting needs the target's hidden states (a native Llama-family target)")
        for row, prompt, h in zip(rows, prompts, hidden):
            self.cache.free(row)
            self.tokens[row] = list(prompt[1:])
            self.features[row] = self.drafter.fuse_features(h) if h is not None \
                else torch.empty(0, self.drafter.eagle.hidden_size)
            self.fed[row] = 0
            self._stats[row] = ProposerStats()

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator], shapes: list[Shaper | None] | None = None) -> list[Proposal]:
        # a row with no pair yet (a one-token prompt) drafts from its next round on
        gammas = [0 if not self.tokens[r] else min(g, self.max_len - self.cache.length(r) - len(self.tokens[r]) - 1)
                  for r, g in zip(rows, gammas)]
        trees = [i for i, (r, g, sp) in enumerate(zip(rows, gammas, sampling))
                 if self.tree is not None and g > 0 and sp.greedy and self._room(r)]
        chains = [i for i in range(len(rows)) if i not in trees]
        out: list[Proposal | None] = [None] * len(rows)
        if chains:
            sub = [rows[i] for i in chains]
            drafted = draft_steps(self.cache, sub, [self.tokens[r] for r in sub], [gammas[i] for i in chains],
                                  [sampling[i] for i in chains], [generators[i] for i in chains], self._stats,
                                  vocab_size=self.vocab_size, features=[self.features[r].to(torch.float32) for r in sub],
                                  shapes=None if shapes is None else [shapes[i] for i in chains],
                                  head_ids=self.drafter.head_ids, confidence=self.confidence)
            for i, r, n, p in zip(chains, sub, drafted.fed, drafted.proposals):
                self.fed[r] = min(n, len(self.tokens[r]))  # the pending pairs; the rest were drafting steps
                out[i] = p
        if trees:
            grown = self._grow([rows[i] for i in trees], [gammas[i] for i in trees],
                               None if shapes is None else [shapes[i] for i in trees])
            for i, p in zip(trees, grown):
                out[i] = p
        return out  # type: ignore[return-value]

    def _room(self, row: int) -> bool:
        """Whether growing a tree fits the row's cache (else it drafts a chain, within its max_len)."""
        assert self.tree is not None
        need = len(self.tokens[row]) + self.tree.top_k * (self.tree.depth - 1)
        return self.cache.length(row) + need <= self.cache.capacity

    def _grow(self, rows: list[int], budgets: list[int], shapes: list[Shaper | None] | None) -> list[Proposal]:
        """Greedy rows' trees (see the module docstring); every slot written here is rolled back on return, the
        pending pairs' to be committed by observe."""
        assert self.tree is not None
        cache, k = self.cache, self.tree.top_k
        base = {r: cache.length(r) for r in rows}
        grows = {r: _Grow([], [], [], [], [], {}) for r in rows}

        def children(r: int, j: int, node: int, logits: Tensor, feature: Tensor) -> None:
            g = grows[r]
            ids = self.drafter.head_ids  # the target ids of the head's rows (None: 0..rows-1)
            if shapes is not None and shapes[j] is not None:
                logits = shapes[j](to_vocab(logits, self.vocab_size, ids), path_to(g.tokens, g.parents, node))
                ids = None
            logp = torch.log_softmax((logits if ids is not None else logits[: self.vocab_size]).float(), -1)
            top = torch.topk(logp, min(k, logp.shape[-1]))
            g.child_feature[node] = feature
            for lp, x in zip(top.values.tolist(), top.indices.tolist()):
                if lp > float("-inf"):
                    g.tokens.append(x if ids is None else int(ids[x]))
                    g.parents.append(node)
                    g.scores.append((g.scores[node] if node >= 0 else 0.0) + lp)
                    g.depths.append(g.depths[node] + 1 if node >= 0 else 1)

        try:
            logits, states = self._forward(rows, [self.tokens[r] for r in rows], None,
                                           [self.features[r].to(torch.float32) for r in rows])
            for j, r in enumerate(rows):
                cache.commit(r, len(self.tokens[r]))
                self.fed[r] = len(self.tokens[r])
                children(r, j, -1, logits[j][-1], states[j][-1])
            for depth in range(1, self.tree.depth):
                expand = {}
                for r in rows:
                    g = grows[r]
                    at = [n for n in range(len(g.tokens)) if g.depths[n] == depth]
                    expand[r] = sorted(at, key=lambda n: -g.scores[n])[:k]
                live = [j for j, r in enumerate(rows) if expand[r]]
                if not live:
                    break
                sub = [rows[j] for j in live]
                trees = [depth_tree(grows[r].parents, grows[r].fed, expand[r], depth) for r in sub]
                feats = [torch.stack([grows[r].child_feature[grows[r].parents[n]] for n in expand[r]]) for r in sub]
                logits, states = self._forward(sub, [[grows[r].tokens[n] for n in expand[r]] for r in sub], trees,
                                               feats)
                for m, (j, r) in enumerate(zip(live, sub)):
                    cache.commit(r, len(expand[r]))
                    grows[r].fed.extend(expand[r])
                    for q, n in enumerate(expand[r]):
                        children(r, j, n, logits[m][q], states[m][q])
        finally:
            for r, b in base.items():
                cache.rollback(r, cache.length(r) - b)
        return [self._keep(grows[r], b) for r, b in zip(rows, budgets)]

    @staticmethod
    def _keep(g: _Grow, budget: int) -> Proposal:
        """The `budget` most likely nodes, ancestors first (a child is never likelier than its parent, and the
        sort is stable, so the kept set holds every kept node's parent), renumbered in topological order."""
        best = sorted(range(len(g.tokens)), key=lambda n: -g.scores[n])[:budget]
        kept = sorted(best, key=lambda n: (g.depths[n], n))
        index = {n: i for i, n in enumerate(kept)}
        parents = [index[g.parents[n]] if g.parents[n] >= 0 else -1 for n in kept]
        return Proposal(tokens=torch.tensor([g.tokens[n] for n in kept], dtype=torch.long),
                        parents=torch.tensor(parents, dtype=torch.long))

    def _forward(self, rows: list[int], chains: list[list[int]], trees, features: list[Tensor]):
        t0 = time.perf_counter()
        logits, states = self.cache.forward(rows, chains, trees=trees, features=features, hidden=True)
        charge(self._stats, rows, t0)
        return logits, states

    def observe(self, row: int, outcome: Outcome) -> None:
        """Commit the pairs fed this round; the round's new pairs, zip(hidden, emitted), are pending next."""
        if outcome.hidden is None:
            raise ValueError("EAGLE drafting needs the target's hidden states of every round")
        fed = self.fed[row]
        self.cache.commit(row, fed)
        self.tokens[row] = self.tokens[row][fed:] + list(outcome.emitted)
        t0 = time.perf_counter()
        fused = self.drafter.fuse_features(outcome.hidden).float()
        self._stats[row].seconds += time.perf_counter() - t0  # drafting work (EAGLE-3's fusion): c counts it
        self.features[row] = torch.cat([self.features[row][fed:], fused])
        self.fed[row] = 0

    def move(self, src: int, dst: int) -> None:
        self.cache.move(src, dst)
        for state in (self.tokens, self.features, self.fed, self._stats):
            state[dst] = state.pop(src)

    def free(self, row: int) -> None:
        self.cache.free(row)
        for state in (self.tokens, self.features, self.fed, self._stats):
            state.pop(row, None)

    def stats(self, row: int) -> ProposerStats:
        return self._stats[row]
