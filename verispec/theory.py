"""The speed model of speculative decoding (Leviathan et al. 2023, section 3), for choosing gamma.

With i.i.d. acceptance rate alpha, a round that drafts gamma tokens emits on average
    E[tokens] = (1 - alpha^(gamma+1)) / (1 - alpha)        (= gamma + 1 when alpha = 1)
and costs gamma draft forwards plus one target forward, i.e. (gamma * c + 1) target-forward units, where
c = draft cost / target cost. The speedup over plain decoding is E[tokens] / (gamma * c + 1). This assumes a
verification forward costs the same as a one-token forward (true while it is memory-bound); where it does not,
`verify_cost(k)` (a target forward over k tokens in one-token units, from a measured curve) replaces the 1.

alpha here is the per-token acceptance probability. Measured, it is accepted / (accepted + rejections)
(metrics.alpha_iid), not accepted / drafted: drafts after a rejection are never tested.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
