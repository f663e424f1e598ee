"""Lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding"): the target drafts for itself by Jacobi iteration, with no draft model and no training.

Each verification forward of the target carries two branches that cannot see each other:

  * the chain (verification branch): [pending] + the n-gram from the pool that starts with `pending`, verified
    as usual. Deterministic, so q is one-hot and the chain rule keeps the target's law exactly.
  * the lookahead branch (`Proposal.extra`): a 2-D window of N-1 levels x W columns of guessed tokens. Token
    (level l, column c) sits at position c + l + 1 after `pending` (offset 0) and sees `pending`, the level-0
    tokens of columns <= c and its own column's levels <= l: a contiguous causal context of positions
    0 .. c + l + 1 (the Jacobi trajectory, never the chain). Worked example, W = 3, N = 3:

        level 1:      b0  b1  b2        b1 (position 3) sees pending, a0, a1, b1
        level 0:  a0  a1  a2            a1 (position 2) sees pending, a0, a1
        position: 1   2   3   4

    One forward is one Jacobi step: the target's argmax at the last level's tokens (positions c + N - 1)
    guesses positions c + N, and becomes the new last level while the oldest level is dropped. Each column
    then yields an N-gram (level 0, .., level N-2, new guess) of consecutive positions, which goes into the
    pool: first token -> its N-1 following tokens, most recent first, at most G per first token.

The window's tokens only ever sit in scratch cache slots and in the lookahead branch, which the chain cannot
attend to, so they change which tokens are proposed (speed), never what is emitted (the law): only tokens
verified against p are output.

Simplifications (they affect acceptance only):
  * One candidate per round: the most recent n-gram for `pending` is the chain (at most gamma tokens, and
    at most N-1). Verifying the G candidates at once as a tree is a later issue.
  * All levels start as random tokens of the prompt; a column's n-grams are harvested only once its levels
    >= 1 are Jacobi outputs (after N-2 steps).
  * Alignment: a step in which k tokens are emitted moves `pending` k positions on, while one Jacobi step
    shifts the window by one. So the first k-1 columns (now at or before `pending`) are dropped and k-1 new
    random columns appended at the right; every remaining token keeps its absolute position.
  * The window advances by argmax even when sampling (greedy Jacobi); the chain is still verified by the
    stochastic rule, which is what keeps sampling lossless.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from verispec.proposers.base import Proposal, SequenceProposer
from verispec.sampling import SamplingParams, argmax


def window_layout(levels: list[list[int]], chain_len: int) -> tuple[Tensor, Tensor, Tensor]:
    """The lookahead branch of one forward over [pending] + chain (chain_len tokens) + window.

    levels: N-1 lists of W token ids, oldest level first. Window tokens are laid out level-major: extra index
    e = l * W + c. Returns extra [E] ids, extra_positions [E] offsets from `pending`, extra_mask
    [E, 1 + chain_len + E] bool (see the module docstring for who sees whom).
    """
    n_levels, width = len(levels), len(levels[0])
    e = n_levels * width
    tokens = torch.tensor([t for level in levels for t in level], dtype=torch.long)  # [E]
    lvl = torch.arange(n_levels).repeat_interleave(width)  # [E] level of each window token
    col = torch.arange(width).repeat(n_levels)  # [E] column of each window token
    positions = col + lvl + 1  # [E]
    # Row (l, c) sees key (l', c') iff (l' == 0 and c' <= c) or (c' == c and l' <= l).
    level0_before = (lvl[None, :] == 0) & (col[None, :] <= col[:, None])
    own_column = (col[None, :] == col[:, None]) & (lvl[None, :] <= lvl[:, None])
    mask = torch.zeros(e, 1 + chain_len + e, dtype=torch.bool)
    mask[:, 0] = True  # everyone sees pending; nobody sees the chain
    mask[:, 1 + chain_len :] = level0_before | own_column
    return tokens, positions, mask


class LookaheadProposer(SequenceProposer):
    """Jacobi window (W columns x N-1 levels) + n-gram pool (at most G continuations per first token).

    Defaults W=5, N=3, G=5 are the paper's GPU settings (W=15, N=5 for 7B) scaled to a CPU, where extra tokens
    are not free: for Qwen2.5-Coder-1.5B in bf16 a 13-token forward (W=5, N=3) costs ~1.0-1.15x a 1-token one,
    a 19-token one (W=8) ~1.35x, for only ~6% more tokens per forward over three code prompts; N=4 or 5 gave
    fewer (a longer n-gram is wrong more often, and only one candidate is tried). G matters little while one
    candidate is verified per round; it bounds the pool for the coming tree verification.
    """

    def __init__(self, window: int = 5, ngram: int = 3, max_candidates: int = 5, seed: int = 0) -> None:
        if window < 1 or ngram < 2 or max_candidates < 1:
            raise ValueError(
                f"lookahead needs window >= 1, ngram >= 2 and candidates >= 1, got {window}, {ngram}, {max_candidates}"
            )
        super().__init__()
        self.width, self.ngram, self.max_candidates, self.seed = window, ngram, max_candidates, seed
        self.levels: list[list[int]] = []  # [N-1][W], oldest level first
        self.age: list[int] = []  # [W] Jacobi steps each column has been through since it was filled
        self.pool: dict[int, list[tuple[int, ...]]] = {}  # first token -> continuations, most recent first
        self.seq: list[int] = []  # the whole sequence so far; seq[-1] is the pending token
        self.sent_window = False
        self.rng = random.Random(seed)

    @property
    def n_levels(self) -> int:
        return self.ngram - 1

    def reset(self, prompt: list[int]) -> None:
        self.seq = list(prompt)
        self.pool = {}
        self.rng = random.Random(self.seed)
        self.levels = [[self._filler() for _ in range(self.width)] for _ in range(self.n_levels)]
        self.age = [0] * self.width
        self.sent_window = False

    def _filler(self) -> int:
        return self.rng.choice(self.seq)

    def propose(self, gamma: int, sampling: SamplingParams, generator: torch.Generator) -> Proposal:
        candidates = self.pool.get(self.seq[-1], [])
        chain = list(candidates[0][:gamma]) if candidates else []
        tokens = torch.tensor(chain, dtype=torch.long)  # [g], g <= min(gamma, N - 1)
        self.sent_window = True  # the round leaves the window out where the cache has no room: no extra_logits
        extra, positions, mask = window_layout(self.levels, len(chain))
        return Proposal(tokens=tokens, extra=extra, extra_positions=positions, extra_mask=mask)

    def observe(self, num_accepted: int, emitted: list[int], extra_logits: Tensor | None = None) -> None:
        stepped = extra_logits is not None and self.sent_window
        if stepped:
            guesses = argmax(extra_logits).view(self.n_levels, self.width)[-1].tolist()  # [W]
            self._harvest(guesses)
            self.levels = self.levels[1:] + [guesses]
            self.age = [a + 1 for a in self.age]
        self.seq.extend(emitted)
        # pending moved len(emitted) positions; a Jacobi step already moved the window by one of them.
        self._realign(len(emitted) - int(stepped))
        self.sent_window = False

    def _harvest(self, guesses: list[int]) -> None:
        """Add each mature column's N-gram (its levels, oldest first, then the new guess) to the pool."""
        for c, guess in enumerate(guesses):
            if self.age[c] >= self.ngram - 2:
                gram = [level[c] for level in self.levels] + [guess]
                self._add(gram[0], tuple(gram[1:]))

    def _add(self, first: int, continuation: tuple[int, ...]) -> None:
        kept = self.pool.setdefault(first, [])
        if continuation in kept:
            kept.remove(continuation)
        kept.insert(0, continuation)
        del kept[self.max_candidates :]

    def _realign(self, shift: int) -> None:
        """Drop the first `shift` columns (they now lie at or before pending) and append fresh random ones."""
        shift = min(shift, self.width)
        if shift <= 0:
            return
        self.levels = [level[shift:] + [self._filler() for _ in range(shift)] for level in self.levels]
        self.age = self.age[shift:] + [0] * shift
