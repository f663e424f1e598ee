"""The few statistics a bench report needs, and the order runs are made in."""

from __future__ import annotations

import math
from collections.abc import Sequence


def geomean(xs: Sequence[float]) -> float | None:
    """Geometric mean: the right average for speed ratios (a 2x and a 0.5x average to 1x)."""
    if not xs:
        return None
    if any(x <= 0 for x in xs):
        raise ValueError("geometric mean of non-positive values")
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def percentile(xs: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default): percentile([1, 2, 3, 4], 50) == 2.5."""
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(xs: Sequence[float]) -> float | None:
    return percentile(xs, 50)


def mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def schedule(n_prompts: int, n_configs: int, repeats: int) -> list[tuple[int, int, int]]:
    """(prompt, repeat, config) in the order to run them: every configuration runs on a prompt back to back
    (A B C, A B C, ...), so drift of the machine's speed hits all alike; the starting configuration rotates
    from one block to the next so that none always runs first (e.g. right after a long peer run).

    schedule(2, 3, 1) -> [(0,0,0), (0,0,1), (0,0,2), (1,0,1), (1,0,2), (1,0,0)]
    """
    order = []
    block = 0
    for rep in range(repeats):
        for p in range(n_prompts):
            for i in range(n_configs):
                order.append((p, rep, (block + i) % n_configs))
            block += 1
    return order
