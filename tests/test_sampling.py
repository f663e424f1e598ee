"""logits -> probabilities: temperature, top-k, top-p, greedy, and parameter validation (known values)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from verispec.sampling import SamplingParams, argmax, logits_to_probs, make_generator, sample


def probs_of(logits, **kw) -> np.ndarray:
    return logits_to_probs(torch.tensor(logits, dtype=torch.float32), SamplingParams(**kw)).double().numpy()


def log(ps) -> list[float]:
    return [math.log(x) if x > 0 else -math.inf for x in ps]


def close(a, b, atol=1e-6) -> None:
    np.testing.assert_allclose(a, b, atol=atol, rtol=0)


# ---- temperature ------------------------------------------------------------------------------------------------
def test_temperature_one_is_softmax():
    close(probs_of(log([1, 2, 4]), temperature=1.0), [1 / 7, 2 / 7, 4 / 7])


def test_temperature_scales_logits():
    # T = 0.5 squares the odds, T = 2 takes their square root.
    close(probs_of(log([1, 2, 4]), temperature=0.5), [1 / 21, 4 / 21, 16 / 21])
    s = 1 + math.sqrt(2) + 2
    close(probs_of(log([1, 2, 4]), temperature=2.0), [1 / s, math.sqrt(2) / s, 2 / s])


def test_output_is_float32_probabilities_any_input_dtype_and_shape():
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    for dtype in (torch.float64, torch.bfloat16, torch.float16):
        out = logits_to_probs(logits.to(dtype), SamplingParams(temperature=0.8, top_k=3, top_p=0.9))
        assert out.dtype == torch.float32 and out.shape == (2, 3, 5)
        close(out.sum(-1).double().numpy(), np.ones((2, 3)), atol=1e-5)
        assert torch.all(out >= 0)


def test_minus_inf_logits_get_zero_probability():
    """A draft whose vocabulary is padded with -inf logits (DraftModelProposer) must give finite probabilities."""
    out = probs_of([0.0, -math.inf, math.log(3), -math.inf], temperature=0.7, top_p=0.95)
    assert np.all(np.isfinite(out))
    assert out[1] == 0 and out[3] == 0
    g = logits_to_probs(torch.tensor([-math.inf, 1.0, -math.inf]), SamplingParams(temperature=0.0))
    assert g.tolist() == [0.0, 1.0, 0.0]


# ---- top-k --------------------------------------------------------------------------------------------------------
def test_top_k_keeps_the_k_largest():
    close(probs_of(log([0.1, 0.2, 0.3, 0.4]), temperature=1.0, top_k=2), [0, 0, 3 / 7, 4 / 7])
    close(probs_of(log([0.1, 0.2, 0.3, 0.4]), temperature=1.0, top_k=1), [0, 0, 0, 1])


def test_top_k_keeps_all_ties_at_the_kth_value():
    # Like Hugging Face's TopKLogitsWarper (mask logits < the k-th largest): tied tokens are all kept.
    close(probs_of([1.0, 3.0, 3.0, 2.0], temperature=1.0, top_k=1), [0, 0.5, 0.5, 0])
    e = math.exp
    close(probs_of([1.0, 3.0, 2.0, 2.0], temperature=1.0, top_k=2),
          [0, e(3) / (e(3) + 2 * e(2)), e(2) / (e(3) + 2 * e(2)), e(2) / (e(3) + 2 * e(2))])


@pytest.mark.parametrize("k", [0, 4, 10])
def test_top_k_off(k):
    close(probs_of(log([0.1, 0.2, 0.3, 0.4]), temperature=1.0, top_k=k), [0.1, 0.2, 0.3, 0.4])


def test_top_k_applies_after_temperature_on_logits():
    # Rank is temperature invariant; the kept tokens are renormalised at the given temperature.
    close(probs_of(log([0.1, 0.2, 0.3, 0.4]), temperature=0.5, top_k=2), [0, 0, 9 / 25, 16 / 25])


# ---- top-p --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "top_p,expected",
    [
        (0.45, [1, 0, 0, 0]),  # the top token alone (0.5) already reaches 0.45
        (0.7, [5 / 8, 3 / 8, 0, 0]),  # 0.5 < 0.7 <= 0.8: the two largest
        (0.79, [5 / 8, 3 / 8, 0, 0]),
        (0.81, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0]),  # needs the third
        (0.96, [0.5, 0.3, 0.15, 0.05]),  # needs all four
        (1.0, [0.5, 0.3, 0.15, 0.05]),  # off
    ],
)
def test_top_p_keeps_the_minimal_set_reaching_top_p(top_p, expected):
    # Unsorted input, to check the scatter back to vocabulary order.
    perm = [2, 0, 3, 1]
    ps = [0.5, 0.3, 0.15, 0.05]
    out = probs_of(log([ps[i] for i in perm]), temperature=1.0, top_p=top_p)
    close(out, [expected[i] for i in perm])


def test_top_p_stops_as_soon_as_the_mass_is_reached_exactly():
    # Four equal logits: each token has exactly 0.25 (exact in float32). Two tokens reach 0.5 exactly, so top-p 0.5
    # keeps exactly two (which two among ties is unspecified); a third would not be minimal.
    out = probs_of([0.0, 0.0, 0.0, 0.0], temperature=1.0, top_p=0.5)
    assert sorted(out.tolist()) == [0.0, 0.0, 0.5, 0.5]
    out = probs_of([0.0, 0.0, 0.0, 0.0], temperature=1.0, top_p=0.75)
    close(sorted(out), [0, 1 / 3, 1 / 3, 1 / 3])


@pytest.mark.parametrize("top_p", [1e-6, 0.01, 0.2])
def test_top_p_always_keeps_the_top_token(top_p):
    close(probs_of(log([0.2, 0.3, 0.5]), temperature=1.0, top_p=top_p), [0, 0, 1])


def test_top_p_is_computed_on_the_tempered_distribution():
    # At T=1, p = [.6, .3, .1]: top-p .75 keeps two tokens. At T=.5, p = [36, 9, 1]/46 ~ [.783, .196, .022]:
    # the top token alone reaches .75.
    close(probs_of(log([0.6, 0.3, 0.1]), temperature=1.0, top_p=0.75), [2 / 3, 1 / 3, 0])
    close(probs_of(log([0.6, 0.3, 0.1]), temperature=0.5, top_p=0.75), [1, 0, 0])
    # and at T = .5 with top-p .8 (> .783) the second one comes back, renormalised at T = .5.
    close(probs_of(log([0.6, 0.3, 0.1]), temperature=0.5, top_p=0.8), [36 / 45, 9 / 45, 0])


def test_top_k_then_top_p():
    # top-k 3 of [.4, .3, .2, .1] -> [4, 3, 2]/9 ~ [.444, .333, .222]; top-p .7 then keeps the first two.
    close(probs_of(log([0.4, 0.3, 0.2, 0.1]), temperature=1.0, top_k=3, top_p=0.7), [4 / 7, 3 / 7, 0, 0])
    # Without top-k, top-p .7 on [.4, .3, .2, .1] would keep the same two; with top-p .75 it differs:
    # .444 + .333 = .778 >= .75 (two tokens) versus .4 + .3 = .7 < .75 (three tokens).
    close(probs_of(log([0.4, 0.3, 0.2, 0.1]), temperature=1.0, top_k=3, top_p=0.75), [4 / 7, 3 / 7, 0, 0])
    close(probs_of(log([0.4, 0.3, 0.2, 0.1]), temperature=1.0, top_p=0.75), [4 / 9, 3 / 9, 2 / 9, 0])


def test_top_p_per_row():
    logits = torch.tensor([log([0.5, 0.3, 0.2]), log([0.2, 0.2, 0.6])], dtype=torch.float32)
    out = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.55)).double().numpy()
    close(out, [[5 / 8, 3 / 8, 0], [0, 0, 1]])


def full_sort_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The rule by its definition: sort the whole vocabulary, keep ids whose mass before them is below top_p."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    kept = sorted_p.masked_fill(sorted_p.cumsum(-1) - sorted_p >= top_p, 0.0)
    out = torch.zeros_like(probs).scatter_(-1, order, kept)
    return out / out.sum(-1, keepdim=True)


@pytest.mark.parametrize("scale", [8.0, 2.0, 0.05, 0.0], ids=["peaked", "spread", "nearly-flat", "flat"])
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.999])
def test_top_p_on_a_large_vocabulary_keeps_what_a_full_sort_keeps(scale, top_p):
    """top_p_filter takes the most likely ids in blocks (256, then 16x more, up to all): rows whose cut falls in
    the first block, past it, or only at the vocabulary's end (flat) keep the same ids as a full sort."""
    from verispec.sampling import TOP_P_BLOCK, top_p_filter

    gen = torch.Generator().manual_seed(int(scale * 100 + top_p * 1000))
    probs = torch.softmax(torch.randn(3, 151_936, generator=gen) * scale, dim=-1)
    fast, slow = top_p_filter(probs, top_p), full_sort_top_p(probs, top_p)
    if scale > 0:  # distinct masses: the same kept set, exactly
        assert torch.equal(fast > 0, slow > 0)
        torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-9)
    else:  # all tied: any ceil(top_p * V) ids are the rule's set; the count is what is fixed
        assert torch.equal((fast > 0).sum(-1), (slow > 0).sum(-1))
    if scale == 8.0 and top_p == 0.5:
        assert int((fast[0] > 0).sum()) < TOP_P_BLOCK  # the first block decided it
    if scale == 0.05:
        assert int((fast[0] > 0).sum()) > 16 * TOP_P_BLOCK  # it took the whole vocabulary


# ---- greedy -------------------------------------------------------------------------------------------------------
def test_greedy_is_one_hot_of_first_argmax():
    assert probs_of([1.0, 3.0, 3.0, 2.0], temperature=0.0).tolist() == [0, 1, 0, 0]
    assert probs_of([5.0, 5.0, 5.0], temperature=0.0).tolist() == [1, 0, 0]
    assert SamplingParams().greedy and not SamplingParams(temperature=1e-3).greedy


def test_greedy_ignores_top_k_and_top_p():
    assert probs_of([1.0, 3.0, 3.0, 2.0], temperature=0.0, top_k=1, top_p=0.1).tolist() == [0, 1, 0, 0]


def test_greedy_batched_matches_torch_argmax():
    logits = torch.randint(0, 3, (50, 7)).float()  # many ties
    out = logits_to_probs(logits, SamplingParams(temperature=0.0))
    assert torch.equal(out.argmax(-1), logits.argmax(-1))
    assert torch.equal(out.sum(-1), torch.ones(50)) and set(out.unique().tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize("vocab", [151936, 65536, 32000, 8191, 9973, 300])  # blocked (3) and not (prime, short)
def test_argmax_is_torchs_on_long_rows_ties_nan_and_infinities(vocab):
    """The blocked argmax gives torch.argmax's index: ties across and within blocks (the first wins), a maximum in
    the last block or at the first index, NaN (the first NaN wins), all -inf rows, bfloat16, any leading shape."""
    gen = torch.Generator().manual_seed(vocab)
    x = torch.randint(-50, 50, (12, vocab), generator=gen).float()  # many ties everywhere
    x[1, -1] = 100.0  # the last index
    x[2, 0] = 100.0  # the first
    x[3, [vocab // 2, vocab - 2, 7]] = 100.0  # ties across blocks: index 7
    x[4, [vocab - 3, vocab - 1]] = math.nan  # NaN wins, its first one, far behind the finite maxima
    x[5, [9, vocab // 2]] = math.nan
    x[5, 3] = math.inf
    x[6] = -math.inf  # every logit -inf: index 0
    x[7, :] = 0.0  # all tied
    x[8, vocab - 1], x[8, vocab - 2] = math.inf, math.inf
    for y in (x, x.view(3, 4, vocab), x.bfloat16(), torch.randn(2, vocab, generator=gen), x[:0]):
        assert torch.equal(argmax(y), y.float().argmax(-1)), (vocab, y.shape, y.dtype)


# ---- validation -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": math.nan},
        {"temperature": math.inf},
        {"top_p": 0.0},
        {"top_p": -0.5},
        {"top_p": 1.0001},
        {"top_p": math.nan},
        {"top_k": -1},
    ],
)
def test_invalid_params_raise(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs", [{}, {"temperature": 0.0}, {"temperature": 2.5, "top_k": 1, "top_p": 1e-9}, {"top_p": 1.0, "top_k": 0}]
)
def test_valid_params(kwargs):
    SamplingParams(**kwargs)


# ---- sample / generator --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_sample_shapes_and_law(monkeypatch, path):
    _use(monkeypatch, path)
    probs = torch.tensor([[0.0, 0.25, 0.75], [1.0, 0.0, 0.0]])
    draws = torch.stack([sample(probs, make_generator(s)) for s in range(2000)])  # [2000, 2]
    assert draws.shape == (2000, 2)
    assert torch.all(draws[:, 1] == 0) and torch.all(draws[:, 0] != 0)
    frac = (draws[:, 0] == 2).double().mean().item()
    assert abs(frac - 0.75) < 5 * (0.75 * 0.25 / 2000) ** 0.5
    assert sample(torch.full((2, 3, 4), 0.25), make_generator(0)).shape == (2, 3)


@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_sample_draws_unnormalized_weights_by_their_law_over_a_large_vocabulary(monkeypatch, path):
    """sample() is an inverse-CDF draw: chi-square of 10000 draws against weight / sum, over a 152k vocabulary
    whose mass sits on 12 ids, with zero-weight ids between and after them (never drawn)."""
    from scipy.stats import chisquare

    _use(monkeypatch, path)
    w = torch.zeros(151936)
    ids = torch.tensor([0, 5, 6, 1000, 1001, 70000, 70002, 99999, 120000, 151000, 151934, 151935])
    w[ids] = torch.tensor([3.0, 1.0, 0.5, 2.0, 0.25, 4.0, 1.5, 0.75, 2.5, 1.0, 0.1, 0.9]) * 7.3  # not normalized
    gen = make_generator(5)
    draws = torch.stack([sample(w, gen) for _ in range(10000)])  # the rarest id: ~54 expected
    counts = torch.bincount(draws, minlength=w.numel())
    assert int(counts.sum() - counts[ids].sum()) == 0  # no zero-weight id
    share = w[ids].double().numpy()
    expected = share / share.sum() * 10000
    assert chisquare(counts[ids].double().numpy(), expected).pvalue > 1e-3


@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_sample_never_draws_a_zero_weight_id_when_the_uniform_rounds_up(monkeypatch, path):
    """u = rand * total can round up to total; the draw then takes the last id with weight, not one past it."""
    import verispec.sampling as sampling

    _use(monkeypatch, path)
    monkeypatch.setattr(sampling.torch, "rand", lambda *a, **k: torch.ones(*a[:2], dtype=torch.float64))
    assert sample(torch.tensor([[0.2, 0.5, 0.3, 0.0, 0.0]]), None).tolist() == [2]


@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_sample_is_the_inverse_of_the_whole_cumulative_sum_at_block_edges(monkeypatch, path):
    """The blocked draw (block sums, then one block's cumulative sum; compiled, or in torch) picks the id a single
    cumulative sum over the row picks, for the same uniform: at every block edge (an off-by-one there would draw a
    neighbour, or a zero weight), beside them, at ids' own cumulative sums and at random. Integer weights keep every
    sum exact, so they must agree."""
    import verispec.sampling as sampling

    _use(monkeypatch, path)
    vocab = 151936
    block = sampling.draw_block(vocab)
    assert block and vocab // block > 1
    gen = torch.Generator().manual_seed(3)
    w = torch.randint(0, 4, (vocab,), generator=gen).float()
    w[block - 5 : 3 * block + 7] = 0.0  # whole blocks without weight, and zero runs across edges
    w[-block:] = 0.0
    cdf = w.double().cumsum(0)
    total = float(cdf[-1])
    edges = cdf[block - 1 :: block]  # the mass up to each block's end
    inside = cdf[torch.randint(0, vocab, (200,), generator=gen)]  # the mass up to an id: the next id with weight
    anywhere = torch.rand(200, generator=gen, dtype=torch.float64) * total
    targets = torch.cat([edges, edges - 0.5, edges + 0.5, inside, anywhere])
    targets = targets[(targets >= 0) & (targets < total)]
    uniforms = iter((targets / total).tolist())
    monkeypatch.setattr(sampling.torch, "rand", lambda *a, **k: torch.full(a[:2], next(uniforms), dtype=torch.float64))
    for t in targets.tolist():
        u = t / total * total  # the product sample() forms
        want = int(torch.searchsorted(cdf, torch.tensor([u], dtype=torch.float64), right=True))
        got = int(sample(w, None))
        assert got == want and w[got] > 0, (t, got, want)


def _use(monkeypatch, path: str) -> None:
    """Run sampling's compiled kernels ("kernel", skipped where they cannot be built) or its torch code ("torch")."""
    from verispec.models.kernels import SAMPLING_ENV, sampling_kernel

    monkeypatch.setenv(SAMPLING_ENV, "torch" if path == "torch" else "kernel")
    if path == "kernel" and sampling_kernel() is None:
        pytest.skip("verispec's CPU kernels cannot be built here (no x86 AVX2 CPU, or no compiler)")


@pytest.mark.parametrize("weights", [[0.0, 0.0], [1.0, float("nan")], [1.0, -0.5, 2.0], [float("inf"), 1.0],
                                     [[1.0, 2.0], [0.0, 0.0]]])
@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_sample_refuses_weights_that_have_no_law(monkeypatch, path, weights):
    _use(monkeypatch, path)
    with pytest.raises(ValueError, match="non-negative"):
        sample(torch.tensor(weights), None)


def test_nearby_seeds_start_independent_streams():
    """Choice i of a request is seeded seed + i, and the law tests seed sample i with base + i: the first float64
    uniforms of 1000 consecutive seeds must look uniform (unmixed, torch's generator fails this at p = 1e-4)."""
    from scipy.stats import kstest

    first = [float(torch.rand(1, dtype=torch.float64, generator=make_generator(22_000_000 + i))) for i in range(1000)]
    assert kstest(first, "uniform").pvalue > 1e-3


def test_make_generator_is_reproducible():
    a = torch.rand(5, generator=make_generator(123))
    b = torch.rand(5, generator=make_generator(123))
    c = torch.rand(5, generator=make_generator(124))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_a_top_p_below_the_dtypes_range_keeps_the_top_token():
    """top_p = 1e-300 is valid, but rounds to 0 in float32: it must still keep the most likely token, not NaN."""
    from verispec.sampling import SamplingParams, logits_to_probs

    logits = torch.tensor([[0.5, 2.0, -1.0]])
    for top_p in (1e-300, 5e-324):
        probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=top_p))
        assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0]]))


def test_probs_over_a_truncated_head_equal_probs_over_the_padded_vocabulary():
    """A drafter whose head covers the first V' ids: q computed over V' and padded with zeros is the q of its
    logits padded with -inf (what verification reads), for every sampling transform."""
    from verispec.proposers.draft_model import probs_on_vocab, to_vocab

    logits = 3 * torch.randn(2, 20, generator=torch.Generator().manual_seed(0))
    for params in (SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
                   SamplingParams(temperature=1.3, top_k=5), SamplingParams(temperature=0.5, top_k=25, top_p=0.5)):
        torch.testing.assert_close(probs_on_vocab(logits, params, 30), logits_to_probs(to_vocab(logits, 30), params),
                                   rtol=0, atol=1e-7)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 2.5, 1e-30])
def test_the_compiled_softmax_is_torchs(monkeypatch, temperature):
    """logits_to_probs's compiled softmax (sample.cpp) against its torch code: rows with -inf entries, a width that
    is not a multiple of the vector (16), a temperature near greedy's; a NaN row, or one of -inf only, stays NaN."""
    from verispec.models.kernels import SAMPLING_ENV

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 1003, generator=gen) * 4
    x[1, ::3] = -math.inf
    x[2, 7] = 30.0
    params = SamplingParams(temperature=temperature)
    monkeypatch.setenv(SAMPLING_ENV, "torch")
    want = logits_to_probs(x, params)
    _use(monkeypatch, "kernel")
    got = logits_to_probs(x, params)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-7)
    assert torch.equal(got == 0, want == 0) and torch.allclose(got.sum(-1), torch.ones(5))
    bad = torch.tensor([[1.0, float("nan"), 2.0], [-math.inf, -math.inf, -math.inf]])
    assert logits_to_probs(bad, params).isnan().all()
