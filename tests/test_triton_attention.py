"""The GPU's fused attention (verispec.models.triton_attention), run by Triton's interpreter on the CPU: each
query's output is a function of its own keys alone -- the same bits in a launch of one query as beside others --
and close to attention computed plainly. Skips where Triton is not installed (CPU-only torch builds)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import triton_on_cpu
from verispec.models import llama, triton_attention


@pytest.fixture(autouse=True)
def interpreted():
    triton_on_cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv", [(12, 2), (4, 1), (8, 8)])
def test_each_query_gets_its_own_bits_and_the_plain_result(dtype, heads, kv):
    gen = torch.Generator().manual_seed(heads + kv)
    b, t, d, s = 2, 5, 64, 140  # 140 keys: three blocks of 64, the last one partial
    q = torch.randn(b, t, heads, d, generator=gen).to(dtype).transpose(1, 2)  # strided, as the model's
    k, v = (torch.randn(b, kv, s + 9, d, generator=gen).to(dtype)[:, :, :s] for _ in range(2))
    seen = torch.tensor([[s - t + 1 + i for i in range(t)], [3 + 30 * i for i in range(t)]])
    out = triton_attention.prefix_attention(q, k, v, seen, 0.2)
    alone = torch.stack([torch.cat([
        triton_attention.prefix_attention(q[r : r + 1, :, i : i + 1], k[r : r + 1], v[r : r + 1],
                                          seen[r : r + 1, i : i + 1], 0.2) for i in range(t)], dim=2)[0]
        for r in range(b)])
    assert torch.equal(out, alone)
    ref = torch.stack([torch.cat([
        llama.one_query_attention(q[r : r + 1, :, i : i + 1], k[r : r + 1, :, : int(seen[r, i])],
                                  v[r : r + 1, :, : int(seen[r, i])], scale=0.2) for i in range(t)], dim=2)[0]
        for r in range(b)])
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output's own rounding
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)


def test_shapes_it_cannot_take_are_refused_and_attended_a_query_a_call():
    q = torch.randn(1, 32, 1, 64)  # 32 query heads over one key head: more than a program's 16 rows
    k = v = torch.randn(1, 1, 10, 64)
    with pytest.raises(ValueError, match="not supported"):
        triton_attention.prefix_attention(q, k, v, torch.tensor([[10]]))
    assert not triton_attention.supports(4, 2, 8) and triton_attention.supports(12, 2, 128)
    # the GPU's choice for heads of 8 (the tiny test models'): one call a query, not a refusal
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 3, 8, generator=gen)
    k, v = (torch.randn(1, 2, 9, 8, generator=gen) for _ in range(2))
    attend = llama.attention(torch.ones(3, 9, dtype=torch.bool).tril(6), 1, torch.float32, torch.device("cuda"))
    expect = torch.cat([llama.one_query_attention(q[:, :, i : i + 1], k[:, :, : 7 + i], v[:, :, : 7 + i])
                        for i in range(3)], dim=2)
    assert torch.equal(attend(q, k, v), expect)


def test_available_runs_a_launch_and_says_no_where_it_fails(monkeypatch, caplog):
    """available() launches a small problem on the device and compares it with attention computed plainly; a Triton
    that cannot launch (or computes wrong) makes it False with a warning, so forwards attend a query a call."""
    triton_attention.available.cache_clear()
    try:
        assert triton_attention.available("cpu")  # the interpreter, on CPU tensors
        triton_attention.available.cache_clear()

        def broken(*args, **kwargs):
            raise RuntimeError("no C compiler for the launcher")

        monkeypatch.setattr(triton_attention, "prefix_attention", broken)
        with caplog.at_level("WARNING"):
            assert not triton_attention.available("cpu")
        assert "no C compiler" in caplog.text
    finally:
        triton_attention.available.cache_clear()
