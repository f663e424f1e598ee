"""Token trees from a draft model (SpecInfer, Sequoia): where the draft is unsure, try its second and third choices
in the same verification forward instead of betting the whole round on its first.

One round, per row: the draft runs its pending tokens, then one forward per depth over that depth's nodes that have
children (a tree mask: each node sees its ancestors), drawing each node's children:
  * greedy: the draft's top-k tokens, best first (greedy verification follows the target's argmax, whatever q);
  * sampled: k draws *without replacement* from q, each child's q being q with its earlier siblings removed and
    renormalised, which is what recursive rejection sampling (verispec.verify.verify_tree) needs to stay exact.
The tree's shape is chosen before the round's draws (theory.plan_tree), from the row's measured acceptance by rank
and the verification-cost curve of this machine: on a CPU where 9 tokens cost 2.3x one, it is often a short chain;
where verification is flat (a GPU), a wide tree. After verification the draft keeps only the accepted path's keys
and values (Rows.commit_path), as the target does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from verispec.batch import Rows, Tree, make_rows, prefill_rows
from verispec.models.base import CausalLM
from verispec.proposers.base import Outcome, Proposal, ProposerStats, charge
from verispec.proposers.draft_model import checked_window, draft_context, probs_on_vocab, to_vocab
from verispec.sampling import SamplingParams, Shaper, sample
from verispec.theory import TreeShape, VerifyCost, flat_cost, plan_tree

PRIOR_RANK_ACCEPT = (0.7, 0.12, 0.05, 0.02)  # r_j before a row has measured its own (the packaged pair, greedy)


def draw_children(logits: Tensor, k: int, sampling: SamplingParams, generator: torch.Generator,
                  vocab_size: int | None = None) -> tuple[list[int], list[Tensor]]:
    """Up to k children of one node from the draft's logits [V'] on a vocabulary of vocab_size ids (default V';
    ids past V' have probability 0): greedy, its top-k (no q); sampled, draws without replacement, each with the
    q [vocab_size] it was drawn from (fewer than k where q has fewer tokens)."""
    vocab = logits.shape[-1] if vocab_size is None else vocab_size
    if sampling.greedy:  # the top k, less any a grammar forbids (-inf)
        top = torch.topk(logits[:vocab].float(), min(k, logits[:vocab].shape[-1]))
        return top.indices[top.values > float("-inf")].tolist(), []
    q = probs_on_vocab(logits, sampling, vocab)
    tokens, qs = [], []
    for _ in range(k):
        mass = q.sum()
        if not mass > 0:  # none left (or a constraint left the draft no id: a NaN sum)
            break
        q = q / mass
        x = int(sample(q, generator))
        tokens.append(x)
        qs.append(q)
        q = q.clone()
        q[x] = 0.0
    return tokens, qs


def path_to(tokens: list[int], parents: list[int], node: int) -> list[int]:
    """The tokens from the root down to `node` (-1: none), root first."""
    path = []
    while node >= 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


def depth_tree(parents: list[int], fed: list[int], feed: list[int], depth: int) -> Tree:
    """The draft forward of one depth of a tree: `feed` (drawn nodes at `depth`, 1 for the root's children) after
    the nodes `fed` already run (provisionally committed, K = len(fed) slots back, after the pending tokens);
    each sees its fed ancestors and itself. parents: every drawn node's parent (-1: the root)."""
    back = len(fed)
    slot = {node: k for k, node in enumerate(fed)}
    mask = torch.zeros(len(feed), back + len(feed), dtype=torch.bool)
    for j, node in enumerate(feed):
        mask[j, back + j] = True
        parent = parents[node]
        while parent >= 0:
            mask[j, slot[parent]] = True
            parent = parents[parent]
    # the pending tokens end one position before depth 1: offsets count from the length after the fed nodes
    positions = torch.full((len(feed),), depth - 1 - back, dtype=torch.long)
    return Tree(positions=positions, mask=mask)


@dataclass
class RowTree:
    """One row's state: its pending tokens, measured acceptance by rank, and its last round's tree."""

    pending: list[int]
    hits: list[float]
    chances: list[float]
    paused: int = 0  # rounds in a row decoded plainly because no tree paid
    wait: int = 0  # paused rounds before the next 1-node probe (doubled after each rejected probe)
    probing: bool = False
    # the last round's drawn nodes (a sampled node may get fewer children than its shape asks)
    parents: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    fed: list[int] = field(default_factory=list)  # drawn nodes the draft ran, in the order their slots follow pending


class TreeDraftProposer:
    """A draft model drafting token trees for `rows` sequences (see the module docstring).

    gamma is the tree's node budget: the verification forward runs gamma + 1 tokens at most. rank_accept seeds the
    per-rank acceptance each row then measures (prior_weight rounds' worth, forgotten by `decay` a round, as text
    turns from code to prose); verify_cost and c price a tree. pause: where no tree is predicted to beat a plain
    step, the row decodes plainly, with a 1-node probe after probe_every such rounds (the wait doubles after a
    rejected probe, up to 8x), as AdaptiveGammaProposer does for chains.
    """

    def __init__(self, model: CausalLM, max_len: int, vocab_size: int | None = None, *, rows: int = 1,
                 max_gamma: int = 16, c: float = 0.25, verify_cost: VerifyCost = flat_cost,
                 rank_accept: tuple[float, ...] = PRIOR_RANK_ACCEPT, prior_weight: float = 4.0, decay: float = 0.9,
                 shape: TreeShape | None = None, pause: bool = False, probe_every: int = 4,
                 context: int | None = None) -> None:
        """shape: a fixed tree for every round (tests, benchmarks) instead of one planned per round; context: the
        draft reads only the first and last tokens of a longer prompt, as the chain's draft does (draft_context)."""
        self.context = checked_window(context)
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.decay, self.pause, self.probe_every = decay, pause, probe_every
        self.model = model
        self.vocab_size = vocab_size or model.vocab_size
        self.cache: Rows = make_rows(model, rows, max_len, slack=max_gamma + 2)
        self.max_len = self.cache.max_len
        self.c, self.verify_cost, self.fixed = c, verify_cost, shape
        self.prior = [a * prior_weight for a in rank_accept], [prior_weight] * len(rank_accept)
        self.rows: dict[int, RowTree] = {}
        self._stats: dict[int, ProposerStats] = {}
        # every row's raw counts (no prior, no forgetting), for reports: accepted at rank j / nodes with a rank j child
        self.rank_hits, self.rank_chances = [0] * len(rank_accept), [0] * len(rank_accept)

    def rank_accept(self, row: int) -> list[float]:
        t = self.rows[row]
        return [h / n for h, n in zip(t.hits, t.chances)]

    def reset(self, rows: list[int], prompts: list[list[int]], target: Rows | None = None,
              hidden: list[Tensor | None] | None = None) -> None:
        prefill_rows(self.cache, rows, [draft_context(p[:-1], self.context) for p in prompts])  # one forward
        for row, prompt in zip(rows, prompts):
            self.rows[row] = RowTree(prompt[-1:], list(self.prior[0]), list(self.prior[1]))
            self._stats[row] = ProposerStats()

    def shape_for(self, row: int, budget: int) -> TreeShape:
        """This round's tree: the planned one, or none (a plain step) where pausing pays."""
        if self.fixed is not None:
            return self.fixed if len(self.fixed) <= budget else TreeShape.chain(budget)
        t = self.rows[row]
        shape, speed = plan_tree(self.rank_accept(row), budget, self.c, self.verify_cost)
        t.probing = False
        if self.pause and speed < 1.0 / self.verify_cost(1):
            t.paused += 1
            t.wait = t.wait or self.probe_every
            if t.paused <= t.wait:
                return TreeShape((), ())
            t.paused, t.probing = 0, True
            return TreeShape.chain(1)  # a probe keeps the acceptance estimates current
        t.paused, t.wait = 0, 0
        return shape

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator], shapes: list[Shaper | None] | None = None) -> list[Proposal]:
        cache = self.cache
        budgets = [min(g, self.max_len - cache.length(r) - len(self.rows[r].pending) - 1) for r, g in zip(rows, gammas)]
        plans = {i: self.shape_for(rows[i], b) for i, b in enumerate(budgets) if b > 0}
        live = [i for i, shape in plans.items() if len(shape)]
        tokens: dict[int, list[int]] = {i: [] for i in live}
        qs: dict[int, list[Tensor]] = {i: [] for i in live}
        for i in range(len(rows)):
            t = self.rows[rows[i]]
            t.parents, t.ranks, t.fed = [], [], []
        base = {i: cache.length(rows[i]) for i in live}
        # Drawn node -> its node in the shape (a sampled node may get fewer children than asked, so drawn nodes are
        # a subset); drawn parents are indices of drawn nodes.
        drawn_shape: dict[int, list[int]] = {i: [] for i in live}
        try:
            # depth 0: the pending tokens; their last logits draw the root's children
            frontier = {}  # row -> (drawn node, its logits) whose children come next
            if live:
                logits = self._forward([rows[i] for i in live], [self.rows[rows[i]].pending for i in live], None)
                for j, i in enumerate(live):
                    cache.commit(rows[i], len(self.rows[rows[i]].pending))
                    frontier[i] = [(-1, logits[j][-1])]
            depth = 0
            while live:
                depth += 1
                to_feed: dict[int, list[int]] = {}
                for i in live:
                    t, shape = self.rows[rows[i]], plans[i]
                    for node, lg in frontier[i]:
                        want = shape.children(drawn_shape[i][node]) if node >= 0 else shape.children(-1)
                        if shapes is not None and shapes[i] is not None:
                            lg = shapes[i](to_vocab(lg, self.vocab_size), path_to(tokens[i], t.parents, node))
                        kids, kq = draw_children(lg, len(want), sampling[i], generators[i], self.vocab_size)
                        for rank, (x, shape_node) in enumerate(zip(kids, want)):
                            tokens[i].append(x)
                            t.parents.append(node)
                            t.ranks.append(rank)
                            drawn_shape[i].append(shape_node)
                            if kq:
                                qs[i].append(kq[rank])
                            if shape.children(shape_node):
                                to_feed.setdefault(i, []).append(len(tokens[i]) - 1)
                live = [i for i in live if i in to_feed]
                if not live:
                    break
                trees = [depth_tree(self.rows[rows[i]].parents, self.rows[rows[i]].fed, to_feed[i], depth)
                         for i in live]
                logits = self._forward([rows[i] for i in live],
                                       [[tokens[i][n] for n in to_feed[i]] for i in live], trees)
                for j, i in enumerate(live):
                    cache.commit(rows[i], len(to_feed[i]))
                    self.rows[rows[i]].fed.extend(to_feed[i])
                    frontier[i] = list(zip(to_feed[i], logits[j]))
        finally:
            for i, b in base.items():
                cache.rollback(rows[i], cache.length(rows[i]) - b)
        out = []
        for i, r in enumerate(rows):
            t = self.rows[r]
            if i not in tokens or not tokens[i]:
                out.append(Proposal(tokens=torch.empty(0, dtype=torch.long)))
                continue
            out.append(Proposal(tokens=torch.tensor(tokens[i], dtype=torch.long),
                                q=torch.stack(qs[i]) if qs[i] else None,
                                parents=torch.tensor(t.parents, dtype=torch.long)))
        return out

    def _forward(self, rows: list[int], chains: list[list[int]], trees: list[Tree] | None) -> list[Tensor]:
        t0 = time.perf_counter()
        logits = self.cache.forward(rows, chains, last_only=trees is None, trees=trees)
        charge(self._stats, rows, t0)
        return logits

    def observe(self, row: int, outcome: Outcome) -> None:
        """Keep the pending tokens and the accepted nodes the draft ran (a prefix of the path); the rest of what
        was emitted becomes pending. Count, at each node the path passed through, which rank was accepted."""
        t = self.rows[row]
        path = outcome.path or []
        if t.parents:
            fed_at = {node: k for k, node in enumerate(t.fed)}
            kept = [node for node in path if node in fed_at]
            assert kept == path[: len(kept)], (path, t.fed)
            offsets = list(range(len(t.pending))) + [len(t.pending) + fed_at[node] for node in kept]
            self.cache.commit_path(row, offsets)
            t.pending = (t.pending + outcome.emitted)[len(offsets):]
            self._count(t, path)
        else:
            t.pending = t.pending + outcome.emitted
        t.parents, t.ranks, t.fed = [], [], []

    def _count(self, t: RowTree, path: list[int]) -> None:
        if t.probing:
            rejected = not path
            t.wait = min(2 * t.wait, 8 * self.probe_every) if rejected else self.probe_every
        t.hits = [h * self.decay for h in t.hits]
        t.chances = [n * self.decay for n in t.chances]
        for node, nxt in zip([-1] + path, path + [None]):
            kids = [i for i, parent in enumerate(t.parents) if parent == node]
            for rank in range(min(len(kids), len(t.hits))):
                t.chances[rank] += 1
                self.rank_chances[rank] += 1
            if nxt is not None and t.ranks[nxt] < len(t.hits):
                t.hits[t.ranks[nxt]] += 1
                self.rank_hits[t.ranks[nxt]] += 1

    def move(self, src: int, dst: int) -> None:
        self.cache.move(src, dst)
        for state in (self.rows, self._stats):
            state[dst] = state.pop(src)

    def free(self, row: int) -> None:
        self.cache.free(row)
        for state in (self.rows, self._stats):
            state.pop(row, None)

    def stats(self, row: int) -> ProposerStats:
        return self._stats[row]
