"""Adaptive gamma and the draft's confidence stop: they change speed, never the output.

Checked: the confidence stop cuts proposals exactly where the draft's own probability falls below the
threshold and the draft cache stays right afterwards (greedy output equals plain decoding); the alpha
estimator counts rejections, not untested tokens; gamma follows alpha and c and never exceeds the cap;
sampling with both keeps the target's law (the statistical check of tests/test_losslessness.py).
"""

from __future__ import annotations

import pytest
import torch

from tests.test_ngram import assert_draft_cache_is_fresh_prefill
from tests.test_losslessness import N, Verdict, chi_square_pvalue, exact_law, noise_floor, sample_engine, tv
from verispec.engine import GenerationParams, generate
from verispec.proposers.adaptive import AdaptiveGammaProposer
from verispec.proposers.base import Outcome
from verispec.proposers.draft_model import DraftModelProposer
from verispec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
MAX_NEW = 40
PROMPTS = [[1, 5, 9, 2], [3, 3, 7, 1, 8, 2, 6], [4]]


@pytest.fixture(scope="module")
def plain(wide_target) -> dict[tuple[int, ...], list[int]]:
    params = GenerationParams(max_new_tokens=MAX_NEW, sampling=GREEDY)
    return {tuple(p): generate(wide_target, p, params).token_ids for p in PROMPTS}


def draft_probs(draft, tokens: list[int]) -> torch.Tensor:
    """The draft's next-token distribution after `tokens`, by a fresh prefill."""
    cache = draft.new_cache(len(tokens) + 1)
    logits = draft.forward(torch.tensor([tokens]), cache, last_n=1)[0, -1].float()
    return torch.softmax(logits, -1)


@pytest.mark.parametrize("confidence", [0.0, 0.5, 0.9, 1.0])
def test_confidence_stop_cuts_where_the_draft_is_unsure(wide_draft, confidence):
    prompt = PROMPTS[1]
    proposer = DraftModelProposer(wide_draft, 64, confidence=confidence)
    proposer.reset([0], [prompt])
    tokens = proposer.propose([0], [6], [GREEDY], [torch.Generator()])[0].tokens.tolist()
    probs = [float(draft_probs(wide_draft, prompt + tokens[:i])[t]) for i, t in enumerate(tokens)]
    # every token but the last was drafted with probability >= confidence; the last is below it, or gamma was hit
    assert all(p >= confidence for p in probs[:-1]), probs
    assert len(tokens) == 6 or probs[-1] < confidence, probs
    if confidence == 1.0:
        assert len(tokens) == 1  # no token of a random model is certain


@pytest.mark.parametrize("confidence", [0.3, 0.6])
@pytest.mark.parametrize("gamma", [2, 5])
def test_greedy_equals_plain(wide_target, wide_draft, plain, confidence, gamma):
    for prompt, expected in plain.items():
        proposer = AdaptiveGammaProposer(DraftModelProposer(wide_draft, 128, confidence=confidence))
        res = generate(wide_target, list(prompt), GenerationParams(max_new_tokens=MAX_NEW, gamma=gamma,
                                                                   sampling=GREEDY), proposer)
        assert res.token_ids == expected, (prompt, confidence, gamma)
        assert all(1 <= g <= gamma for g in proposer.gammas)
        assert res.metrics.accepted > 0, prompt


def test_alpha_counts_rejections_not_untested_tokens(wide_draft):
    proposer = AdaptiveGammaProposer(DraftModelProposer(wide_draft, 64), decay=1.0, prior_weight=1e-9)
    proposer.reset([0], [[1, 2, 3]])
    for accepted in (4, 1, 0, 3):  # gamma 4: rounds with 4 (no rejection), 1, 0 and 3 accepted
        proposer.rows[0].asked = 4
        proposer.draft.fed[0] = 0
        proposer.observe(0, Outcome(accepted, [7] * (accepted + 1)))
    # 8 accepted, 3 rejections -> 8/11; accepted/drafted would say 8/16
    assert proposer.alpha(0) == pytest.approx(8 / 11)


@pytest.mark.parametrize("alpha, c, expected", [(0.95, 0.05, 8), (0.3, 0.5, 1), (0.8, 0.2, 4)])
def test_gamma_follows_alpha_and_c_under_the_cap(wide_draft, alpha, c, expected):
    proposer = AdaptiveGammaProposer(DraftModelProposer(wide_draft, 64, confidence=0.0), prior_alpha=alpha,
                                     prior_weight=1e6, prior_c=c, decay=1.0)
    proposer.reset([0], [[1, 2, 3]])
    proposal = proposer.propose([0], [8], [GREEDY], [torch.Generator()])[0]
    assert proposer.gammas == [expected] and proposal.tokens.numel() == expected


@pytest.mark.parametrize("temperature, gamma, confidence, seed_base", [
    (1.0, 3, 0.3, 51_000_000), pytest.param(0.7, 4, 0.5, 52_000_000, marks=pytest.mark.slow),
])
def test_sampling_matches_exact_law(tiny_target, tiny_draft, temperature, gamma, confidence, seed_base):
    sampling = SamplingParams(temperature=temperature)
    made: list[AdaptiveGammaProposer] = []

    def make(max_len: int, rows: int) -> AdaptiveGammaProposer:
        made.append(AdaptiveGammaProposer(DraftModelProposer(tiny_draft, max_len, confidence=confidence, rows=rows)))
        return made[-1]

    law = exact_law(tiny_target, sampling)
    run = sample_engine(tiny_target, None, sampling, gamma, seed_base, make_proposer=make)
    verdict = Verdict(tv(run.counts, law), noise_floor(law, N, seed=12345), chi_square_pvalue(run.counts, law),
                      run.alpha)
    lengths = [g for m in made for g in m.gammas]
    print(f"\n[adaptive] T={temperature} cap={gamma} conf={confidence}: {verdict}; gammas {sorted(set(lengths))}")
    assert verdict.alpha is not None and 0.05 < verdict.alpha < 0.95, verdict
    assert verdict.passes, verdict


class CheckedAdaptive(AdaptiveGammaProposer):
    """After every round the draft's cache must be a fresh prefill of the text, however short the proposal was."""

    def reset(self, rows, prompts, target=None, hidden=None) -> None:
        super().reset(rows, prompts, target)
        self.text, self.checked, self.short = list(prompts[0]), 0, 0

    def propose(self, rows, gammas, sampling, generators, shapes=None):
        proposals = super().propose(rows, gammas, sampling, generators)
        self.short += proposals[0].tokens.numel() < self.gammas[-1]
        return proposals

    def observe(self, row, outcome) -> None:
        super().observe(row, outcome)
        self.text += outcome.emitted
        assert_draft_cache_is_fresh_prefill(self.draft, self.text, row)
        self.checked += 1


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)], ids=["greedy", "T1"])
def test_draft_cache_stays_fresh_after_short_proposals(wide_target, wide_draft, sampling):
    checked = short = 0
    for i, prompt in enumerate(PROMPTS):
        proposer = CheckedAdaptive(DraftModelProposer(wide_draft, 128, confidence=0.6), prior_c=0.01)
        res = generate(wide_target, prompt, GenerationParams(max_new_tokens=MAX_NEW, gamma=5, sampling=sampling,
                                                             seed=i), proposer)
        assert proposer.text == prompt + res.token_ids
        checked, short = checked + proposer.checked, short + proposer.short
    assert checked > 20 and short > 5  # rounds cut short by the confidence stop happened and were checked


# ---- pausing: gamma 0 (a plain step) where drafting does not pay, with probes ---------------------------------------
def test_pause_chooses_plain_steps_probes_and_resumes(wide_draft):
    """No gamma pays at alpha ~0.01 with c 0.5: plain steps, but every probe_every-th paused round proposes one
    token; once alpha is high again drafting resumes at once. Without pause=True gamma never drops to 0."""
    from verispec.theory import interpolate_cost

    cost = interpolate_cost([(1, 1.0), (2, 1.15), (5, 1.6)])
    proposer = AdaptiveGammaProposer(DraftModelProposer(wide_draft, 64), pause=True, probe_every=3,
                                     verify_cost=cost, prior_alpha=0.01, prior_weight=1e6, prior_c=0.5, decay=1.0)
    proposer.reset([0], [[1, 2, 3]])
    assert [proposer._choose(0, 4) for _ in range(8)] == [0, 0, 0, 1, 0, 0, 0, 1]
    e = proposer.rows[0]
    for accepted, wait in ((0, 6), (0, 12), (0, 24), (0, 24), (1, 3)):  # rejected probes back off, up to 8 x 3
        e.asked = 1
        proposer.draft.fed[0] = 0
        proposer.observe(0, Outcome(accepted, [7] * (accepted + 1)))
        assert e.wait == wait
        assert [proposer._choose(0, 4) for _ in range(wait + 1)] == [0] * wait + [1]
    e.accepted, e.rejected = 50.0, 1.0  # the text turned predictable
    assert proposer._choose(0, 4) == 4 and e.paused == 0
    steady = AdaptiveGammaProposer(DraftModelProposer(wide_draft, 64), verify_cost=cost, prior_alpha=0.01,
                                   prior_weight=1e6, prior_c=0.5, decay=1.0)
    steady.reset([0], [[1, 2, 3]])
    assert steady._choose(0, 4) == 1


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)], ids=["greedy", "T1"])
def test_paused_rounds_keep_output_and_draft_cache_exact(wide_target, wide_draft, plain, sampling):
    """Plain steps queue the emitted tokens for the draft's next (catch-up) forward: after every round the draft's
    cache is a fresh prefill of the text, and greedy output equals plain decoding."""
    for i, prompt in enumerate(PROMPTS):
        proposer = CheckedAdaptive(DraftModelProposer(wide_draft, 128), pause=True, probe_every=2,
                                   prior_alpha=0.01, prior_weight=1e6, prior_c=0.5, decay=1.0)
        res = generate(wide_target, prompt, GenerationParams(max_new_tokens=MAX_NEW, gamma=4, sampling=sampling,
                                                             seed=i), proposer)
        assert proposer.text == prompt + res.token_ids
        assert 0 in proposer.gammas and 1 in proposer.gammas, proposer.gammas
        if sampling.greedy:
            assert res.token_ids == plain[tuple(prompt)]


def test_paused_sampling_matches_exact_law(tiny_target, tiny_draft):
    """The law of the first W tokens when rounds alternate between plain steps and 1-token probes (T = 1)."""
    sampling = SamplingParams(temperature=1.0)
    made: list[AdaptiveGammaProposer] = []

    def make(max_len: int, rows: int) -> AdaptiveGammaProposer:
        made.append(AdaptiveGammaProposer(DraftModelProposer(tiny_draft, max_len, rows=rows), pause=True, probe_every=1,
                                          prior_alpha=0.01, prior_weight=1e6, prior_c=0.5, decay=1.0))
        return made[-1]

    law = exact_law(tiny_target, sampling)
    run = sample_engine(tiny_target, None, sampling, 3, 53_000_000, make_proposer=make)
    verdict = Verdict(tv(run.counts, law), noise_floor(law, N, seed=12345), chi_square_pvalue(run.counts, law),
                      run.alpha)
    lengths = {g for m in made for g in m.gammas}
    print(f"\n[adaptive, paused] T=1: {verdict}; gammas {sorted(lengths)}")
    assert lengths == {0, 1}
    assert verdict.passes, verdict


def test_untimed_c_makes_seeded_runs_repeat(wide_target, wide_draft, monkeypatch):
    """With measure_c=False (what `auto` uses) the draft lengths depend on acceptance alone: however the clock
    reads, a seeded sampled run chooses the same lengths and draws the same tokens."""
    import random

    import verispec.proposers.adaptive as adaptive_module

    def run(clock_seed: int):
        clock = random.Random(clock_seed)
        monkeypatch.setattr(adaptive_module.time, "perf_counter", lambda: clock.random() * 100)
        proposer = AdaptiveGammaProposer(DraftModelProposer(wide_draft, 128), pause=True, probe_every=2,
                                         prior_c=0.3, measure_c=False)
        res = generate(wide_target, PROMPTS[1], GenerationParams(max_new_tokens=MAX_NEW, gamma=4, seed=5,
                                                                 sampling=SamplingParams(temperature=1.0)), proposer)
        return res.token_ids, proposer.gammas

    first, second = run(1), run(2)
    assert first == second
    assert len(set(first[1])) > 1  # the lengths did vary with acceptance


def test_round_prices_follow_the_device():
    """`auto` and `tree` price a draft forward by the bytes it streams on a CPU and by the blocks it runs
    elsewhere (a GPU's eager forward is bound by kernel launches), each with that device's verification curve."""
    from types import SimpleNamespace

    from tests.conftest import tiny_config
    from verispec.defaults import default_verify_cost
    from verispec.models import triton_attention
    from verispec.models.llama import LlamaModel
    from verispec.strategies import _prices

    def pair(device: str) -> tuple[SimpleNamespace, SimpleNamespace]:
        with torch.device(device):
            target = LlamaModel(tiny_config(vocab_size=32, hidden=64, layers=4))
            draft = LlamaModel(tiny_config(vocab_size=32, hidden=32, layers=3))
        return SimpleNamespace(model=target), SimpleNamespace(model=draft)

    c_cpu, cost_cpu = _prices(*pair("cpu"))
    c_gpu, cost_gpu = _prices(*pair("meta"))  # any device but the CPU
    assert c_gpu == 3 / 4
    assert c_cpu < 0.5  # a quarter of the bytes a block, and the draft's embedding and head are half as wide
    # each device's curve (a GPU's depends on whether Triton attends a forward's queries in one launch)
    assert cost_cpu(9) == pytest.approx(dict(default_verify_cost("cpu"))[9])
    assert cost_gpu(16) == pytest.approx(dict(default_verify_cost("cuda"))[16])
    assert cost_gpu(16) == pytest.approx(1.3 if triton_attention.available() else 3.56)
