"""Lookahead decoding: the Jacobi window rides along in the verification forward without touching the chain.

What is checked: the model's `positions=` / `tree_mask=` give every branch the logits of its own sequence run
alone; the window's layout is the paper's 2-D mask (each window token sees a contiguous causal context); the extra
tokens leave the chain's logits unchanged; one round's window logits and Jacobi step agree with fresh prefills;
the pool keeps the most recent continuations; greedy output equals plain decoding (with pool hits); sampling keeps
the target's law (the statistical check of tests/test_losslessness.py).
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch

from tests.conftest import fresh_logits
from tests.test_layerskip import lossless_verdict
from tests.test_losslessness import PROMPT
from verispec import strategies
from verispec.engine import GenerationParams, extra_layout, generate
from verispec.models.llama import LlamaModel
from verispec.models.load import LoadedModel
from verispec.proposers.base import PerRow
from verispec.proposers.lookahead import LookaheadProposer, window_layout
from verispec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def wide64(wide_target) -> LlamaModel:
    return copy.deepcopy(wide_target).to(torch.float64)


def prefilled(model: LlamaModel, prefix: list[int], room: int = 64):
    cache = model.new_cache(len(prefix) + room)
    if prefix:
        model.forward(torch.tensor([prefix]), cache)
        cache.commit(len(prefix))
    return cache


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    tol = 1e-10 if a.dtype == torch.float64 else 1e-5 * max(1.0, b.abs().max().item())
    return (a - b).abs().max().item() < tol


# ---- model level: parallel branches in one forward ----------------------------------------------------------------
@pytest.mark.parametrize("prefix", [[], [5, 9, 2]], ids=["no-prefix", "prefix"])
def test_two_branches_get_the_logits_of_their_own_sequences(wide64, prefix):
    """[a, b1, b2, b3, c1, c2]: branch b at positions 1..3 and branch c at positions 1..2 both follow a, and
    neither sees the other. Each row equals a fresh prefill of its own sequence."""
    a, b, c = [7], [1, 2, 3], [4, 6]
    positions = torch.tensor([0, 1, 2, 3, 1, 2])
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[:4, :4] = torch.ones(4, 4, dtype=torch.bool).tril()  # a, b: causal
    mask[4:, 0] = True  # c sees a ...
    mask[4:, 4:] = torch.ones(2, 2, dtype=torch.bool).tril()  # ... and itself causally
    cache = prefilled(wide64, prefix)
    out = wide64.forward(torch.tensor([a + b + c]), cache, positions=positions, tree_mask=mask)[0]  # [6, V]
    assert close(out[:4], fresh_logits(wide64, prefix + a + b)[-4:])
    assert close(out[4:], fresh_logits(wide64, prefix + a + c)[-2:])
    # A branch is not just ignored: c's logits differ from what the same tokens give after b.
    assert not close(out[4:], fresh_logits(wide64, prefix + a + b + c)[-2:])


def test_tree_forward_float32_matches_within_rounding(wide_target):
    prefix, a, b, c = [5, 9, 2], [7], [1, 2], [4]
    cache = prefilled(wide_target, prefix)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]], dtype=torch.bool)
    out = wide_target.forward(torch.tensor([a + b + c]), cache, positions=torch.tensor([0, 1, 2, 1]), tree_mask=mask)[0]
    assert close(out[:3], fresh_logits(wide_target, prefix + a + b)[-3:])
    assert close(out[3], fresh_logits(wide_target, prefix + a + c)[-1])


# ---- the window's layout ----------------------------------------------------------------------------------------
def test_window_layout_worked_example():
    """W = 3, N = 3, chain of 2: the module docstring's picture."""
    tokens, positions, mask = window_layout([[10, 11, 12], [20, 21, 22]], chain_len=2)
    assert tokens.tolist() == [10, 11, 12, 20, 21, 22]
    assert positions.tolist() == [1, 2, 3, 2, 3, 4]
    # columns: pending, chain x2, a0 a1 a2 b0 b1 b2
    expected = [
        [1, 0, 0, 1, 0, 0, 0, 0, 0],  # a0 at 1
        [1, 0, 0, 1, 1, 0, 0, 0, 0],  # a1 at 2
        [1, 0, 0, 1, 1, 1, 0, 0, 0],  # a2 at 3
        [1, 0, 0, 1, 0, 0, 1, 0, 0],  # b0 at 2: pending, a0, b0
        [1, 0, 0, 1, 1, 0, 0, 1, 0],  # b1 at 3: pending, a0, a1, b1
        [1, 0, 0, 1, 1, 1, 0, 0, 1],  # b2 at 4
    ]
    assert mask.int().tolist() == expected


@pytest.mark.parametrize("width,ngram,chain_len", [(1, 2, 0), (5, 3, 2), (4, 5, 1), (7, 4, 3)])
def test_every_window_token_sees_a_contiguous_causal_context(width, ngram, chain_len):
    levels = [[100 * l + c for c in range(width)] for l in range(ngram - 1)]
    tokens, positions, mask = window_layout(levels, chain_len)
    e = (ngram - 1) * width
    assert tokens.shape == positions.shape == (e,) and mask.shape == (e, 1 + chain_len + e)
    assert not mask[:, 1 : 1 + chain_len].any()  # the chain is invisible to the window
    for i in range(e):
        seen = [0] + positions[mask[i, 1 + chain_len :]].tolist()  # pending sits at 0
        assert sorted(seen) == list(range(int(positions[i]) + 1)), (i, seen)
        assert mask[i, 1 + chain_len + i]  # itself


# ---- the verification forward with the window ---------------------------------------------------------------------
def round_forward(model, prefix: list[int], pending: int, proposal):
    """The engine's verification forward of one round (its own `extra_layout`), on a cache holding `prefix`."""
    chain = [pending] + proposal.tokens.tolist()
    g = len(chain) - 1
    cache = prefilled(model, prefix)
    x = torch.tensor([chain + proposal.extra.tolist()])
    tree = extra_layout(g, proposal)
    out = model.forward(x, cache, positions=tree.positions, tree_mask=tree.mask)[0]
    plain = model.forward(torch.tensor([chain]), prefilled(model, prefix))[0]
    return out[: g + 1], out[g + 1 :], plain


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("width,ngram", [(5, 3), (3, 4), (6, 2)])
def test_extra_tokens_do_not_change_the_chain(wide_target, dtype, width, ngram):
    model = copy.deepcopy(wide_target).to(dtype)
    proposer = LookaheadProposer(width, ngram, 3)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    proposer.reset(prompt)
    proposer.pool[prompt[-1]] = [tuple(range(10, 10 + ngram - 1))]
    proposal = proposer.propose(4, GREEDY, torch.Generator())
    assert proposal.tokens.numel() == min(4, ngram - 1) and proposal.extra.numel() == width * (ngram - 1)
    chain_logits, _, plain = round_forward(model, prompt[:-1], prompt[-1], proposal)
    assert close(chain_logits, plain)


def test_window_logits_and_jacobi_step_match_fresh_prefills(wide64):
    """Each window token's logits are those of a fresh prefill of its context (text, then the window tokens at
    positions 1 .. its own); observe() turns the last level's argmaxes into the new last level and harvests each
    column's N-gram."""
    width, ngram = 4, 3
    proposer = LookaheadProposer(width, ngram, 5)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    proposer.reset(prompt)
    proposer.age = [ngram - 2] * width  # mature columns: this step harvests
    proposer.pool[prompt[-1]] = [(8, 8)]
    levels = [list(level) for level in proposer.levels]
    proposal = proposer.propose(2, GREEDY, torch.Generator())
    _, extra_logits, _ = round_forward(wide64, prompt[:-1], prompt[-1], proposal)
    for l in range(ngram - 1):
        for c in range(width):
            context = prompt + levels[0][: c + 1] + [levels[k][c] for k in range(1, l + 1)]
            assert close(extra_logits[l * width + c], fresh_logits(wide64, context)[-1]), (l, c)
    guesses = extra_logits.argmax(-1).view(ngram - 1, width)[-1].tolist()
    proposer.observe(0, [11], extra_logits=extra_logits)  # one token emitted: no realignment
    assert proposer.levels == levels[1:] + [guesses]
    assert proposer.seq == prompt + [11]
    for c in range(width):
        assert (levels[1][c], guesses[c]) in proposer.pool[levels[0][c]]


def test_pool_keeps_most_recent_first_capped():
    proposer = LookaheadProposer(window=2, ngram=3, max_candidates=2)
    proposer.reset([1, 2, 3])
    for cont in [(1, 1), (2, 2), (1, 1), (3, 3)]:
        proposer._add(7, cont)
    assert proposer.pool[7] == [(3, 3), (1, 1)]
    assert proposer.propose(1, GREEDY, torch.Generator()).tokens.tolist() == []  # nothing for pending 3
    proposer.seq.append(7)
    assert proposer.propose(1, GREEDY, torch.Generator()).tokens.tolist() == [3]  # at most gamma tokens
    assert proposer.propose(5, GREEDY, torch.Generator()).tokens.tolist() == [3, 3]  # at most N - 1


def test_window_realigns_after_several_tokens():
    """k tokens emitted after a Jacobi step: the first k-1 columns are dropped, the rest keep their absolute
    positions, fresh columns (age 0) are appended; without a step, k columns go."""
    proposer = LookaheadProposer(window=4, ngram=3, max_candidates=2)
    proposer.reset([5] * 8)
    proposer.levels = [[10, 11, 12, 13], [20, 21, 22, 23]]
    proposer.age = [3, 3, 3, 3]
    proposal = proposer.propose(2, GREEDY, torch.Generator())
    logits = torch.zeros(8, 40)
    logits[torch.arange(8), torch.tensor([0, 0, 0, 0, 30, 31, 32, 33])] = 1.0
    proposer.observe(2, [1, 2, 3], extra_logits=logits)  # 3 tokens emitted
    assert proposal.extra.numel() == 8
    assert [level[:2] for level in proposer.levels] == [[22, 23], [32, 33]]
    assert all(t in proposer.seq for t in proposer.levels[0][2:]) and proposer.age == [4, 4, 0, 0]
    proposer.propose(2, GREEDY, torch.Generator())
    proposer.observe(0, [4])  # no window logits (e.g. it did not fit): the window moves by one column
    assert [level[:1] for level in proposer.levels] == [[23], [33]] and proposer.age == [4, 0, 0, 0]


# ---- greedy identity ------------------------------------------------------------------------------------------
def repetitive_prompts(vocab: int, count: int = 10, seed: int = 0) -> list[list[int]]:
    """Random prompts, half of them repeating a short motif (the kind of text whose n-grams recur)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        if i % 2:
            motif = [rng.randrange(vocab) for _ in range(rng.randint(2, 4))]
            out.append((motif * 6)[: rng.randint(6, 20)])
        else:
            out.append([rng.randrange(vocab) for _ in range(rng.randint(1, 20))])
    return out


@pytest.fixture(scope="module")
def plain_outputs(wide_target):
    params = GenerationParams(max_new_tokens=32, sampling=GREEDY)
    return {tuple(p): generate(wide_target, p, params).token_ids for p in repetitive_prompts(wide_target.vocab_size)}


@pytest.mark.parametrize("width,ngram,candidates,gamma", [(5, 3, 5, 4), (4, 2, 3, 1), (3, 4, 2, 3), (7, 5, 7, 6)])
def test_greedy_equals_plain(wide_target, plain_outputs, width, ngram, candidates, gamma):
    accepted = drafted = 0
    for prompt, expected in plain_outputs.items():
        params = GenerationParams(max_new_tokens=32, gamma=gamma, sampling=GREEDY)
        res = generate(wide_target, list(prompt), params, LookaheadProposer(width, ngram, candidates))
        assert res.token_ids == expected, (prompt, width, ngram)
        accepted += res.metrics.accepted
        drafted += res.metrics.drafted
    print(f"\nlookahead greedy W={width} N={ngram} G={candidates} γ={gamma}: accepted {accepted} of {drafted}")
    assert accepted > 0 and drafted > accepted  # pool hits, and misses


class CountingLookahead(LookaheadProposer):
    """Counts the rounds whose target forward ran the window (its logits came back) and those that left it out."""

    def reset(self, prompt):
        super().reset(prompt)
        self.with_window = self.without_window = 0

    def observe(self, num_accepted, emitted, extra_logits=None):
        if extra_logits is None:
            self.without_window += 1
        else:
            self.with_window += 1
        super().observe(num_accepted, emitted, extra_logits)


def test_window_is_dropped_when_the_cache_has_no_room(wide_target):
    """The engine sizes its cache for the chain; near the end of a request the window does not fit and the round
    runs without it (never a CacheFullError), with unchanged output."""
    prompt = [1, 2, 3, 1, 2]
    params = GenerationParams(max_new_tokens=12, gamma=4, sampling=GREEDY)
    proposer = CountingLookahead(5, 3, 5)
    res = generate(wide_target, prompt, params, proposer)
    plain = generate(wide_target, prompt, GenerationParams(max_new_tokens=12, sampling=GREEDY))
    assert res.token_ids == plain.token_ids
    assert proposer.with_window > 0 and proposer.without_window > 0


# ---- statistical losslessness -------------------------------------------------------------------------------------
def greedy_continuation(model: LlamaModel, context: list[int], n: int) -> tuple[int, ...]:
    out: list[int] = []
    for _ in range(n):
        out.append(int(fresh_logits(model, context + out)[-1].argmax()))
    return tuple(out)


class SeededLookahead(LookaheadProposer):
    """Lookahead whose pool starts with a plausible continuation for every token (the target's greedy one after
    PROMPT[:-1] + [token]), so that the very first rounds -- the law compared is of the first 3 tokens -- verify
    chains that are sometimes accepted, while the window runs and harvests as usual."""

    def __init__(self, seeds: dict[int, tuple[int, ...]], *args) -> None:
        super().__init__(*args)
        self.seeds = seeds

    def reset(self, prompt: list[int]) -> None:
        super().reset(prompt)
        self.pool = {v: [cont] for v, cont in self.seeds.items()}


@pytest.mark.parametrize("temperature,seed_base", [(1.0, 31_000_000), (0.7, 32_000_000)])
def test_sampling_matches_exact_law(tiny_target, temperature, seed_base):
    """gamma 2, W 3, N 3: every round verifies a chain of up to 2 tokens next to a 6-token window. Generating 16
    tokens keeps the engine's cache roomy enough for the window in the rounds that decide the first 3 tokens."""
    seeds = {v: greedy_continuation(tiny_target, PROMPT[:-1] + [v], 2) for v in range(tiny_target.vocab_size)}
    make = lambda max_len, rows: PerRow(lambda: SeededLookahead(seeds, 3, 3, 3))  # noqa: E731
    verdict = lossless_verdict(tiny_target, make, SamplingParams(temperature=temperature), 2, seed_base,
                               max_new=16)
    assert verdict.alpha is not None and 0.1 < verdict.alpha < 0.9, verdict
    assert verdict.passes, verdict


def test_losslessness_check_sees_a_chain_that_sees_the_window(tiny_target, monkeypatch):
    """Power: if the engine let the chain attend to the window (the one way extras could change the law), the same
    check rejects the sample."""
    import verispec.engine as engine

    def leaky_layout(g, proposal):
        tree = extra_layout(g, proposal)
        tree.mask[1 : g + 1, g + 1 :] = True  # drafts see the window; pending (row 0) still does not
        return tree

    monkeypatch.setattr(engine, "extra_layout", leaky_layout)
    seeds = {v: greedy_continuation(tiny_target, PROMPT[:-1] + [v], 2) for v in range(tiny_target.vocab_size)}
    verdict = lossless_verdict(tiny_target, lambda max_len, rows: PerRow(lambda: SeededLookahead(seeds, 3, 3, 3)),
                               SamplingParams(temperature=1.0), 2, 31_000_000, max_new=16)
    assert not verdict.passes, verdict


# ---- strategy -----------------------------------------------------------------------------------------------------
def test_strategy_builds_from_options_and_refuses_non_native(wide_target):
    target = LoadedModel(model=wide_target, tokenizer=None, path=Path("/m"), name="tiny")
    assert strategies.get("lookahead").needs_draft is False
    options = strategies.StrategyOptions(lookahead_window=7, lookahead_ngram=4, lookahead_candidates=2)
    proposer = strategies.make_proposer("lookahead", target, None, 64, options).factory()  # one per sequence
    assert (proposer.width, proposer.ngram, proposer.max_candidates) == (7, 4, 2)
    with pytest.raises(ValueError, match="native"):
        strategies.make_proposer("lookahead", LoadedModel(object(), None, Path("/m"), "hf"), None, 64)
    with pytest.raises(ValueError, match="ngram >= 2"):
        LookaheadProposer(5, 1, 5)
