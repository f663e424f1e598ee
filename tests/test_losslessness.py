"""The statistical losslessness test: speculative sampling through the real engine reproduces the target's law.

Setup: a tiny target (vocab 6, 2 layers, hidden 32, std 0.4) and a draft that is the target with noisy weights
(alpha ~0.45-0.85, printed). The exact joint law of the first W = 3 generated tokens after a fixed prompt is
computed by enumeration (1 + V + V^2 fresh target prefills, `logits_to_probs` with the same SamplingParams).
N sequences are generated with the engine (distinct seeds) and compared with that law by

  * total variation distance, against a *measured* noise floor: the TV of N i.i.d. draws from the exact law
    (torch.multinomial, K repetitions); the threshold is floor mean + 4 floor std;
  * Pearson's chi-square test (cells with expected count < 5 merged), p-value > 1e-3.

A sample passes only if both hold. The same check must *fail* for deliberately broken verifiers passed through
`generate(..., verifier=...)`; those runs prove the test has the power to see the bugs it exists to catch.

About gamma: the engine drafts at most `max_new_tokens - 1` tokens in a round (drafting past the end is waste),
and a sequence's first round is a plain step (its proposer starts after it, so that a draft's prefill does not
delay the first token), so with max_new_tokens = 3 a gamma of 3 or 5 would silently run as gamma 1. Each case
therefore generates max(3, gamma + 2) tokens, so the second round really drafts gamma tokens, and stops
consuming the stream once 3 tokens are out (the law of the first 3 tokens does not depend on what would have
come later). gamma = 1 cases see the bonus token inside the window (position 3, of round 2); gamma = 3 / 5 cases
see the first positions of long chains (residuals at draft positions 0..1 and the draft's cache bookkeeping).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy import stats

from tests.conftest import fresh_logits
from verispec.engine import Batch, GenerationParams, NewSequence
from verispec.grammar import Constraint, mask_logits
from verispec.models.llama import LlamaModel
from verispec.proposers.base import Proposer, SequenceProposer
from verispec.proposers.draft_model import DraftModelProposer
from verispec.sampling import Penalties, SamplingParams, logits_to_probs, penalize
from verispec.verify import Verified, verify_chain, verify_tree

PROMPT = [4, 4, 1]
W = 3  # tokens whose joint law is compared
N = 1000  # sequences per case (profiled: the whole file runs in ~1-1.5 min on 2 busy cores)
FLOOR_REPS = 400  # multinomial repetitions for the noise floor
FLOOR_K = 4.0  # TV threshold = floor mean + FLOOR_K * floor std
P_MIN = 1e-3  # chi-square p-value threshold

T1 = SamplingParams(temperature=1.0)
T07 = SamplingParams(temperature=0.7)
T07_P09 = SamplingParams(temperature=0.7, top_p=0.9)


# ---- exact law, noise floor, statistics ---------------------------------------------------------------------
def exact_law(target: LlamaModel, sampling: SamplingParams, prompt: list[int] = PROMPT,
              penalties: Penalties = Penalties(), constraint: Callable[[], Constraint] | None = None) -> np.ndarray:
    """P(y1, y2, y3 | prompt) under the processed (penalized, grammar-masked) target, as a float64 [V, V, V]
    array (by enumeration). constraint(): a fresh grammar state."""
    V = target.vocab_size

    def probs(seq: list[int]) -> np.ndarray:
        logits = penalize(fresh_logits(target, seq)[-1:], prompt, seq[len(prompt):], [[]], penalties)[0]
        if constraint is not None:
            allowed = constraint().allowed(seq[len(prompt):])
            if allowed is None:  # a prefix the grammar forbids (probability 0 already)
                return np.zeros(V)
            logits = mask_logits(logits, allowed)
        return logits_to_probs(logits, sampling).double().numpy()

    law = np.zeros((V, V, V))
    p0 = probs(prompt)
    for a in range(V):
        p1 = probs(prompt + [a])
        for b in range(V):
            law[a, b] = p0[a] * p1[b] * probs(prompt + [a, b])
    assert abs(law.sum() - 1.0) < 1e-5
    return law


def tv(counts: np.ndarray, law: np.ndarray) -> float:
    return 0.5 * float(np.abs(counts.ravel() / counts.sum() - law.ravel()).sum())


def chi_square_pvalue(counts: np.ndarray, law: np.ndarray) -> float:
    """Pearson chi-square, cells with expected count < 5 pooled into one; 0 if an impossible sequence occurred."""
    obs, exp = counts.ravel().astype(float), law.ravel() * counts.sum()
    if obs[exp == 0].sum() > 0:
        return 0.0  # a sequence the processed target can never produce (e.g. a token top-p removes)
    small = exp < 5
    o = list(obs[~small]) + ([obs[small].sum()] if exp[small].sum() > 0 else [])
    e = list(exp[~small]) + ([exp[small].sum()] if exp[small].sum() > 0 else [])
    if e[-1] < 5 and len(e) > 2:  # pooled cell still small: fold it into the smallest regular cell
        j = int(np.argmin(e[:-1]))
        o[j] += o.pop()
        e[j] += e.pop()
    o_, e_ = np.array(o), np.array(e)
    e_ = e_ * (o_.sum() / e_.sum())  # exact renormalisation against float rounding
    return float(stats.chisquare(o_, e_).pvalue)


@dataclass
class Floor:
    mean: float
    std: float
    p99: float

    @property
    def threshold(self) -> float:
        return self.mean + FLOOR_K * self.std


def noise_floor(law: np.ndarray, n: int, seed: int) -> Floor:
    gen = torch.Generator().manual_seed(seed)
    flat = torch.from_numpy(law.ravel())
    tvs = []
    for _ in range(FLOOR_REPS):
        draws = torch.multinomial(flat, n, replacement=True, generator=gen)
        tvs.append(tv(np.bincount(draws.numpy(), minlength=flat.numel()), law))
    a = np.array(tvs)
    return Floor(float(a.mean()), float(a.std()), float(np.quantile(a, 0.99)))


# ---- sampling through the engine ----------------------------------------------------------------------------
@dataclass
class Run:
    counts: np.ndarray
    alpha: float | None


ROWS = 250  # sequences sampled side by side in one Batch: the server's batched round, and ~3x faster than one by one


def sample_engine(target: LlamaModel, draft: LlamaModel | None, sampling: SamplingParams, gamma: int,
                  seed_base: int, verifier=verify_chain, n: int = N, prompt: list[int] = PROMPT,
                  make_proposer: Callable[[int, int], Proposer] | None = None, tree_verifier=verify_tree,
                  penalties: Penalties = Penalties(), constraint: Callable[[], Constraint] | None = None,
                  rows: int = ROWS, max_new: int | None = None) -> Run:
    """n sequences (seeds seed_base + i), `rows` at a time in one Batch, each stopped once W tokens are out (the
    law of the first W tokens does not depend on what would come later; `max_new` only sizes the caches).
    make_proposer(max_len, rows), if given, replaces the DraftModelProposer over `draft` (other proposers' tests):
    one proposer serves a batch's rows."""
    V = target.vocab_size
    counts = np.zeros((V,) * W, dtype=np.int64)
    max_new = max_new or max(W, gamma + 2)
    max_len = len(prompt) + max_new + gamma + 2
    accepted = drafted = 0
    for start in range(0, n, rows):
        k = min(rows, n - start)
        if make_proposer is not None:
            proposer = make_proposer(max_len, k)
        else:
            proposer = None if draft is None else DraftModelProposer(draft, max_len, rows=k)
        assert not isinstance(proposer, SequenceProposer), "one instance a sequence: return PerRow(factory)"
        batch = Batch(target, k, len(prompt) + max_new, slack=gamma + 2, verifier=verifier,
                      tree_verifier=tree_verifier)
        seqs = batch.add_many([NewSequence(prompt, GenerationParams(max_new_tokens=max_new, gamma=gamma,
                                                                    sampling=sampling, seed=seed_base + start + i,
                                                                    penalties=penalties),
                                           proposer, constraint=constraint() if constraint else None)
                               for i in range(k)])
        while batch.live:
            for step in batch.round():
                if len(step.seq.out) >= W and step.seq.result.finish_reason is None:
                    batch.remove(step.seq, "stop")
        for seq in seqs:
            if seq.result.error is not None:
                raise seq.result.error
            assert len(seq.out) >= W, seq.out
            counts[tuple(seq.out[:W])] += 1
            accepted += seq.metrics.accepted
            drafted += seq.metrics.drafted
    return Run(counts, accepted / drafted if drafted else None)


@dataclass
class Verdict:
    tv: float
    floor: Floor
    pvalue: float
    alpha: float | None

    @property
    def passes(self) -> bool:
        return self.tv <= self.floor.threshold and self.pvalue > P_MIN

    def __str__(self) -> str:
        a = "-" if self.alpha is None else f"{self.alpha:.3f}"
        return (f"alpha={a} TV={self.tv:.4f} floor mean={self.floor.mean:.4f} std={self.floor.std:.4f} "
                f"p99={self.floor.p99:.4f} thr={self.floor.threshold:.4f} chi2 p={self.pvalue:.3g} "
                f"-> {'PASS' if self.passes else 'REJECT'}")


_laws: dict[tuple, np.ndarray] = {}
_floors: dict[tuple, Floor] = {}


def check(target, draft, sampling, gamma, seed_base, verifier=verify_chain, label="",
          make_proposer: Callable[[int, int], Proposer] | None = None, penalties: Penalties = Penalties(),
          constraint: Callable[[], Constraint] | None = None, max_new: int | None = None) -> Verdict:
    """The engine's law against the exact one (target: tiny_target; the laws are cached by sampling, penalties
    and grammar); make_proposer(max_len, rows), if given, replaces a DraftModelProposer over `draft`; max_new:
    sample_engine's."""
    key = (sampling, penalties, constraint)
    if key not in _laws:
        _laws[key] = exact_law(target, sampling, penalties=penalties, constraint=constraint)
        _floors[key] = noise_floor(_laws[key], N, seed=12345)
    law = _laws[key]
    run = sample_engine(target, draft, sampling, gamma, seed_base, verifier, make_proposer=make_proposer,
                        penalties=penalties, constraint=constraint, max_new=max_new)
    verdict = Verdict(tv(run.counts, law), _floors[key], chi_square_pvalue(run.counts, law), run.alpha)
    print(f"\n[{label or verifier.__name__}] T={sampling.temperature} top_p={sampling.top_p} gamma={gamma} N={N}"
          f"{'' if penalties.neutral else f' {penalties}'}: {verdict}")
    return verdict


# ---- broken verifiers: small wrappers over the real verify logic --------------------------------------------
def residual_is_p(draft, p, q, generator) -> Verified:
    """(a) On rejection at i, sample from p_i instead of normalize(max(0, p_i - q_i))."""
    v = verify_chain(draft, p, q, generator)
    batch, gamma = draft.shape
    rows = torch.arange(batch)
    n = v.num_accepted
    wrong = torch.multinomial(p[rows, n], 1, generator=generator).squeeze(-1)
    tokens = v.tokens.clone()
    tokens[rows, n] = torch.where(n < gamma, wrong, tokens[rows, n])
    return Verified(n, tokens)


def bonus_off_by_one(draft, p, q, generator) -> Verified:
    """(b) When all drafts are accepted, draw the bonus from p[gamma - 1] (= p[num_accepted - 1]), not p[gamma]."""
    v = verify_chain(draft, p, q, generator)
    batch, gamma = draft.shape
    if gamma == 0:
        return v
    rows = torch.arange(batch)
    n = v.num_accepted
    wrong = torch.multinomial(p[rows, gamma - 1], 1, generator=generator).squeeze(-1)
    tokens = v.tokens.clone()
    tokens[rows, gamma] = torch.where(n == gamma, wrong, tokens[rows, gamma])
    return Verified(n, tokens)


# (c) "bonus token dropped". The engine derives BOTH the output and the cache commit from the verifier's
# (num_accepted, tokens): it emits tokens[:n + 1], commits pending + tokens[:n] and makes tokens[n] the new
# pending token. So the dangerous variant -- the bonus is dropped from the output while the cache/context still
# continues from it -- cannot be expressed through the verifier interface: whatever a verifier returns, output
# and context stay the same text. What can be expressed:
def bonus_dropped_consistently(draft, p, q, generator) -> Verified:
    """(c1) When all drafts are accepted, emit only the drafts and continue from the last one (the bonus is
    discarded from output AND context). This is still lossless: every emitted token keeps its correct conditional
    law, the round just ends one token earlier. The test must NOT reject it."""
    v = verify_chain(draft, p, q, generator)
    gamma = draft.shape[1]
    if gamma == 0:  # the engine's last round of a request may draft nothing
        return v
    n = torch.where(v.num_accepted == gamma, v.num_accepted - 1, v.num_accepted)
    return Verified(n, v.tokens)


def bonus_replaces_last_draft(draft, p, q, generator) -> Verified:
    """(c2) When all drafts are accepted, emit the bonus in place of the last draft: the bonus (drawn from
    p_gamma, i.e. conditioned on the last draft) is kept while the draft it was conditioned on is dropped from the
    output and the cache. Not lossless; the test must reject it."""
    v = verify_chain(draft, p, q, generator)
    batch, gamma = draft.shape
    if gamma == 0:
        return v
    rows = torch.arange(batch)
    full = v.num_accepted == gamma
    n = torch.where(full, v.num_accepted - 1, v.num_accepted)
    tokens = v.tokens.clone()
    tokens[rows, gamma - 1] = torch.where(full, v.tokens[:, gamma], tokens[:, gamma - 1])
    return Verified(n, tokens)


# ---- correct engine ------------------------------------------------------------------------------------------
DEFAULT_CASES = [  # (sampling, gamma, seed_base)
    (T1, 3, 2_000_000),
    (T07_P09, 5, 3_000_000),
    (T07_P09, 1, 4_000_000),
]
SLOW_CASES = [
    (T1, 1, 1_000_000),
    (T1, 5, 5_000_000),
    (T07, 1, 6_000_000),
    (T07, 3, 7_000_000),
    (T07, 5, 8_000_000),
    (T07_P09, 3, 9_000_000),
]


def test_exact_law_is_sane(tiny_target):
    """The enumerated law is a distribution, top-p really removes tokens for this prompt, and the noise floor is
    small enough for the test to have teeth."""
    for sampling in (T1, T07_P09):
        law = exact_law(tiny_target, sampling)
        assert np.all(law >= 0) and abs(law.sum() - 1) < 1e-6
    # top-p 0.9 zeroes some continuations that T=0.7 alone keeps.
    assert (exact_law(tiny_target, T07_P09) == 0).sum() > (exact_law(tiny_target, T07) == 0).sum()
    assert noise_floor(exact_law(tiny_target, T1), N, seed=1).threshold < 0.2


@pytest.mark.parametrize("sampling,gamma,seed_base", DEFAULT_CASES,
                         ids=[f"T{s.temperature}-p{s.top_p}-g{g}" for s, g, _ in DEFAULT_CASES])
def test_speculative_matches_exact_law(tiny_target, tiny_draft, sampling, gamma, seed_base):
    verdict = check(tiny_target, tiny_draft, sampling, gamma, seed_base, label="correct")
    assert verdict.alpha is not None and 0.3 < verdict.alpha < 0.95, verdict  # a real mix of accepts/rejects
    assert verdict.passes, verdict


@pytest.mark.slow
@pytest.mark.parametrize("sampling,gamma,seed_base", SLOW_CASES,
                         ids=[f"T{s.temperature}-p{s.top_p}-g{g}" for s, g, _ in SLOW_CASES])
def test_speculative_matches_exact_law_full_grid(tiny_target, tiny_draft, sampling, gamma, seed_base):
    verdict = check(tiny_target, tiny_draft, sampling, gamma, seed_base, label="correct")
    assert verdict.passes, verdict


@pytest.mark.slow
def test_plain_engine_sampling_matches_exact_law(tiny_target):
    """Control: target-only sampling through the same engine loop (no proposer) also matches the enumeration."""
    verdict = check(tiny_target, None, T07_P09, 1, 10_000_000, label="plain")
    assert verdict.passes, verdict


# ---- broken verifiers must be caught by the SAME check ------------------------------------------------------
def test_detects_residual_replaced_by_p(tiny_target, tiny_draft):
    verdict = check(tiny_target, tiny_draft, T1, 3, 2_000_000, verifier=residual_is_p)
    assert not verdict.passes, verdict


def test_detects_bonus_from_wrong_row(tiny_target, tiny_draft):
    verdict = check(tiny_target, tiny_draft, T1, 1, 1_000_000, verifier=bonus_off_by_one)
    assert not verdict.passes, verdict


def test_detects_bonus_replacing_last_draft(tiny_target, tiny_draft):
    verdict = check(tiny_target, tiny_draft, T1, 1, 1_000_000, verifier=bonus_replaces_last_draft)
    assert not verdict.passes, verdict


@pytest.mark.slow
def test_consistently_dropped_bonus_is_still_lossless(tiny_target, tiny_draft):
    """Not a weakness of the test: dropping the bonus from output and context alike changes speed, not the law."""
    verdict = check(tiny_target, tiny_draft, T1, 1, 1_000_000, verifier=bonus_dropped_consistently)
    assert verdict.passes, verdict


@pytest.mark.slow
@pytest.mark.parametrize("verifier", [residual_is_p, bonus_off_by_one, bonus_replaces_last_draft])
def test_detects_broken_verifiers_top_p(tiny_target, tiny_draft, verifier):
    gamma = 3 if verifier is residual_is_p else 1
    verdict = check(tiny_target, tiny_draft, T07_P09, gamma, 4_000_000, verifier=verifier)
    assert not verdict.passes, verdict
