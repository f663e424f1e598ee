"""The pure verifier: hand-computed cases, a per-token reference, and the exact law of chain speculative sampling.

Notation as in verispec.verify: drafts d_0..d_{g-1}, target rows p_0..p_g, proposal rows q_0..q_{g-1}. A round emits
tokens[: num_accepted + 1].
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from verispec.sampling import SamplingParams, logits_to_probs
from verispec.verify import Verified, verify_chain, verify_chain_compiled, verify_greedy

V = 4


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def run_batched(draft, p, q, batch: int, seed: int = 0) -> Verified:
    """One call on `batch` copies of the same case (rows are independent), one generator."""
    d = torch.tensor([draft], dtype=torch.long).expand(batch, -1).contiguous()
    pp = t(p)[None].expand(batch, -1, -1).contiguous()
    qq = t(q).reshape(1, len(draft), -1).expand(batch, -1, -1).contiguous() if draft else torch.zeros(batch, 0, pp.shape[-1])
    return verify_chain(d, pp, qq, torch.Generator().manual_seed(seed))


def run_seeds(draft, p, q, seeds) -> list[tuple[int, tuple[int, ...]]]:
    """Batch 1, a fresh generator per seed: the (num_accepted, emitted tokens) outcome of each seed."""
    d = torch.tensor([draft], dtype=torch.long)
    pp, qq = t(p)[None], t(q).reshape(1, len(draft), -1) if draft else torch.zeros(1, 0, len(p[0]))
    out = []
    for s in seeds:
        v = verify_chain(d, pp, qq, torch.Generator().manual_seed(s))
        n = int(v.num_accepted[0])
        out.append((n, tuple(v.tokens[0, : n + 1].tolist())))
    return out


def assert_freqs(samples: list[int] | torch.Tensor, probs: list[float], *, pmin: float = 1e-4) -> None:
    """Empirical frequencies of categorical samples match `probs`: impossible values never occur, and a
    chi-square test over the possible values does not reject."""
    samples = torch.as_tensor(samples).flatten()
    counts = torch.bincount(samples, minlength=len(probs)).double().numpy()
    probs = np.asarray(probs, dtype=float)
    assert counts[probs == 0].sum() == 0, f"impossible values drawn: counts {counts}, probs {probs}"
    support = probs > 0
    if support.sum() >= 2:
        exp = probs[support] / probs[support].sum() * counts.sum()
        pv = stats.chisquare(counts[support], exp).pvalue
        assert pv > pmin, f"counts {counts} vs probs {probs}: chi-square p = {pv:.3g}"


# ---- hand-computed cases --------------------------------------------------------------------------------------
def test_all_accepted_bonus_drawn_from_last_target_row():
    # q(d_i) <= p(d_i) for both drafts: acceptance probability 1. p_2 is one-hot at 3, a token no draft used and
    # that p_0, p_1 give little mass: a bonus from any other row (or from a residual) would show up.
    p = [[0.5, 0.2, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0.0, 0.0, 0.0, 1.0]]
    q = [[0.5, 0.1, 0.2, 0.2], [0.3, 0.3, 0.2, 0.2]]
    v = run_batched([0, 1], p, q, batch=5000)
    assert torch.all(v.num_accepted == 2)
    assert torch.all(v.tokens == torch.tensor([0, 1, 3]))
    assert set(run_seeds([0, 1], p, q, range(200))) == {(2, (0, 1, 3))}


def test_all_accepted_bonus_is_a_sample_of_last_row():
    p = [[0.25, 0.25, 0.25, 0.25], [0.0, 0.1, 0.2, 0.7]]
    q = [[0.25, 0.25, 0.25, 0.25]]  # q == p: always accepted (u < 1)
    v = run_batched([2], p, q, batch=20000, seed=1)
    assert torch.all(v.num_accepted == 1) and torch.all(v.tokens[:, 0] == 2)
    assert_freqs(v.tokens[:, 1], p[1])


def test_first_draft_rejected_recovers_from_residual():
    # d_0 = 3 has p_0(3) = 0: always rejected. Residual max(0, p_0 - q_0) = [.3, 0, .1, 0] -> [.75, 0, .25, 0];
    # sampling from p_0 instead would give token 1 30% of the time.
    p = [[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]]
    q = [[0.2, 0.5, 0.1, 0.2]]
    v = run_batched([3], p, q, batch=20000, seed=2)
    assert torch.all(v.num_accepted == 0)
    assert_freqs(v.tokens[:, 0], [0.75, 0.0, 0.25, 0.0])


def test_middle_draft_rejected_recovers_from_its_residual_over_many_seeds():
    # d_0 = 0 always accepted (q <= p); d_1 = 2 always rejected (p_1(2) = 0); d_2 never reached.
    # Residual at 1: max(0, [.4, .4, 0, .2] - [.1, .5, .3, .1]) = [.3, 0, 0, .1] -> [.75, 0, 0, .25].
    p = [[0.4, 0.2, 0.2, 0.2], [0.4, 0.4, 0.0, 0.2], [0.25] * 4, [0.25] * 4]
    q = [[0.3, 0.3, 0.2, 0.2], [0.1, 0.5, 0.3, 0.1], [0.25] * 4]
    outcomes = run_seeds([0, 2, 1], p, q, range(3000))
    assert {n for n, _ in outcomes} == {1}
    assert {toks[0] for _, toks in outcomes} == {0}
    assert_freqs([toks[1] for _, toks in outcomes], [0.75, 0.0, 0.0, 0.25])
    # The same through one batched call.
    v = run_batched([0, 2, 1], p, q, batch=20000, seed=3)
    assert torch.all(v.num_accepted == 1)
    assert_freqs(v.tokens[:, 1], [0.75, 0.0, 0.0, 0.25])


def test_one_hot_residual_is_deterministic():
    # p_1 - q_1 = [0, .5, -.5, 0]: the residual is one-hot at 1 (while p_1 itself would give 3 half the time).
    p = [[0.25] * 4, [0.0, 0.5, 0.0, 0.5], [0.25] * 4]
    q = [[0.25] * 4, [0.0, 0.0, 0.5, 0.5]]
    outcomes = Counter(run_seeds([1, 2], p, q, range(500)))
    assert set(outcomes) == {(1, (1, 1))}


def test_q_zero_is_always_accepted():
    # q(x) = 0 < p(x): the ratio is infinite, accepted whatever u is (no division by zero, no NaN).
    p = [[1e-4, 0.5, 0.4999, 0.0], [0.0, 0.0, 1.0, 0.0]]
    q = [[0.0, 0.5, 0.5, 0.0]]
    v = run_batched([0], p, q, batch=5000, seed=4)
    assert torch.all(v.num_accepted == 1) and torch.all(v.tokens == torch.tensor([0, 2]))


def test_p_zero_is_never_accepted_and_residual_excludes_it():
    p = [[0.0, 0.5, 0.5, 0.0], [0.25] * 4]
    q = [[0.97, 0.01, 0.01, 0.01]]
    v = run_batched([0], p, q, batch=20000, seed=5)
    assert torch.all(v.num_accepted == 0)
    # residual max(0, p - q) = [0, .49, .49, 0]
    assert_freqs(v.tokens[:, 0], [0.0, 0.5, 0.5, 0.0])


def test_rejected_draft_is_never_the_recovered_token():
    # p(x) = .3 < q(x) = .6: accepted with probability .5; on rejection the residual gives x no mass.
    p = [[0.3, 0.3, 0.2, 0.2], [1.0, 0.0, 0.0, 0.0]]
    q = [[0.6, 0.1, 0.1, 0.2]]
    v = run_batched([0], p, q, batch=40000, seed=6)
    rejected = v.num_accepted == 0
    assert abs(rejected.double().mean().item() - 0.5) < 0.015  # 6 sigma at 40000 draws
    # residual max(0, [-.3, .2, .1, 0]) -> [0, 2/3, 1/3, 0]
    assert_freqs(v.tokens[rejected, 0], [0.0, 2 / 3, 1 / 3, 0.0])
    assert torch.all(v.tokens[~rejected] == torch.tensor([0, 0]))  # accepted, then bonus one-hot at 0


def test_one_hot_q_accepts_with_probability_p_and_residual_is_p_without_x():
    # A deterministic proposer (n-gram) has one-hot q: accept with p(x); else sample p with x removed.
    p = [[0.1, 0.2, 0.3, 0.4], [0.0, 1.0, 0.0, 0.0]]
    q = [[0.0, 0.0, 1.0, 0.0]]
    v = run_batched([2], p, q, batch=40000, seed=7)
    accepted = v.num_accepted == 1
    assert abs(accepted.double().mean().item() - 0.3) < 6 * (0.3 * 0.7 / 40000) ** 0.5
    assert_freqs(v.tokens[~accepted, 0], [0.1 / 0.7, 0.2 / 0.7, 0.0, 0.4 / 0.7])
    assert torch.all(v.tokens[accepted, 1] == 1)
    # Overall the first emitted token is distributed exactly as p_0.
    assert_freqs(v.tokens[:, 0], p[0])


def test_gamma_zero_is_plain_sampling_from_p0():
    p = [[0.1, 0.0, 0.6, 0.3]]
    v = run_batched([], p, [], batch=20000, seed=8)
    assert v.tokens.shape == (20000, 1) and torch.all(v.num_accepted == 0)
    assert_freqs(v.tokens[:, 0], p[0])


def test_rows_of_a_batch_are_independent():
    # Row 0: always accepted, bonus one-hot 3. Row 1: always rejected at 0, residual one-hot 1.
    draft = torch.tensor([[0, 1], [2, 2]])
    p = t([[[0.5, 0.2, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0, 0, 0, 1]],
           [[0.0, 1.0, 0.0, 0.0], [0.25] * 4, [0.25] * 4]])
    q = t([[[0.5, 0.1, 0.2, 0.2], [0.3, 0.3, 0.2, 0.2]],
           [[0.0, 0.0, 1.0, 0.0], [0.25] * 4]])
    for s in range(50):
        v = verify_chain(draft, p, q, torch.Generator().manual_seed(s))
        assert v.num_accepted.tolist() == [2, 0]
        assert v.tokens[0].tolist() == [0, 1, 3] and v.tokens[1, 0].item() == 1


def test_random_stream_does_not_depend_on_outcome():
    """Documented contract: B*gamma uniforms and B categorical draws whatever happens."""
    draft = torch.tensor([[0, 1, 2]])
    accept_all = (t([[[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0.25] * 4]]), t([[[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]]))
    reject_first = (t([[[0, 1, 0, 0], [0.25] * 4, [0.25] * 4, [0.25] * 4]]), t([[[1, 0, 0, 0], [0.25] * 4, [0.25] * 4]]))
    states = []
    for p, q in (accept_all, reject_first):
        g = torch.Generator().manual_seed(9)
        verify_chain(draft, p, q, g)
        states.append(torch.rand(4, generator=g))
    assert torch.equal(states[0], states[1])


# ---- greedy ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "draft,argmax,n,emitted",
    [
        ([1, 2], [3, 2, 0], 0, [3]),  # mismatch at position 0: the target's argmax is the recovered token
        ([1, 2, 3], [1, 0, 3, 2], 1, [1, 0]),  # mismatch in the middle; the later match does not count
        ([1, 2, 3], [1, 2, 0, 2], 2, [1, 2, 0]),  # mismatch at the last draft
        ([1, 2], [1, 2, 3], 2, [1, 2, 3]),  # all match: bonus = argmax after the last draft
        ([], [2], 0, [2]),  # gamma 0: plain greedy
    ],
)
def test_verify_greedy_rules(draft, argmax, n, emitted):
    v = verify_greedy(torch.tensor([draft], dtype=torch.long).reshape(1, len(draft)), torch.tensor([argmax]))
    assert int(v.num_accepted[0]) == n
    assert v.tokens[0, : n + 1].tolist() == emitted


def test_verify_greedy_batched():
    draft = torch.tensor([[1, 2], [1, 2], [0, 0]])
    argmax = torch.tensor([[1, 2, 3], [1, 3, 3], [2, 0, 1]])
    v = verify_greedy(draft, argmax)
    assert v.num_accepted.tolist() == [2, 1, 0]
    assert [v.tokens[b, : int(n) + 1].tolist() for b, n in enumerate(v.num_accepted)] == [[1, 2, 3], [1, 3], [2]]


def test_one_hot_chain_equals_greedy():
    """With p = one-hot(argmax) and q = one-hot(draft) the stochastic verifier reduces exactly to the greedy
    rules, for every generator seed."""
    gen = torch.Generator().manual_seed(10)
    for gamma in range(0, 6):
        for trial in range(40):
            b = 8
            # Drafts that often match: copy the argmax and corrupt some positions.
            argmax = torch.randint(0, V, (b, gamma + 1), generator=gen)
            draft = argmax[:, :gamma].clone()
            corrupt = torch.rand(b, gamma, generator=gen) < 0.25
            draft[corrupt] = torch.randint(0, V, (int(corrupt.sum()),), generator=gen)
            p = torch.nn.functional.one_hot(argmax, V).float()
            q = torch.nn.functional.one_hot(draft, V).float()
            vg = verify_greedy(draft, argmax)
            vc = verify_chain(draft, p, q, torch.Generator().manual_seed(trial))
            assert torch.equal(vg.num_accepted, vc.num_accepted)
            for row in range(b):
                n = int(vg.num_accepted[row])
                assert torch.equal(vg.tokens[row, : n + 1], vc.tokens[row, : n + 1])


# ---- reference implementation and the exact law ----------------------------------------------------------------
def reference_verify(draft: list[int], p: list[list[float]], q: list[list[float]], rng: random.Random):
    """Slow but obvious: one token at a time, exactly as the papers state it."""
    for i, x in enumerate(draft):
        u = rng.random()
        if q[i][x] == 0:
            ok = p[i][x] > 0
        else:
            ok = u < p[i][x] / q[i][x]
        if not ok:
            residual = [max(0.0, a - b) for a, b in zip(p[i], q[i])]
            y = rng.choices(range(len(residual)), weights=residual)[0]
            return i, tuple(draft[:i]) + (y,)
    y = rng.choices(range(len(p[-1])), weights=p[-1])[0]
    return len(draft), tuple(draft) + (y,)


def exact_law(p: np.ndarray, q: np.ndarray) -> dict[tuple[int, tuple[int, ...]], float]:
    """P(num_accepted = n, emitted = tokens) when each draft d_i ~ q_i, by enumerating every draft chain."""
    gamma, vocab = q.shape[0], p.shape[1]
    law: dict = defaultdict(float)

    def rec(i: int, prefix: tuple[int, ...], prob: float) -> None:
        if i == gamma:
            for b in range(vocab):
                if p[gamma, b] > 0:
                    law[(gamma, prefix + (b,))] += prob * p[gamma, b]
            return
        residual = np.maximum(p[i] - q[i], 0.0)
        for x in range(vocab):
            if q[i, x] == 0:
                continue  # never drafted
            acc = min(1.0, p[i, x] / q[i, x])
            if acc > 0:
                rec(i + 1, prefix + (x,), prob * q[i, x] * acc)
            if acc < 1:
                res = residual / residual.sum()
                for y in range(vocab):
                    if res[y] > 0:
                        law[(i, prefix + (y,))] += prob * q[i, x] * (1 - acc) * res[y]

    rec(0, (), 1.0)
    return dict(law)


def law_pvalue(samples: list, law: dict) -> float:
    """Chi-square p-value of sampled outcomes against an exact law (cells with expected count < 5 pooled);
    0 if an impossible outcome was drawn."""
    counts = Counter(samples)
    if any(k not in law or law[k] == 0 for k in counts):
        return 0.0
    n = len(samples)
    keys = sorted(k for k, v in law.items() if v > 0)
    exp = np.array([law[k] * n for k in keys])
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    small = exp < 5
    o = list(obs[~small]) + ([obs[small].sum()] if small.any() else [])
    e = list(exp[~small]) + ([exp[small].sum()] if small.any() else [])
    if len(e) < 2:
        return 1.0
    o_, e_ = np.array(o), np.array(e)
    return float(stats.chisquare(o_, e_ * o_.sum() / e_.sum()).pvalue)


def sample_chain(p: np.ndarray, q: np.ndarray, m: int, seed: int, verifier=verify_chain) -> list:
    """m independent rounds in ONE batched verifier call; drafts drawn from q row by row."""
    gamma, vocab = q.shape[0], p.shape[1]
    gen = torch.Generator().manual_seed(seed)
    pt, qt = torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32).reshape(gamma, vocab)
    if gamma:
        draft = torch.stack([torch.multinomial(qt[i], m, replacement=True, generator=gen) for i in range(gamma)], 1)
    else:
        draft = torch.zeros(m, 0, dtype=torch.long)
    v = verifier(draft, pt[None].expand(m, -1, -1), qt[None].expand(m, -1, -1), gen)
    nums, toks = v.num_accepted.tolist(), v.tokens.tolist()
    return [(n, tuple(row[: n + 1])) for n, row in zip(nums, toks)]


def check_law_identities(p: np.ndarray, q: np.ndarray, law: dict) -> None:
    """Exact identities of chain speculative sampling (rows p_i fixed): the law sums to 1, the first emitted token
    is distributed exactly as p_0, and given that position j is emitted, its token is distributed as p_j."""
    gamma, vocab = q.shape[0], p.shape[1]
    assert abs(sum(law.values()) - 1) < 1e-9
    for j in range(gamma + 1):
        emitted_j = np.zeros(vocab)
        for (n, toks), pr in law.items():
            if n >= j:
                emitted_j[toks[j]] += pr
        reach = emitted_j.sum()  # P(num_accepted >= j)
        np.testing.assert_allclose(emitted_j, reach * p[j], atol=1e-9)
        if j == 0:
            np.testing.assert_allclose(emitted_j, p[0], atol=1e-12)


def dist_rows(rows: int, vocab: int):
    """Rows of small integer weights (zeros likely: exercises p(x) = 0 and q(x) = 0), normalised."""
    row = st.lists(st.integers(0, 4), min_size=vocab, max_size=vocab).filter(lambda r: sum(r) > 0)
    return st.lists(row, min_size=rows, max_size=rows).map(
        lambda rs: np.array([[w / sum(r) for w in r] for r in rs], dtype=np.float64))


@st.composite
def chain_cases(draw):
    vocab = draw(st.integers(2, 4))
    gamma = draw(st.integers(0, 3))
    p = draw(dist_rows(gamma + 1, vocab))
    q = draw(dist_rows(gamma, vocab)) if gamma else np.zeros((0, vocab))
    return p, q, draw(st.integers(0, 2**31 - 1))


@settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain_cases())
def test_verify_chain_matches_exact_law(case):
    p, q, seed = case
    law = exact_law(p, q)
    check_law_identities(p, q, law)
    samples = sample_chain(p, q, 20000, seed)
    assert law_pvalue(samples, law) > 1e-4
    # The first emitted token, on its own, is a sample of p_0.
    assert law_pvalue([toks[0] for _, toks in samples], dict(enumerate(p[0]))) > 1e-4


@settings(max_examples=15, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain_cases())
def test_reference_matches_exact_law(case):
    """The per-token reference and the enumerated law agree, so verify_chain == law == reference in distribution."""
    p, q, seed = case
    rng = random.Random(seed)
    gamma, vocab = q.shape[0], p.shape[1]
    samples = []
    for _ in range(3000):
        draft = [rng.choices(range(vocab), weights=q[i])[0] for i in range(gamma)]
        samples.append(reference_verify(draft, p.tolist(), q.tolist(), rng))
    assert law_pvalue(samples, exact_law(p, q)) > 1e-4


def _residual_is_p(draft, p, q, generator):
    v = verify_chain(draft, p, q, generator)
    rows = torch.arange(draft.shape[0])
    wrong = torch.multinomial(p[rows, v.num_accepted], 1, generator=generator).squeeze(-1)
    tokens = v.tokens.clone()
    tokens[rows, v.num_accepted] = torch.where(v.num_accepted < draft.shape[1], wrong, tokens[rows, v.num_accepted])
    return Verified(v.num_accepted, tokens)


def test_law_comparison_rejects_a_broken_verifier():
    """The harness above has power: a verifier that recovers from p instead of the residual is rejected."""
    p = np.array([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4], [0.25] * 4])
    q = np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]])
    law = exact_law(p, q)
    assert law_pvalue(sample_chain(p, q, 20000, 1), law) > 1e-4
    assert law_pvalue(sample_chain(p, q, 20000, 1, verifier=_residual_is_p), law) < 1e-6


# ---- the compiled chain (sample.cpp's verify_row) -----------------------------------------------------------------
def _compiled_cases(vocab: int, seed: int) -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """(what, logits [g + 1, V], draft [g], q [g, V] or None) covering each rejection point, all accepted, one-hot
    q, q(x) = 0, p(x) = 0, a residual that rounds to nothing, -inf logits."""
    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=0.7)
    cases = []
    for g in range(6):
        for spread in (0.0, 0.5, 3.0):  # q near p (long acceptances) .. far from it (early rejections)
            lg = torch.randn(g + 1, vocab, generator=gen) * 3
            q = logits_to_probs(lg[:g] + torch.randn(g, vocab, generator=gen) * spread, params)
            draft = torch.multinomial(q, 1, generator=gen)[:, 0] if g else torch.empty(0, dtype=torch.long)
            cases.append((f"g={g} spread={spread}", lg, draft, q))
            cases.append((f"g={g} spread={spread} one-hot", lg, draft, None))
    lg = torch.randn(4, vocab, generator=gen)
    draft = torch.tensor([1, 2, 3])
    q = logits_to_probs(lg[:3], params)
    q_zero = q.clone()
    q_zero[:, 1:4] = 0.0
    cases.append(("q(x) = 0", lg, draft, q_zero))
    p_zero = lg.clone()
    p_zero[1, 2] = float("-inf")
    p_zero[:, ::5] = float("-inf")
    cases.append(("p(x) = 0, -inf logits", p_zero, draft, q))
    cases.append(("q >= p: no residual mass", lg, draft, q + logits_to_probs(lg[:3], params)))
    return cases


@pytest.mark.parametrize("vocab", [4, 1003, 151936])
def test_compiled_chain_is_verify_chain_draw_for_draw(vocab):
    """verify_chain_compiled from logits gives verify_chain's outcome over logits_to_probs(logits), for the same
    generator, and leaves the generator where it does: the same uniforms, the same probabilities, the same residual
    and fallback (a wrong residual row, an off-by-one in the accepted prefix or a different draw fails it)."""
    from verispec.models.kernels import sampling_kernel

    if sampling_kernel() is None:
        pytest.skip("verispec's CPU kernels cannot be built here (no x86 AVX2 CPU, or no compiler)")
    seen = set()
    for temperature in (0.7, 1.0, 0.05):
        params = SamplingParams(temperature=temperature)
        for what, lg, draft, q in _compiled_cases(vocab, seed=vocab):
            qq = q if q is not None else torch.zeros(draft.numel(), vocab).scatter_(-1, draft[:, None], 1.0)
            for seed in range(6 if vocab > 4 else 40):
                g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
                got = verify_chain_compiled(draft, lg, q, params, g1)
                want = verify_chain(draft[None], logits_to_probs(lg, params)[None], qq[None], g2)
                n = int(want.num_accepted[0])
                assert got is not None and int(got.num_accepted[0]) == n, (what, temperature, seed)
                assert got.tokens[0, : n + 1].tolist() == want.tokens[0, : n + 1].tolist(), (what, temperature, seed)
                assert torch.equal(g1.get_state(), g2.get_state()), (what, temperature, seed)
                seen.add((draft.numel(), n))
    if vocab == 4:  # the small cases reach every rejection point and all-accepted
        assert seen >= {(g, n) for g in range(1, 6) for n in range(g + 1)}, sorted(seen)


def test_compiled_chain_refuses_what_it_does_not_do_and_a_row_without_a_law():
    """top-k, top-p, greedy and a q not in float32 are left to the torch code (None); bfloat16 logits are taken as
    float32; a NaN row raises as sample does."""
    from verispec.models.kernels import sampling_kernel

    if sampling_kernel() is None:
        pytest.skip("verispec's CPU kernels cannot be built here (no x86 AVX2 CPU, or no compiler)")
    lg, draft = torch.randn(3, 50), torch.tensor([1, 2])
    for params in (SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=0.7, top_p=0.9),
                   SamplingParams()):
        assert verify_chain_compiled(draft, lg, None, params, None) is None
    assert verify_chain_compiled(draft, lg, torch.rand(2, 50).double(), SamplingParams(temperature=0.7), None) is None
    bf16 = lg.bfloat16()  # a bfloat16 target's logits: taken as float32, as logits_to_probs takes them
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    got = verify_chain_compiled(draft, bf16, None, SamplingParams(temperature=0.7), g1)
    one_hot = torch.zeros(2, 50).scatter_(-1, draft[:, None], 1.0)
    want = verify_chain(draft[None], logits_to_probs(bf16, SamplingParams(temperature=0.7))[None], one_hot[None], g2)
    n = int(want.num_accepted[0])
    assert got is not None and int(got.num_accepted[0]) == n
    assert torch.equal(got.tokens[0, : n + 1], want.tokens[0, : n + 1])
    lg[0, 3] = float("nan")
    with pytest.raises(ValueError, match="non-negative"):
        verify_chain_compiled(draft, lg, None, SamplingParams(temperature=0.7), torch.Generator().manual_seed(0))
