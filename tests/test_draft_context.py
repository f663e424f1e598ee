"""A draft model that reads only the start and the tail of a long prompt (--draft-context): its prefill is
bounded, its guesses may get worse, and the output stays the target's, greedy and sampled."""

from __future__ import annotations

import pytest
import torch

from tests.test_losslessness import N, Verdict, chi_square_pvalue, exact_law, noise_floor, sample_engine, tv
from verispec.engine import GenerationParams, generate
from verispec.proposers.draft_model import SINKS, DraftModelProposer, draft_context
from verispec.proposers.tree import TreeDraftProposer
from verispec.sampling import SamplingParams
from verispec.theory import TreeShape

LONG = [4, 4, 1, 2, 5, 0, 3, 3, 1, 4, 2, 5]  # 12 tokens: with context 3 the draft reads 4 + 3 of its first 11


def test_draft_context_keeps_the_sinks_and_the_tail():
    assert draft_context(list(range(20)), 5) == [0, 1, 2, 3, 15, 16, 17, 18, 19]
    assert draft_context(list(range(9)), 5) == list(range(9))  # no longer than sinks + window: all of it
    assert draft_context(list(range(20)), None) == list(range(20))
    with pytest.raises(ValueError, match="context"):
        DraftModelProposer(torch.nn.Module(), 64, vocab_size=6, context=0)  # type: ignore[arg-type]


def test_the_draft_reads_only_its_window(tiny_target, tiny_draft):
    """After reset the draft's cache holds sinks + window tokens, and its first proposal is what a draft that
    was given exactly those tokens proposes (so the window, not the whole prompt, is what it read)."""
    windowed = DraftModelProposer(tiny_draft, 64, context=3)
    windowed.reset([0], [LONG])
    assert windowed.cache.length(0) == SINKS + 3
    short = DraftModelProposer(tiny_draft, 64)
    short.reset([0], [draft_context(LONG[:-1], 3) + LONG[-1:]])
    greedy, gen = [SamplingParams(temperature=0.0)], [torch.Generator().manual_seed(0)]
    first = [p.propose([0], [4], greedy, gen)[0].tokens.tolist() for p in (windowed, short)]
    assert first[0] == first[1]
    whole = DraftModelProposer(tiny_draft, 64)
    whole.reset([0], [LONG])
    assert whole.cache.length(0) == len(LONG) - 1


def test_the_tree_draft_reads_only_its_window(tiny_draft):
    """The tree strategy's draft windows the prompt as the chain's does: its cache holds sinks + window, and its
    first tree is the one a draft given exactly those tokens drafts."""
    shape = TreeShape.from_paths([(0,), (1,), (0, 0)])
    windowed = TreeDraftProposer(tiny_draft, 64, shape=shape, context=3)
    windowed.reset([0], [LONG])
    assert windowed.cache.length(0) == SINKS + 3
    short = TreeDraftProposer(tiny_draft, 64, shape=shape)
    short.reset([0], [draft_context(LONG[:-1], 3) + LONG[-1:]])
    greedy, gen = [SamplingParams(temperature=0.0)], [torch.Generator().manual_seed(0)]
    trees = [p.propose([0], [3], greedy, gen)[0] for p in (windowed, short)]
    assert trees[0].tokens.tolist() == trees[1].tokens.tolist() and trees[0].parents.tolist() == [-1, -1, 0]
    with pytest.raises(ValueError, match="context"):
        TreeDraftProposer(tiny_draft, 64, context=0)


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_output_equals_plain_decoding(tiny_target, tiny_draft, gamma):
    params = GenerationParams(max_new_tokens=30, gamma=gamma)
    for prompt in (LONG, LONG[:6], [3] + LONG):
        plain = generate(tiny_target, prompt, params).token_ids
        for proposer in (DraftModelProposer(tiny_draft, len(prompt) + 40, context=2),
                         TreeDraftProposer(tiny_draft, len(prompt) + 40, context=2)):
            out = generate(tiny_target, prompt, params, proposer)
            assert out.token_ids == plain
            assert out.metrics.drafted > 0


def test_sampled_law_is_the_targets(tiny_target, tiny_draft):
    sampling = SamplingParams(temperature=1.0)
    law = exact_law(tiny_target, sampling, prompt=LONG)
    run = sample_engine(tiny_target, tiny_draft, sampling, 3, 71_000_000, prompt=LONG,
                        make_proposer=lambda max_len, rows: DraftModelProposer(tiny_draft, max_len, context=2,
                                                                                  rows=rows))
    verdict = Verdict(tv(run.counts, law), noise_floor(law, N, seed=12345), chi_square_pvalue(run.counts, law),
                      run.alpha)
    print(f"\n[draft context 2 of {len(LONG) - 1}] {verdict}")
    assert verdict.alpha is not None and 0.05 < verdict.alpha < 0.95 and verdict.passes, verdict


def test_strategies_read_the_default_context_and_zero_reads_all(tiny_target, tiny_draft):
    """Every draft-model strategy gets the default window (verispec.defaults); --draft-context 0 is the whole
    prompt and N another window."""
    from pathlib import Path

    from verispec.defaults import DEFAULT_DRAFT_CONTEXT
    from verispec.models.load import LoadedModel
    from verispec.strategies import StrategyOptions, make_proposer

    target, draft = LoadedModel(tiny_target, None, Path("/t"), "t"), LoadedModel(tiny_draft, None, Path("/d"), "d")

    def context(name: str, options: StrategyOptions) -> int | None:
        proposer = make_proposer(name, target, draft, 64, options)
        while not isinstance(proposer, (DraftModelProposer, TreeDraftProposer)):  # the mixes wrap the draft's
            proposer = proposer.draft
        return proposer.context

    assert DEFAULT_DRAFT_CONTEXT is not None
    for name in ("draft", "adaptive", "draft+ngram", "auto", "tree", "tree+ngram"):
        assert context(name, StrategyOptions()) == DEFAULT_DRAFT_CONTEXT
        assert context(name, StrategyOptions(draft_context=0)) is None
        assert context(name, StrategyOptions(draft_context=9)) == 9


def test_each_draft_strategy_has_its_confidence_stop_and_the_flag_overrides_it(tiny_target, tiny_draft):
    from pathlib import Path

    from verispec.models.load import LoadedModel
    from verispec.strategies import ADAPTIVE_CONFIDENCE, AUTO_CONFIDENCE, StrategyOptions, make_proposer

    target, draft = LoadedModel(tiny_target, None, Path("/t"), "t"), LoadedModel(tiny_draft, None, Path("/d"), "d")

    def confidence(name: str, options: StrategyOptions) -> float:
        proposer = make_proposer(name, target, draft, 64, options)
        while not isinstance(proposer, DraftModelProposer):
            proposer = proposer.draft
        return proposer.confidence

    defaults = {"draft": 0.0, "draft+ngram": 0.0, "adaptive": ADAPTIVE_CONFIDENCE, "auto": AUTO_CONFIDENCE}
    assert AUTO_CONFIDENCE == 0.5
    for name, want in defaults.items():
        assert confidence(name, StrategyOptions()) == want
        assert confidence(name, StrategyOptions(draft_confidence=0.0)) == 0.0
        assert confidence(name, StrategyOptions(draft_confidence=0.8)) == 0.8


def test_the_defaults_examples_hold():
    """verispec.defaults documents each default with examples (the announce line, the window per kernel build): they
    must say what the code does."""
    import doctest

    import verispec.defaults

    failed, tried = doctest.testmod(verispec.defaults)
    assert tried >= 10 and failed == 0
