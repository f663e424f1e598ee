"""The speed model of speculative decoding (Leviathan et al. 2023, section 3), for choosing gamma.

With i.i.d. acceptance rate alpha, a round that drafts gamma tokens emits on average
    E[tokens] = (1 - alpha^(gamma+1)) / (1 - alpha)        (= gamma + 1 when alpha = 1)
and costs gamma draft forwards plus one target forward, i.e. (gamma * c + 1) target-forward units, where
c = draft cost / target cost. The speedup over plain decoding is E[tokens] / (gamma * c + 1). This assumes a
verification forward costs the same as a one-token forward (true while it is memory-bound).
"""

from __future__ import annotations


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


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    _check(alpha, gamma, c)
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 16) -> int:
    """The gamma in 1..max_gamma with the highest predicted speedup (the smallest on ties)."""
    return max(range(1, max_gamma + 1), key=lambda g: (predicted_speedup(alpha, g, c), -g))


def table(alphas: list[float], gammas: list[int], c: float) -> str:
    """Markdown: expected tokens and predicted speedup for each alpha x gamma, with the optimal gamma."""
    head = "| α | " + " | ".join(f"γ={g}" for g in gammas) + " | optimal γ |"
    rows = [head, "|" + "---|" * (len(gammas) + 2)]
    for a in alphas:
        cells = [f"{expected_tokens(a, g):.2f} tok, {predicted_speedup(a, g, c):.2f}×" for g in gammas]
        rows.append(f"| {a} | " + " | ".join(cells) + f" | {optimal_gamma(a, c)} |")
    return "\n".join(rows)
