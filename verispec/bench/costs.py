"""What a target forward costs: the verification-cost curve and the memory-bandwidth limit of a decoding step.

Speculation pays only while verifying k tokens costs about what one token costs (the step is memory-bound:
every weight is read once whatever k is). The curve says where that stops, so gamma is not chosen beyond the
flat part; the bandwidth limit says how far plain decoding is from what the hardware allows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from verispec.bench.stats import median
from verispec.models.base import weight_bytes_per_token


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one call of fn, the device synchronised on both sides."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _context_cache(model, context: int, room: int, gen: torch.Generator):
    """A cache holding `context` random tokens, with room for `room` more: what a step or a verification reads."""
    cache = model.new_cache(context + room + 1)
    model.forward(torch.randint(model.vocab_size, (1, context), generator=gen).to(model.device), cache, last_n=1)
    cache.commit(context)
    return cache


def decoding_step(model, *, context: int = 512, seed: int = 0) -> Callable[[], None]:
    """One plain decoding step of `model` over a `context`-token cache, to be called again and again (it commits
    nothing, so every call is the same step)."""
    gen = torch.Generator().manual_seed(seed)
    cache = _context_cache(model, context, 1, gen)
    x = torch.randint(model.vocab_size, (1, 1), generator=gen).to(model.device)

    def step() -> None:
        model.forward(x, cache)

    step()  # warm-up
    return step


def verification_curve(model, *, context: int = 512, sizes: Sequence[int] = (1, 2, 4, 8, 16), reps: int = 5,
                       seed: int = 0) -> list[dict[str, Any]]:
    """Median seconds of one target forward over k new tokens on top of a `context`-token cache.

    The sizes take turns (1, 2, 4, ..., then 1, 2, 4, ... again), so a machine whose memory speeds up or slows down
    within the measurement moves every size alike. Timed one size after another on a 2-core VM whose read bandwidth
    read 30 and 56 GB/s within one hour, 8 and 16 tokens were priced at 2.19x and 4.02x a step; interleaved, in the
    same hour, at 1.46x and 2.72x (benchmarks/results/2026-12-05-epyc-avx512-suite-half-t07)."""
    gen = torch.Generator().manual_seed(seed)
    cache = _context_cache(model, context, max(sizes), gen)
    xs = [torch.randint(model.vocab_size, (1, k), generator=gen).to(model.device) for k in sizes]
    for x in xs:  # warm-up at each size; a forward commits nothing, so the cache stays at `context`
        model.forward(x, cache)
    times: list[list[float]] = [[] for _ in sizes]
    for _ in range(reps):
        for x, ts in zip(xs, times):
            ts.append(_timed(partial(model.forward, x, cache), model.device))
    out = [{"tokens": k, "ms": 1000 * median(ts)} for k, ts in zip(sizes, times)]
    base = out[0]["ms"]
    for row in out:
        row["relative_to_1"] = row["ms"] / base
        row["ms"] = round(row["ms"], 2)
        row["relative_to_1"] = round(row["relative_to_1"], 3)
    return out


def _buffer(size_mb: int, device: torch.device) -> torch.Tensor:
    """A float32 buffer of size_mb MiB whose pages are touched, to time reads of."""
    x = torch.ones(size_mb * 2**20 // 4, dtype=torch.float32, device=device)
    x.sum()
    return x


def read_bandwidth(size_mb: int = 512, reps: int = 5, device: torch.device | str = "cpu") -> float:
    """Bytes per second of reading a large buffer once (a sum over it), the best of `reps`."""
    device = torch.device(device)
    x = _buffer(size_mb, device)
    best = min(_timed(x.sum, device) for _ in range(reps))
    return x.numel() * x.element_size() / best


def bandwidth_limit(model, step_ms: float | None = None, *, step: Callable[[], None] | None = None,
                    reps: int = 5, size_mb: int | None = None) -> dict[str, Any]:
    """The fastest a decoding step could be if it only streamed the weights once at measured bandwidth.

    With `step` (decoding_step's), a step and a read of the buffer are timed in turn, `reps` times: the bandwidth is
    the median of those reads, the step the median of those steps, and step_over_limit the median of each pair's
    ratio, so that both sides of the ratio come from the same moments. On a 2-core VM whose reads gave 51.5 and
    33.2 GB/s a minute apart while its step stayed at 37-40 ms, a step and a bandwidth taken apart gave 1.91x and
    1.30x (benchmarks/results/2026-12-05-epyc-long-lookup). Without it, the best of `reps` reads beside `step_ms`."""
    nbytes = weight_bytes_per_token(model)
    device = getattr(model, "device", torch.device("cpu"))
    size_mb = size_mb or (2048 if device.type == "cuda" else 512)
    if step is None:
        bw = read_bandwidth(size_mb=size_mb, reps=reps, device=device)
        ratio = None if step_ms is None else step_ms / (1000 * nbytes / bw)
    else:
        x = _buffer(size_mb, device)
        steps, reads = [], []
        for _ in range(reps):
            steps.append(_timed(step, device))
            reads.append(_timed(x.sum, device))
        bw = x.numel() * x.element_size() / median(reads)
        step_ms = 1000 * median(steps)
        ratio = median([st * x.numel() * x.element_size() / (rd * nbytes) for st, rd in zip(steps, reads)])
    limit_ms = 1000 * nbytes / bw
    out = {"weight_bytes": nbytes, "read_bandwidth_gb_s": round(bw / 1e9, 2), "limit_ms_per_token": round(limit_ms, 2),
           "limit_tokens_per_s": round(1000 / limit_ms, 2)}
    if ratio is not None:  # a step was given or timed
        out["measured_step_ms"] = round(step_ms, 2)
        out["step_over_limit"] = round(ratio, 2)
    return out
