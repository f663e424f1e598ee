"""The speed model of speculative decoding (Leviathan et al. 2023, section 3), for choosing gamma.

With i.i.d. acceptance rate alpha, a round that drafts gamma tokens emits on average
    E[tokens] = (1 - alpha^(gamma+1)) / (1 - alpha)        (= gamma + 1 when alpha = 1)
and costs gamma draft forwards plus one target forward, i.e. (gamma * c + 1) target-forward units, where
c = draft cost / target cost. The speedup over plain decoding is E[tokens] / (gamma * c + 1). This assumes a
verification forward costs the same as a one-token forward (true while it is memory-bound); where it does not,
`verify_cost(k)` (a target forward over k tokens in one-token units, from a measured curve) replaces the 1.

alpha here is the per-token acceptance probability. Measured, it is accepted / (accepted + rejections)
(metrics.alpha_iid), not accepted / drafted: drafts after a rejection are never tested.

Trees (Sequoia, EAGLE-2): let r_j be the probability that a node's child of rank j (the draft's j-th choice) is
the one accepted, the same at every node. A node is reached when every edge above it is accepted, so a tree emits
on average 1 + sum over its nodes of the product of r over the node's path, and the n nodes of highest such value
form the best n-node tree (a child is worth less than its parent, rank j+1 less than rank j). It costs one target
forward over n + 1 tokens and one draft forward per depth that has children to draw, each over that depth's
nodes. r = (alpha,) gives back the chain formulas above.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

VerifyCost = Callable[[int], float]


def flat_cost(k: int) -> float:
    return 1.0


def interpolate_cost(points: Sequence[tuple[int, float]]) -> VerifyCost:
    """A verification-cost function from measured (tokens, cost relative to one token) points: linear between
    them, extended along the last segment's slope beyond the largest, the smallest's cost below it."""
    pts = sorted(points)
    if not pts:
        return flat_cost

    def cost(k: int) -> float:
        if k <= pts[0][0] or len(pts) == 1:
            return pts[0][1]
        for (k0, c0), (k1, c1) in zip(pts, pts[1:]):
            if k <= k1:
                return c0 + (c1 - c0) * (k - k0) / (k1 - k0)
        (k0, c0), (k1, c1) = pts[-2], pts[-1]
        return c1 + (c1 - c0) * (k - k1) / (k1 - k0)

    return cost


def _check(alpha: float, gamma: int, c: float = 0.0) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")


def expected_tokens(alpha: float, gamma: int) -> float:
    """Mean tokens emitted per round (accepted + the recovered/bonus token). 0.8, 5 -> 3.689."""
    _check(alpha, gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float, verify_cost: VerifyCost = flat_cost) -> float:
    _check(alpha, gamma, c)
    return expected_tokens(alpha, gamma) / (gamma * c + verify_cost(gamma + 1))


def optimal_gamma(alpha: float, c: float, max_gamma: int = 16, verify_cost: VerifyCost = flat_cost) -> int:
    """The gamma in 1..max_gamma with the highest predicted speedup (the smallest on ties)."""
    return max(range(1, max_gamma + 1), key=lambda g: (predicted_speedup(alpha, g, c, verify_cost), -g))


def table(alphas: list[float], gammas: list[int], c: float) -> str:
    """Markdown: expected tokens and predicted speedup for each alpha x gamma, with the optimal gamma."""
    head = "| α | " + " | ".join(f"γ={g}" for g in gammas) + " | optimal γ |"
    rows = [head, "|" + "---|" * (len(gammas) + 2)]
    for a in alphas:
        cells = [f"{expected_tokens(a, g):.2f} tok, {predicted_speedup(a, g, c):.2f}×" for g in gammas]
        rows.append(f"| {a} | " + " | ".join(cells) + f" | {optimal_gamma(a, c)} |")
    return "\n".join(rows)


@dataclass(frozen=True)
class TreeShape:
    """A token tree's shape: node i is its parent's ranks[i]-th child (parents[i] < i, -1 the pending token),
    nodes by depth, siblings by rank. Built from rank paths: (0,) the root's first child, (0, 1) its second."""

    parents: tuple[int, ...]
    ranks: tuple[int, ...]

    @classmethod
    def from_paths(cls, paths: Sequence[tuple[int, ...]]) -> "TreeShape":
        order = sorted(set(paths), key=lambda p: (len(p), p))
        index = {p: i for i, p in enumerate(order)}
        for p in order:  # every node's parent and earlier siblings are in the tree
            if not p or (len(p) > 1 and p[:-1] not in index) or (p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in index):
                raise ValueError(f"tree node {p} lacks its parent or an earlier sibling")
        return cls(tuple(index[p[:-1]] if len(p) > 1 else -1 for p in order), tuple(p[-1] for p in order))

    @classmethod
    def chain(cls, n: int) -> "TreeShape":
        return cls(tuple(range(-1, n - 1)), (0,) * n)

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> list[int]:
        """Depth of each node (the root's children: 1)."""
        out: list[int] = []
        for parent in self.parents:
            out.append(1 if parent < 0 else out[parent] + 1)
        return out

    def children(self, node: int) -> list[int]:
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def fed(self) -> list[int]:
        """Nodes with children: the ones a drafter must run to draw the next depth."""
        return sorted({parent for parent in self.parents if parent >= 0})


def expected_tree_tokens(shape: TreeShape, rank_accept: Sequence[float]) -> float:
    """Mean tokens a round emits with this tree: 1 + sum over nodes of the product of r along its path."""
    value: list[float] = []
    for parent, rank in zip(shape.parents, shape.ranks):
        r = rank_accept[rank] if rank < len(rank_accept) else 0.0
        value.append((1.0 if parent < 0 else value[parent]) * r)
    return 1.0 + sum(value)


def tree_cost(shape: TreeShape, c: float, verify_cost: VerifyCost = flat_cost) -> float:
    """A round's cost in one-token target forwards: drafting (the pending token, then each depth's nodes that have
    children, one draft forward each, the draft's width costing as the target's does) plus verifying n + 1 tokens."""
    depths = shape.depths
    widths: dict[int, int] = {}
    for node in shape.fed():
        widths[depths[node]] = widths.get(depths[node], 0) + 1
    drafting = (verify_cost(1) + sum(verify_cost(w) for w in widths.values())) if len(shape) else 0.0
    return c * drafting + verify_cost(len(shape) + 1)


def best_tree(rank_accept: Sequence[float], n: int) -> TreeShape:
    """The n-node tree of highest expected tokens under per-rank acceptance r (made non-increasing first)."""
    r: list[float] = []
    for a in rank_accept:
        r.append(min(max(a, 0.0), r[-1] if r else 1.0))
    if n <= 0 or not r:
        return TreeShape((), ())
    heap: list[tuple[float, int, tuple[int, ...], float]] = [(-r[0], 0, (0,), 1.0)]  # (-value, tie, path, parent's)
    chosen: list[tuple[int, ...]] = []
    tie = 1
    while heap and len(chosen) < n:
        neg, _, path, above = heapq.heappop(heap)
        chosen.append(path)
        heapq.heappush(heap, (neg * r[0], tie, path + (0,), -neg))  # its first child
        if path[-1] + 1 < len(r):  # its next sibling
            heapq.heappush(heap, (-above * r[path[-1] + 1], tie + 1, path[:-1] + (path[-1] + 1,), above))
        tie += 2
    return TreeShape.from_paths(chosen)


def plan_tree(rank_accept: Sequence[float], budget: int, c: float,
              verify_cost: VerifyCost = flat_cost) -> tuple[TreeShape, float]:
    """The tree of at most `budget` nodes with the highest predicted speed (tokens per one-token target forward),
    and that speed; the smallest tree on ties. A steep verification-cost curve makes it a short chain."""
    best, speed = TreeShape((), ()), 0.0
    for n in range(1, budget + 1):
        shape = best_tree(rank_accept, n)
        s = expected_tree_tokens(shape, rank_accept) / tree_cost(shape, c, verify_cost)
        if s > speed + 1e-12:
            best, speed = shape, s
    return best, speed


def medusa_widths(accept: Sequence[Sequence[float]], budget: int, c: float = 0.0,
                  verify_cost: VerifyCost = flat_cost, max_width: int = 4) -> tuple[tuple[int, ...], float]:
    """Medusa's tree widths (w_1, .., w_D) of at most `budget` nodes with the highest predicted speed (tokens per
    one-token target forward), and that speed; () (a plain step) where no tree beats it.

    accept[d][j]: the probability that head d's j-th choice is the target's token d + 1 places on, given the path
    above it was accepted; the same at every node of a depth, since the heads read one feature. The w_d children of
    a depth-d node catch the target's token with probability sum_{j < w_d} accept[d][j], so a round emits on
    average 1 + sum_d prod_{e <= d} sum_{j < w_e} accept[e][j] tokens, and verifies sum_d prod_{e <= d} w_e nodes
    (+ 1) in one forward, after one call of the heads (c)."""
    best: tuple[int, ...] = ()
    speed = 1.0 / verify_cost(1)

    def walk(widths: tuple[int, ...], nodes: int, level: int, reach: float, tokens: float) -> None:
        nonlocal best, speed
        if widths:
            s = tokens / (c + verify_cost(nodes + 1))
            if s > speed + 1e-12:
                best, speed = widths, s
        d = len(widths)
        if d == len(accept):
            return
        for w in range(1, min(max_width, len(accept[d])) + 1):
            if nodes + level * w > budget:
                break
            p = reach * sum(accept[d][:w])
            walk(widths + (w,), nodes + level * w, level * w, p, tokens + p)

    walk((), 0, 1, 1.0, 1.0)
    return best, speed
