"""The transformers adapter and the int8 draft, each held to the same greedy identity as the native path."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import tiny_config
from tests.tiny_hf import make_tiny_hf_dir
from verispec.engine import GenerationParams, generate
from verispec.models.hf import HFCausalLM
from verispec.models.llama import LlamaModel
from verispec.models.quant import Int8Linear, quantize_int8
from verispec.proposers.draft_model import DraftModelProposer

PROMPTS = [[7], [7, 8, 9, 10], [20, 21, 7, 7, 8, 9, 11, 12, 13]]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    target = make_tiny_hf_dir(root / "t", seed=0)
    return target, make_tiny_hf_dir(root / "d", seed=1, noise_from=target)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_hf_adapter_speculative_equals_native_plain(dirs, prompt):
    target_dir, draft_dir = dirs
    native = LlamaModel.from_hf_dir(target_dir, dtype=torch.float32)
    hf_target = HFCausalLM.from_dir(target_dir, dtype=torch.float32)
    hf_draft = HFCausalLM.from_dir(draft_dir, dtype=torch.float32)
    params = GenerationParams(max_new_tokens=30, gamma=3)
    plain = generate(native, prompt, params)
    spec = generate(hf_target, prompt, params, DraftModelProposer(hf_draft, 64))
    assert spec.token_ids == plain.token_ids
    # The adapter's own logits agree with the native model's through several commit/rollback rounds.
    assert generate(hf_target, prompt, params).token_ids == plain.token_ids


def test_hf_cache_rollback_matches_fresh_prefill(dirs):
    target_dir, _ = dirs
    model = HFCausalLM.from_dir(target_dir, dtype=torch.float32)
    ids = [7, 8, 9, 10, 11]
    cache = model.new_cache(32)
    model.forward(torch.tensor([ids]), cache)
    cache.commit(3)  # keep 7 8 9; 10 11 were scratch
    after = model.forward(torch.tensor([[12]]), cache)[0, -1]
    fresh = model.forward(torch.tensor([[7, 8, 9, 12]]), model.new_cache(32))[0, -1]
    torch.testing.assert_close(after, fresh, atol=1e-5, rtol=1e-5)


def test_int8_linear_is_close_to_the_float_layer():
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48, bias=True)
    q = Int8Linear(layer)
    x = torch.randn(5, 64)
    ref = layer(x)
    out = q(x).float()
    # per-channel int8: error bounded by half a quantisation step per weight, summed over the inputs
    step = layer.weight.abs().amax(1) / 127
    bound = 0.5 * step * x.abs().sum(-1, keepdim=True) + 0.05 * ref.abs() + 0.05
    assert (out - ref).abs().le(bound).all()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_int8_draft_keeps_greedy_output_identical(prompt):
    target = LlamaModel.random(tiny_config(vocab_size=32), seed=0, std=0.3)
    draft = quantize_int8(copy.deepcopy(target).to(torch.bfloat16))
    params = GenerationParams(max_new_tokens=30, gamma=4)
    plain = generate(target, prompt, params)
    spec = generate(target, prompt, params, DraftModelProposer(draft, 64))
    assert spec.token_ids == plain.token_ids
    assert spec.metrics.alpha > 0.5  # an int8 copy of the target mostly agrees with it
