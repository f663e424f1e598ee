"""Llama 3's rope scaling: the per-frequency divisors (transformers' rope_type llama3, llama.cpp's rope_freqs
tensor) in the native model, from a transformers config and from a GGUF, against transformers' own model at
positions past the original context, where the scaling matters (dropping it is the control that must fail)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from tests.test_gguf_convert import _write_gguf
from verispec.models.gguf_convert import convert_gguf
from verispec.models.llama import LlamaConfig, LlamaModel, llama3_freq_factors

SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 32}


def _hf_llama3(seed: int = 0):
    from transformers import LlamaConfig as HFConfig, LlamaForCausalLM

    from tests.test_gguf_convert import VOCAB

    cfg = HFConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=500000.0,
                   rope_scaling=dict(SCALING), tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    return model


def _factors() -> tuple[float, ...]:
    return llama3_freq_factors(16, 500000.0, 8.0, 1.0, 4.0, 32)


def test_factors_equal_transformers_llama3_frequencies():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](_hf_llama3().config, torch.device("cpu"))
    base = 1.0 / (500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))
    ours = base / torch.tensor(_factors(), dtype=torch.float64)
    assert torch.allclose(ours, inv_freq.double(), rtol=1e-6)
    assert min(_factors()) == 1.0 and max(_factors()) == 8.0  # both ends and a blend in between


@pytest.fixture(scope="module")
def reference():
    model = _hf_llama3()
    tokens = torch.randint(0, 280, (1, 200), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model, tokens, model(tokens).logits[0]


def _native(path) -> LlamaModel:
    return LlamaModel.from_hf_dir(path, dtype=torch.float32)


def _logits(model: LlamaModel, tokens: torch.Tensor) -> torch.Tensor:
    return model.forward(tokens, model.new_cache(tokens.shape[1] + 1))[0]


def test_native_model_from_a_transformers_config(reference, tmp_path):
    hf, tokens, want = reference
    hf.save_pretrained(tmp_path)
    native = _native(tmp_path)
    assert native.cfg.rope_freq_factors == pytest.approx(_factors())
    assert (_logits(native, tokens) - want).abs().max() < 1e-4
    plain = LlamaModel(dataclasses.replace(native.cfg, rope_freq_factors=None))  # the control: no scaling
    plain.load_state_dict(native.state_dict(), strict=False)
    plain.init_rope()
    assert (_logits(plain, tokens) - want).abs().max() > 1e-2


def test_native_model_from_a_gguf_with_rope_freqs(reference, tmp_path):
    hf, tokens, want = reference
    path = tmp_path / "llama3.gguf"
    expected = _write_gguf(path, hf, "llama", extra={"rope_freqs.weight": np.array(_factors(), dtype=np.float32)})
    out = convert_gguf(path, cache=tmp_path / "cache", dtype=torch.float32, progress=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_freq_factors"] == pytest.approx(_factors())
    native = _native(out)
    ref = hf.__class__(hf.config).eval()  # transformers with the GGUF's (Q8_0 round-tripped) weights
    ref.load_state_dict(expected, strict=False)
    with torch.no_grad():
        want_q = ref(tokens).logits[0]
    assert (_logits(native, tokens) - want_q).abs().max() < 1e-3


def test_other_rope_scalings_are_refused():
    cfg = {"model_type": "llama", "vocab_size": 8, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 2, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(ValueError, match="'yarn' is not supported"):
        LlamaConfig.from_hf(cfg)


def test_llama3_greedy_speculation_equals_plain_decoding(reference, tmp_path):
    """Speculation on a Llama 3 model (rope scaled as above) past its original context of 32 positions: every
    strategy that needs no second model, and a draft model (a noisy copy), give plain decoding's greedy tokens on
    3 prompts. (No Llama 3 weights are on the package index: the real-weight families are tested in
    tests/test_model_families.py.)"""
    from tests.conftest import noisy_copy
    from verispec.engine import GenerationParams, generate
    from verispec.proposers.draft_model import DraftModelProposer
    from verispec.proposers.layerskip import LayerSkipProposer
    from verispec.proposers.lookahead import LookaheadProposer
    from verispec.proposers.ngram import NgramProposer

    hf, tokens, _ = reference
    hf.save_pretrained(tmp_path)
    model = _native(tmp_path)
    assert model.cfg.rope_freq_factors is not None
    draft = noisy_copy(model, 0.05, seed=3)
    prompts = [tokens[0, :30].tolist(), tokens[0, 40:90].tolist(), (tokens[0, :8].tolist() * 5)]
    accepted = 0
    for prompt in prompts:
        params = GenerationParams(max_new_tokens=40, gamma=4)
        plain = generate(model, prompt, params).token_ids
        for proposer in (NgramProposer(3, 1), LookaheadProposer(), LayerSkipProposer(model, 1),
                         DraftModelProposer(draft, len(prompt) + 60)):
            got = generate(model, prompt, params, proposer)
            assert got.token_ids == plain, (type(proposer).__name__, prompt[:4])
            accepted += got.metrics.accepted
    assert accepted > 20
