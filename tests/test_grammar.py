"""Structured output under speculation: a grammar mask on the target at every verified position (with the drafts
before it, a tree node's ancestors) and on the proposer's drafts.

A small hand-written automaton (`NoRepeat`: no token twice in a row, one token banned first) drives the engine on
the tiny models: greedy identity with plain constrained decoding for draft-model chains, trees and n-gram
proposals, every output valid, and the sampled law against enumeration; the broken control (each position masked
as if no draft preceded it) must fail both. llguidance (regex) runs on the word-level tiny tokenizer here; the
real pair's JSON schemas are checked by benchmarks/structured_output.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.test_losslessness import T07_P09, T1, check
from tests.test_penalties import PROMPTS, shaped_proposers
from tests.tiny_hf import make_tiny_hf_dir
from verispec import engine
from verispec.engine import GenerationParams, generate
from verispec.grammar import GrammarCompiler, GrammarSpec, mask_logits
from verispec.proposers.draft_model import DraftModelProposer
from verispec.sampling import SamplingParams



class NoRepeat:
    """A grammar over token ids: never the same token twice in a row, and `first` never first."""

    def __init__(self, vocab: int, first: int, strict: bool = True) -> None:
        self.vocab, self.first, self.out, self.strict = vocab, first, [], strict

    def allowed(self, path: list[int]) -> torch.Tensor | None:
        ctx = self.out + path
        if any(a == b for a, b in zip(ctx, ctx[1:])):
            return None
        ok = torch.ones(self.vocab, dtype=torch.bool)
        ok[ctx[-1] if ctx else self.first] = False
        return ok

    def advance(self, tokens: list[int]) -> None:
        assert not self.strict or self.allowed(tokens) is not None, (self.out, tokens)
        self.out += tokens


def valid(out: list[int], first: int) -> bool:
    return (not out or out[0] != first) and all(a != b for a, b in zip(out, out[1:]))


def test_mask_logits():
    x = mask_logits(torch.zeros(4), torch.tensor([True, False, True, False]))
    assert x.tolist() == [0.0, float("-inf"), 0.0, float("-inf")]
    with pytest.raises(ValueError, match="allows no next token"):
        mask_logits(torch.zeros(4), torch.zeros(4, dtype=torch.bool))


# ---- greedy identity ------------------------------------------------------------------------------------------
def _greedy_mismatches(target, draft, vocab: int) -> tuple[list[str], int]:
    bad, accepted = [], 0
    for prompt in PROMPTS:
        first = prompt[-1]
        params = GenerationParams(max_new_tokens=24)
        plain = generate(target, prompt, params, constraint=NoRepeat(vocab, first)).token_ids
        assert valid(plain, first), plain
        for name, gamma, make in shaped_proposers(draft):
            try:
                got = generate(target, prompt, GenerationParams(max_new_tokens=24, gamma=gamma), make(),
                               constraint=NoRepeat(vocab, first))
            except AssertionError:  # the grammar saw an emitted token it forbids
                bad.append(f"{name} {prompt}: invalid")
                continue
            accepted += got.metrics.accepted
            if got.token_ids != plain or not valid(got.token_ids, first):
                bad.append(f"{name} {prompt}")
    return bad, accepted


def test_greedy_under_a_grammar_equals_plain_decoding(wide_target, wide_draft):
    free = [generate(wide_target, p, GenerationParams(max_new_tokens=24)).token_ids for p in PROMPTS]
    assert not all(valid(out, p[-1]) for out, p in zip(free, PROMPTS))  # the grammar has something to forbid
    bad, accepted = _greedy_mismatches(wide_target, wide_draft, wide_target.vocab_size)
    assert not bad, bad
    assert accepted > 20


def test_masking_without_the_drafts_is_caught(wide_target, wide_draft, monkeypatch):
    monkeypatch.setattr(engine, "draft_paths", lambda draft, parents: [[]] * (len(draft) + 1))
    bad, _ = _greedy_mismatches(wide_target, wide_draft, wide_target.vocab_size)
    assert bad


class HighEveryOther:
    """A grammar that allows only ids >= `low` at every other position: ids a draft with a truncated head lacks."""

    def __init__(self, vocab: int, low: int) -> None:
        self.vocab, self.low, self.out = vocab, low, []

    def allowed(self, path: list[int]) -> torch.Tensor:
        ok = torch.ones(self.vocab, dtype=torch.bool)
        if len(self.out + path) % 2 == 1:
            ok[: self.low] = False
        return ok

    def advance(self, tokens: list[int]) -> None:
        self.out += tokens


@pytest.mark.parametrize("sampling", [SamplingParams(), T1], ids=["greedy", "T1"])
def test_a_draft_whose_head_lacks_every_allowed_id_stops_its_proposal(wide_target, wide_draft, sampling):
    """Where the grammar allows only ids past a truncated draft head, the draft proposes what it has so far and
    speculation goes on (it raised there, and the row decoded target-only for the rest of the request)."""
    import copy

    from verispec.models.quant import truncate_head

    vocab = wide_target.vocab_size
    draft = truncate_head(copy.deepcopy(wide_draft), vocab - 16)
    for prompt in PROMPTS:
        params = GenerationParams(max_new_tokens=24, sampling=sampling, seed=7)
        plain = generate(wide_target, prompt, params, constraint=HighEveryOther(vocab, vocab - 16))
        got = generate(wide_target, prompt, GenerationParams(**{**params.__dict__, "gamma": 4}),
                       DraftModelProposer(draft, 64, vocab_size=vocab), constraint=HighEveryOther(vocab, vocab - 16))
        assert got.finish_reason == "length" and all(t >= vocab - 16 for t in got.token_ids[1::2])
        assert got.metrics.drafted > 0 and got.metrics.accepted > 0
        if sampling.greedy:
            assert got.token_ids == plain.token_ids


# ---- the sampled law ------------------------------------------------------------------------------------------
def _no_repeat():  # one function object: check() caches the law by it
    return NoRepeat(6, 1)


@pytest.mark.parametrize("sampling,seed", [(T1, 51_000_000),
                                           pytest.param(T07_P09, 52_000_000, marks=pytest.mark.slow)],
                         ids=["T1", "T0.7-p0.9"])
def test_sampled_law_under_a_grammar(tiny_target, tiny_draft, sampling, seed):
    verdict = check(tiny_target, tiny_draft, sampling, 3, seed, label="grammar", constraint=_no_repeat)
    assert verdict.alpha is not None and verdict.alpha > 0.2, verdict
    assert verdict.passes, verdict


def _lax_no_repeat():  # the same grammar, letting the broken engine's invalid outputs through to be counted
    return NoRepeat(6, 1, strict=False)


@pytest.mark.slow  # the greedy control runs by default
def test_sampled_law_detects_masking_without_the_drafts(tiny_target, tiny_draft, monkeypatch):
    monkeypatch.setattr(engine, "draft_paths", lambda draft, parents: [[]] * (len(draft) + 1))
    verdict = check(tiny_target, tiny_draft, T1, 3, 51_000_000, label="grammar, drafts ignored",
                    constraint=_lax_no_repeat)
    assert not verdict.passes, verdict


# ---- llguidance -----------------------------------------------------------------------------------------------
llguidance = pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from verispec.models.load import load

    root = tmp_path_factory.mktemp("grammar")
    target = make_tiny_hf_dir(root / "target", seed=0)
    draft = make_tiny_hf_dir(root / "draft", seed=0, noise_from=target)
    return load(str(target), dtype="float32", progress=False), load(str(draft), dtype="float32", progress=False)


REGEX = r"(x|y|a)(\+(x|y|1|2)){2,6}"


def test_regex_output_is_valid_and_equal_to_plain(tiny_pair):
    import re

    target, draft = tiny_pair
    tok = target.tokenizer
    compiler = GrammarCompiler(tok, target.model.vocab_size, tok.eos_ids)
    spec = GrammarSpec("regex", REGEX)
    for text in ("x ( a ) :", "if x = 1 :", "for a in b :"):
        prompt = tok.encode(text)
        for sampling in (SamplingParams(), SamplingParams(temperature=1.0)):
            params = GenerationParams(max_new_tokens=40, sampling=sampling, seed=3, eos_ids=tok.eos_ids)
            plain = generate(target.model, prompt, params, constraint=compiler.constraint(spec))
            spec_run = generate(target.model, prompt, GenerationParams(**{**params.__dict__, "gamma": 3}),
                                DraftModelProposer(draft.model, 64), constraint=compiler.constraint(spec))
            for run in (plain, spec_run):
                words = "".join(tok.token_text(t) for t in run.token_ids)
                assert run.finish_reason == "eos" and re.fullmatch(REGEX, words), (words, run.finish_reason)
            if sampling.greedy:
                assert spec_run.token_ids == plain.token_ids


def test_bad_grammars_are_one_line_errors(tiny_pair):
    target, _ = tiny_pair
    compiler = GrammarCompiler(target.tokenizer, target.model.vocab_size, target.tokenizer.eos_ids)
    with pytest.raises(ValueError, match="not valid JSON"):
        compiler.constraint(GrammarSpec("json_schema", "{"))
    with pytest.raises(ValueError, match="invalid regex"):
        compiler.constraint(GrammarSpec("regex", "(x"))
