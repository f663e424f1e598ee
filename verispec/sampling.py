"""Logits -> probabilities, applied identically to target (p) and proposer (q).

Losslessness holds with respect to the *processed* target distribution, so the same temperature, top-k and
top-p must be applied to both sides; this module is the single place where that happens.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import Tensor


# A row's context-dependent logit changes (penalties, a grammar mask): shaper(logits [V], path) gives the logits
# of the position after the row's committed output followed by `path` (tokens proposed before it this round).
# The round applies it to the target at every verified position and hands it to the proposer for its drafts.
Shaper = Callable[[Tensor, list[int]], Tensor]

# Why a draw refuses a row of weights (sample, and verify's compiled chain, which draws the same way).
NO_LAW = "sampling weights must be non-negative and sum to a positive finite number"
# The smallest normal float32: below it the temperature itself would round to 0 (or a subnormal) in float32.
MIN_TEMPERATURE = 1.1754943508222875e-38


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (exact argmax); top_k 0 and top_p 1.0 mean "off".

    Every finite value the checks below accept is safe: logits are shifted by their maximum before the
    temperature divides them (so no temperature overflows the softmax into NaN), a temperature too small for
    float32 (below MIN_TEMPERATURE) is greedy, its limit, and top_p always keeps the most likely token.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE


def argmax(logits: Tensor) -> Tensor:
    """[..., V] -> [...] greedy token ids: torch.argmax's (first index on ties; a NaN, the first one, wins).

    A verification takes the argmax of every position's logits, a draft step of its own. torch's CPU argmax walks
    a row element by element (0.13 ms over 151,936 logits, 0.50 ms over 7 rows on 2 cores), while its max reduction
    is vectorized (0.03 ms for the 7 rows). So a long row is cut into blocks: the first block holding the row's
    maximum (an argmax over the blocks' maxima), then the first index of it within that block: the same index.
    Over bfloat16 a float32 copy first (torch's bfloat16 argmax took ~4x as long); the result is the same."""
    x = logits.float()
    vocab = x.shape[-1]
    block = draw_block(vocab)
    if block == 0 or x.numel() == 0 or x.device.type != "cpu":  # a GPU's argmax is one fast kernel: one launch
        return x.argmax(-1)
    blocks = x.reshape(-1, vocab // block, block)
    first = blocks.amax(-1).argmax(-1)  # the first block whose maximum is the row's (NaN: the first NaN's block)
    within = blocks[torch.arange(blocks.shape[0], device=x.device), first].argmax(-1)
    return (first * block + within).reshape(x.shape[:-1])


@functools.cache
def draw_block(vocab: int) -> int:
    """argmax's and sample's block: a divisor of vocab in [256, 4096] near the square root (151,936 = 128 x 1187),
    or 0 where there is none or the row is short (then one pass over the row is as fast)."""
    if vocab < 8192:
        return 0
    return next((b for b in range(max(256, math.isqrt(vocab)), 4097) if vocab % b == 0), 0)


def logits_to_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """[..., V] logits -> [..., V] float32 probabilities after temperature, top-k, top-p.

    Greedy gives the one-hot of the argmax (first index on ties, like torch.argmax), which makes the
    stochastic verifier reduce exactly to the greedy rules.
    """
    logits = logits.float()
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, argmax(logits)[..., None], 1.0)
    kernel = compiled_for(logits)
    if kernel is not None and not 0 < params.top_k < logits.shape[-1]:  # the same steps in one call (sample.cpp)
        probs = kernel.softmax_t(logits.reshape(-1, logits.shape[-1]).contiguous(), params.temperature)
        probs = probs.reshape(logits.shape)
    else:
        x = logits - logits.amax(dim=-1, keepdim=True)  # a new tensor, so the rest works in place (amax: vectorized)
        x.div_(params.temperature)  # the maximum becomes 0
        if 0 < params.top_k < x.shape[-1]:
            kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
            x.masked_fill_(x < kth, -math.inf)
        probs = torch.softmax(x, dim=-1)
    return probs if params.top_p >= 1.0 else top_p_filter(probs, params.top_p)


def compiled_for(x: Tensor) -> ModuleType | None:
    """The compiled sampling kernels (verispec.models.kernels.sampling_kernel) for a CPU float32 tensor, else None."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.numel() == 0:
        return None
    from verispec.models.kernels import sampling_kernel

    return sampling_kernel()


TOP_P_BLOCK = 256  # most likely ids sorted first; a top-p cut almost always falls among them


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely ids whose mass reaches top_p (the top id always stays), renormalized.

    Sorting a 152k vocabulary took ~10 ms a row on a CPU, a fifth of a decoding step; the cut nearly always falls
    within the few most likely ids, so they are taken with topk, and a larger block (up to the whole vocabulary)
    only where the first leaves some row's cut undecided: the same set as a full sort, ties aside (tied ids have
    equal masses, so which of them the cut keeps is the only freedom, and it is deterministic)."""
    top_p = max(top_p, torch.finfo(probs.dtype).tiny)  # below the smallest normal it rounds to 0: keep the top id
    vocab, k = probs.shape[-1], min(TOP_P_BLOCK, probs.shape[-1])
    while True:
        top, ids = torch.topk(probs, k, dim=-1)  # descending
        mass_before = top.cumsum(-1) - top
        # every row's cut falls inside the block once the block's mass reaches top_p (the next id is then out)
        if k == vocab or bool((mass_before[..., -1] + top[..., -1] >= top_p).all()):
            break
        k = min(vocab, 16 * k)
    kept = torch.zeros_like(probs).scatter_(-1, ids, top.masked_fill_(mass_before >= top_p, 0.0))
    return kept.div_(kept.sum(-1, keepdim=True))


def sample(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """[..., V] non-negative weights (not necessarily normalized) -> [...] ids, each drawn with probability
    weight / sum of its row: torch.multinomial's law, drawn as the inverse of a float64 cumulative sum at one
    uniform per row. torch.multinomial took ~3 ms a draw over a 152k vocabulary on a CPU (a decoding step is
    ~30 ms, and a sampled round draws once per draft token). The cumulative sum is taken in two levels: the
    blocks' sums, then within the one block the uniform falls in; on a CPU in one compiled call (sample.cpp, the
    same draw: torch's ~20 calls cost ~0.4 ms a draw after a forward has evicted the caches)."""
    flat = probs.reshape(-1, probs.shape[-1])
    rows, vocab = flat.shape
    block = (draw_block(vocab) if flat.device.type == "cpu" else 0) or vocab
    u = torch.rand(rows, dtype=torch.float64, generator=generator, device=flat.device)
    kernel = compiled_for(flat)
    ids = kernel.sample_rows(flat.contiguous(), u, block) if kernel is not None else _inverse_cdf(flat, u, block)
    if bool((ids < 0).any()):
        raise ValueError(NO_LAW)
    return ids.reshape(probs.shape[:-1])


def _inverse_cdf(flat: Tensor, u: Tensor, block: int) -> Tensor:
    """sample()'s draw in torch: weights [rows, V], uniforms [rows] -> ids [rows] (-1 for a row without a law)."""
    rows, vocab = flat.shape
    parts = flat.reshape(rows, vocab // block, block)
    cdf = parts.sum(-1, dtype=torch.float64).cumsum(-1)  # [rows, blocks]: the mass up to each block's end
    total = cdf[:, -1:]
    bad = ~(torch.isfinite(total) & (total > 0))[:, 0] | (flat.amin(-1) < 0)
    cdf = torch.where(bad[:, None], 1.0, cdf)  # a row without a law draws anything, then -1
    total = cdf[:, -1:]
    t = u[:, None] * total
    # the first block whose end passes t; t < total, unless the product rounded up to it: then the last block
    # with weight (the first whose end is total)
    b = torch.minimum(torch.searchsorted(cdf, t, right=True), torch.searchsorted(cdf, total))  # [rows, 1]
    before = torch.where(b > 0, cdf.gather(-1, (b - 1).clamp_min(0)), 0.0)  # <= t
    within = parts[torch.arange(rows, device=flat.device), b[:, 0]].cumsum(-1, dtype=torch.float64) + before
    # the first id whose sum passes t: its weight is > 0 (a zero weight leaves the sum at or below t); rounding
    # aside it is in this block, else the block's last id with weight
    last = torch.searchsorted(within, within[:, -1:].contiguous())
    i = torch.minimum(torch.searchsorted(within, t, right=True), last)
    return torch.where(bad, -1, (b * block + i)[:, 0])


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """One generator per request, so a seeded run is reproducible whatever runs beside it. The seed is mixed
    first: torch's Mersenne Twister seeded with nearby integers (choice i of a request gets seed + i) starts with
    correlated draws (the first float64 uniform of seeds 22000000 + i, i < 1000, fails a KS test at p = 1e-4)."""
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(mix_seed(seed))
    return g


def mix_seed(seed: int) -> int:
    """splitmix64's finalizer: distinct seeds -> well-spread 63-bit generator seeds."""
    z = (seed + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) >> 1


@dataclass(frozen=True)
class Penalties:
    """Logit changes that depend on the context: OpenAI's frequency and presence penalties and logit_bias, and
    the repetition penalty (vLLM's and transformers' convention). They change the target's law, so under
    speculation they are applied at every position of the verification forward with the context that position
    would have had (`penalize`): the output is then distributed exactly as the penalized target decoding alone.

    repetition: > 0, 1 = off; a token seen in the prompt or the output has its logit divided by it where
        positive and multiplied where negative.
    frequency, presence: subtracted per occurrence of a token in the output / once if it occurs there.
    logit_bias: (token id, bias) pairs added to those logits (OpenAI's -100 .. 100; -100 in effect bans one).
    """

    repetition: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if not math.isfinite(self.repetition) or self.repetition <= 0:
            raise ValueError(f"repetition penalty must be a finite number > 0, got {self.repetition}")
        for name in ("frequency", "presence"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} penalty must be finite, got {getattr(self, name)}")
        for token, bias in self.logit_bias:
            if token < 0 or not math.isfinite(bias):
                raise ValueError(f"logit bias {token}: {bias} needs a token id >= 0 and a finite bias")

    @property
    def neutral(self) -> bool:
        return self.repetition == 1.0 and self.frequency == 0.0 and self.presence == 0.0 and not self.logit_bias


def penalize(logits: Tensor, prompt: list[int], output: list[int], paths: list[list[int]],
             penalties: Penalties) -> Tensor:
    """Apply `penalties` to logits [T, V] of one forward, row t with the output so far followed by paths[t] (the
    proposal's tokens before that position: [] for the first row, the drafts before it in a chain, a node's
    ancestors and itself in a tree). Returns float32 [T, V]; plain decoding is T = 1 with paths [[]].

    Worked example, output [7], chain drafts (5, 7): rows see outputs [7], [7, 5] and [7, 5, 7], so with
    frequency 0.5 token 7's logit drops by 0.5, 0.5 and 1.0, token 5's by 0, 0.5 and 0.5.
    """
    x = logits.float().clone()
    rows, vocab = x.shape
    assert len(paths) == rows, (len(paths), rows)
    if penalties.logit_bias:
        ids = torch.tensor([t for t, _ in penalties.logit_bias], dtype=torch.long)
        if int(ids.max()) >= vocab:
            raise ValueError(f"logit_bias names token {int(ids.max())}, outside the vocabulary [0, {vocab})")
        x[:, ids] += torch.tensor([b for _, b in penalties.logit_bias], dtype=x.dtype, device=x.device)
    if penalties.repetition == 1.0 and penalties.frequency == 0.0 and penalties.presence == 0.0:
        return x
    counts = torch.zeros(rows, vocab, device=x.device)
    if output:
        counts += torch.bincount(torch.tensor(output), minlength=vocab).to(counts)[:vocab]
    for t, path in enumerate(paths):
        if path:
            counts[t].index_add_(0, torch.tensor(path, device=x.device), torch.ones(len(path), device=x.device))
    if penalties.repetition != 1.0:
        seen = counts > 0
        if prompt:
            seen[:, torch.tensor(sorted(set(prompt)), device=x.device)] = True
        r = penalties.repetition
        x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    if penalties.frequency:
        x -= penalties.frequency * counts
    if penalties.presence:
        x -= penalties.presence * (counts > 0).to(x.dtype)
    return x


def draft_paths(draft: list[int], parents: list[int] | None) -> list[list[int]]:
    """The proposal's tokens before each row of a verification forward over [pending] + draft: penalize's paths.
    A chain's row t sees draft[:t]; a tree's row i + 1 sees node i's ancestors, root first, and node i."""
    if parents is None:
        return [draft[:t] for t in range(len(draft) + 1)]
    paths: list[list[int]] = [[]]
    for i, parent in enumerate(parents):
        paths.append(paths[parent + 1] + [draft[i]])
    return paths


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log-probability under the target's distribution, with the `top` most likely tokens
    there: from the target's logits as the model computed them, before temperature, top-k/top-p and penalties
    (vLLM's default), so they do not depend on the sampling settings or the proposer."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """logits [n, V], row j the target's at the position that emitted tokens[j] -> their TokenLogprobs."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(-1, torch.tensor(tokens, device=lp.device)[:, None])[:, 0].tolist()
    if top <= 0:
        return [TokenLogprob(t, c) for t, c in zip(tokens, chosen)]
    values, ids = lp.topk(top, dim=-1)
    return [TokenLogprob(t, c, tuple(zip(i, v))) for t, c, i, v in zip(tokens, chosen, ids.tolist(), values.tolist())]
