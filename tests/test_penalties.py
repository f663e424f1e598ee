"""Penalties, logit_bias and logprobs under speculation.

Penalties make the target's law depend on the output so far, so a verification forward must penalize each of
its positions with the context that position would have had: the output plus the drafts before it (a tree
node's ancestors). Checked by hand-computed cases of the pure function, greedy identity with plain decoding
(chain, tree and n-gram proposals) with a broken control that must fail (penalizing every position with the
committed output only), and the sampled law against enumeration, with the same broken control.
Logprobs: the target's own, equal between speculative and plain decoding and to a fresh prefill's.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import fresh_logits
from tests.test_losslessness import T1, check
from verispec import engine
from verispec.engine import GenerationParams, generate
from verispec.proposers.draft_model import DraftModelProposer
from verispec.proposers.ngram import NgramProposer
from verispec.proposers.tree import TreeDraftProposer
from verispec.sampling import Penalties, SamplingParams, draft_paths, penalize, token_logprobs
from verispec.theory import TreeShape

PEN = Penalties(repetition=1.3, frequency=0.4, presence=0.2, logit_bias=((3, 1.5),))
# strong enough on the vocab-6 model that a position penalized without its drafts has a visibly different law
# (inside the 3 tokens compared, only the third is verified after a draft: the first round is a plain step)
LAW_PEN = Penalties(frequency=3.0, presence=1.0, logit_bias=((2, 0.7),))
PROMPTS = ([3, 1, 4, 1, 5], [7] * 6, [2, 9, 11, 30, 5, 5, 1])


# ---- the pure function ------------------------------------------------------------------------------------------
def test_penalize_worked_example():
    """The docstring's example: output [7], drafts (5, 7), frequency 0.5."""
    x = penalize(torch.zeros(3, 8), [1], [7], draft_paths([5, 7], None), Penalties(frequency=0.5))
    assert x[:, 7].tolist() == [-0.5, -0.5, -1.0]
    assert x[:, 5].tolist() == [0.0, -0.5, -0.5]
    assert x[:, [0, 1, 2, 3, 4, 6]].abs().sum() == 0  # the prompt's token 1 is not penalized by frequency


def test_penalize_repetition_presence_and_bias():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0]])
    # seen: 0 (prompt), 1 (output, twice); presence counts the output only, once
    x = penalize(logits, [0], [1, 1], [[]], Penalties(repetition=2.0, presence=0.25, logit_bias=((4, -3.0),)))
    assert x[0].tolist() == [1.0, -4.0 - 0.25, 2.0, -2.0, -2.0]
    assert torch.equal(penalize(logits, [0], [1], [[]], Penalties()), logits)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        penalize(logits, [], [], [[]], Penalties(logit_bias=((5, 1.0),)))
    for bad in (dict(repetition=0.0), dict(frequency=float("nan")), dict(logit_bias=((-1, 1.0),))):
        with pytest.raises(ValueError):
            Penalties(**bad)


def test_draft_paths_of_a_tree():
    # nodes a, b under pending, c under a: rows pending, a, b, c
    assert draft_paths([10, 11, 12], [-1, -1, 0]) == [[], [10], [11], [10, 12]]
    assert draft_paths([10, 11], None) == [[], [10], [10, 11]]


# ---- greedy identity --------------------------------------------------------------------------------------------
def shaped_proposers(draft):
    """(name, gamma, factory) of proposers that draw from shaped logits (chain, tree) or copy (n-gram)."""
    yield "draft g1", 1, lambda: DraftModelProposer(draft, 64)
    yield "draft g4", 4, lambda: DraftModelProposer(draft, 64)
    yield "tree", 4, lambda: TreeDraftProposer(draft, 64, shape=TreeShape.from_paths([(0,), (1,), (0, 0), (1, 0)]))
    yield "ngram", 4, lambda: NgramProposer(3, 1)


def _greedy_mismatches(target, draft, penalties: Penalties) -> tuple[list[str], int]:
    bad, accepted = [], 0
    for prompt in PROMPTS:
        plain = generate(target, prompt, GenerationParams(max_new_tokens=24, penalties=penalties)).token_ids
        for name, gamma, make in shaped_proposers(draft):
            got = generate(target, prompt, GenerationParams(max_new_tokens=24, gamma=gamma, penalties=penalties),
                           make())
            accepted += got.metrics.accepted
            if got.token_ids != plain:
                bad.append(f"{name} {prompt}")
    return bad, accepted


def test_greedy_with_penalties_equals_plain_decoding(wide_target, wide_draft):
    unpenalized = [generate(wide_target, p, GenerationParams(max_new_tokens=24)).token_ids for p in PROMPTS]
    penalized = [generate(wide_target, p, GenerationParams(max_new_tokens=24, penalties=PEN)).token_ids
                 for p in PROMPTS]
    assert unpenalized != penalized  # the penalties change the text, so the comparison below has something to see
    bad, accepted = _greedy_mismatches(wide_target, wide_draft, PEN)
    assert not bad, bad
    assert accepted > 20  # drafts were kept, so positions after them were penalized with them


def test_penalizing_without_the_drafts_is_caught(wide_target, wide_draft, monkeypatch):
    """Control: every position penalized with the committed output only (the drafts before it ignored)."""
    monkeypatch.setattr(engine, "draft_paths", lambda draft, parents: [[]] * (len(draft) + 1))
    bad, _ = _greedy_mismatches(wide_target, wide_draft, PEN)
    assert bad


def test_a_bad_logit_bias_fails_its_row_alone(wide_target, wide_draft):
    params = GenerationParams(max_new_tokens=8, gamma=3, penalties=Penalties(logit_bias=((10_000, 1.0),)))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(wide_target, [3, 1, 4], params, DraftModelProposer(wide_draft, 64))


# ---- the sampled law --------------------------------------------------------------------------------------------
def test_sampled_law_with_penalties(tiny_target, tiny_draft):
    verdict = check(tiny_target, tiny_draft, T1, 3, 41_000_000, label="penalties", penalties=LAW_PEN)
    assert verdict.alpha is not None and verdict.alpha > 0.2, verdict
    assert verdict.passes, verdict


@pytest.mark.slow  # the greedy control runs by default
def test_sampled_law_detects_penalties_without_the_drafts(tiny_target, tiny_draft, monkeypatch):
    monkeypatch.setattr(engine, "draft_paths", lambda draft, parents: [[]] * (len(draft) + 1))
    verdict = check(tiny_target, tiny_draft, T1, 3, 41_000_000, label="penalties, drafts ignored",
                    penalties=LAW_PEN)
    assert not verdict.passes, verdict


# ---- logprobs ---------------------------------------------------------------------------------------------------
def _reference(target, prompt: list[int], out: list[int], top: int):
    """Each token's logprob from a fresh prefill of prompt + the tokens before it."""
    logits = fresh_logits(target, prompt + out)[len(prompt) - 1 : len(prompt) - 1 + len(out)]
    return token_logprobs(logits, out, top)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8)], ids=["greedy", "T0.8"])
def test_logprobs_are_the_targets(wide_target, wide_draft, sampling):
    for prompt in PROMPTS:
        plain = generate(wide_target, prompt, GenerationParams(max_new_tokens=16, sampling=sampling, seed=5,
                                                               logprobs=3))
        spec = generate(wide_target, prompt, GenerationParams(max_new_tokens=16, gamma=4, sampling=sampling, seed=5,
                                                              logprobs=3), DraftModelProposer(wide_draft, 64))
        assert spec.metrics.accepted > 0
        for run in (plain, spec):
            assert [lp.token for lp in run.logprobs] == run.token_ids
            ref = _reference(wide_target, prompt, run.token_ids, 3)
            for got, want in zip(run.logprobs, ref):
                # a fresh prefill rounds float32 apart from the cached steps (seen: 1.2e-5 on a logprob of -4.2)
                assert abs(got.logprob - want.logprob) < 5e-5, (got.logprob, want.logprob)
                assert [t for t, _ in got.top] == [t for t, _ in want.top]
                assert max(abs(a - b) for (_, a), (_, b) in zip(got.top, want.top)) < 5e-5, (got.top, want.top)
        if sampling.greedy:
            assert spec.token_ids == plain.token_ids
            assert max(abs(a.logprob - b.logprob) for a, b in zip(spec.logprobs, plain.logprobs)) < 1e-5
