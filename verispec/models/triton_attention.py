"""Attention of every query on its own over a prefix of the keys, in one launch on a GPU (Triton).

Exact greedy speculation needs a verification forward to attend each of its queries exactly as a decoding step
attends its one: the same bits whatever other queries share the forward. torch's attention does not promise that
(on an H200 its cuDNN backend did not even repeat its own bits), and attending the queries one call at a time
(`llama.one_query_attention`) made a 16-token forward cost 3.8 one-token steps there, kernel launches all.

Here one program attends one query (all the query heads that share a key head, padded to 16 rows) over its own
first n keys, in float32 (as one_query_attention), in blocks of BLOCK_N keys with an online softmax: a query's
instructions depend on its q, its n keys and the block sizes, never on how many queries the launch holds or how
long the cache is, so the step and the verification give it the same bits by construction. A decoding step is a
launch with one query.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import Tensor

log = logging.getLogger("verispec.models.triton_attention")

BLOCK_N = 64  # keys a block (fixed: a query's reduction order must not depend on anything but its keys)
ROWS = 16  # query heads a program holds, padded (tl.dot's smallest tile)


@functools.cache
def _kernel():  # compiled on first use: importing triton costs ~1 s, and CPUs never need it
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["T"])
    def prefix_attention(q, k, v, out, seen, scale,
                         sqb, sqh, sqt, skb, skh, sks, svb, svh, svs, sob, soh, sot,
                         T, REP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
        bt = tl.program_id(0)
        g = tl.program_id(1)  # the key head
        b, t = bt // T, bt % T
        n = tl.load(seen + bt)  # keys this query sees: 0 .. n-1
        rows = tl.arange(0, ROWS)
        cols = tl.arange(0, D)
        live = rows < REP
        heads = g * REP + rows
        qt = tl.load(q + b * sqb + heads[:, None] * sqh + t * sqt + cols[None, :], mask=live[:, None],
                     other=0.0).to(tl.float32)
        m = tl.full([ROWS], float("-inf"), tl.float32)
        l = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, D], tl.float32)
        for start in range(0, n, BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)
            inside = keys < n
            kt = tl.load(k + b * skb + g * skh + keys[:, None] * sks + cols[None, :], mask=inside[:, None],
                         other=0.0).to(tl.float32)
            s = tl.dot(qt, tl.trans(kt), input_precision="ieee") * scale  # [ROWS, BLOCK_N]
            s = tl.where(inside[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m - m_new)
            l = l * alpha + tl.sum(p, 1)
            vt = tl.load(v + b * svb + g * svh + keys[:, None] * svs + cols[None, :], mask=inside[:, None],
                         other=0.0).to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(p, vt, input_precision="ieee")
            m = m_new
        o = acc / l[:, None]
        tl.store(out + b * sob + heads[:, None] * soh + t * sot + cols[None, :], o.to(out.dtype.element_ty),
                 mask=live[:, None])

    return prefix_attention


@functools.cache
def available(device: str = "cuda") -> bool:
    """Whether prefix_attention runs on `device`: Triton imports, and a small launch there gives what torch's
    attention gives. A Triton that cannot build its launcher (no C compiler, say) then costs a call a query, not
    every forward's failure."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(1, 4, 2, 16, generator=gen).to(device)
        k, v = (torch.randn(1, 2, 6, 16, generator=gen).to(device) for _ in range(2))
        got = prefix_attention(q, k, v, torch.tensor([[5, 6]]))
        want = torch.cat([torch.nn.functional.scaled_dot_product_attention(
            q[:, :, i : i + 1], k[:, :, :n], v[:, :, :n], enable_gqa=True) for i, n in enumerate((5, 6))], dim=2)
        if torch.allclose(got, want, atol=1e-4, rtol=1e-4):
            return True
        reason = f"it differs from attention computed plainly by {float((got - want).abs().max()):.2e}"
    except Exception as e:  # noqa: BLE001 - any failure means: do not use it
        reason = f"{type(e).__name__}: {e}"
    log.warning("Triton's attention cannot run on %s (%s): each query is attended in a call of its own", device,
                reason)
    return False


def supports(heads: int, kv_heads: int, head_dim: int) -> bool:
    """Whether prefix_attention takes these shapes: up to ROWS query heads a key head, a head size that is a power
    of two from 16 (others attend a query a call: llama.one_query_attention)."""
    return heads % kv_heads == 0 and heads // kv_heads <= ROWS and head_dim >= 16 and head_dim & (head_dim - 1) == 0


def prefix_attention(q: Tensor, k: Tensor, v: Tensor, seen: Tensor, scale: float | None = None) -> Tensor:
    """q [B, H, T, D]; k, v [B, KV, S, D] (H a multiple of KV, last dims contiguous); seen [B, T] int: how many of the
    first keys each query sees (>= 1). Returns [B, H, T, D] in q's dtype, each query attended on its own."""
    b, h, t, d = q.shape
    kv = k.shape[1]
    rep = h // kv
    if not supports(h, kv, d):
        raise ValueError(f"prefix_attention: {h} query heads over {kv} key heads of size {d} are not supported")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("prefix_attention: the last dimension must be contiguous")
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    seen = seen.to(device=q.device, dtype=torch.int32).contiguous()
    _kernel()[(b * t, kv)](
        q, k, v, out, seen, d**-0.5 if scale is None else scale,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        t, REP=rep, D=d, BLOCK_N=BLOCK_N, ROWS=ROWS, num_warps=4, num_stages=1)
    return out
