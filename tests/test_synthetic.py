"""Synthetic acceptance: lossless like any proposer, and its acceptance rate is the one asked for."""

from __future__ import annotations

import pytest
import torch

from verispec.engine import GenerationParams, generate
from verispec.models.llama import LlamaConfig, LlamaModel
from verispec.proposers.draft_model import DraftModelProposer
from verispec.proposers.synthetic import SyntheticProposer
from verispec.sampling import SamplingParams

CFG = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


@pytest.fixture(scope="module")
def models():
    return LlamaModel.random(CFG, seed=0, std=0.3), LlamaModel.random(CFG, seed=1, std=0.3)


@pytest.mark.parametrize("error_rate", [0.0, 0.3, 1.0])
def test_output_equals_plain_and_acceptance_matches(models, error_rate):
    target, draft = models
    prompt = [5, 17, 3, 44, 8]
    params = GenerationParams(max_new_tokens=300, gamma=4)
    plain = generate(target, prompt, params).token_ids
    inner = DraftModelProposer(draft, 400)
    spec = generate(target, prompt, params, SyntheticProposer(inner, plain, error_rate, CFG.vocab_size, seed=3,
                                                              prompt_len=len(prompt)))
    assert spec.token_ids == plain
    m = spec.metrics
    assert m.draft_forwards > 0  # the inner draft's cost was paid
    # Per-position acceptance given the earlier drafts were accepted is 1 - error_rate.
    first = m.accepted_per_position[0] / m.drafted_per_position[0]
    if error_rate in (0.0, 1.0):
        assert first == 1.0 - error_rate
    else:
        assert abs(first - 0.7) < 0.12  # ~100 rounds: 3 standard errors is ~0.14
        cond = [m.accepted_per_position[i] / max(m.accepted_per_position[i - 1], 1) for i in range(1, 4)]
        assert all(abs(c - 0.7) < 0.25 for c in cond)


def test_sampled_decoding_is_refused(models):
    target, _ = models
    proposer = SyntheticProposer(None, [1, 2, 3], 0.1, CFG.vocab_size)
    params = GenerationParams(max_new_tokens=5, sampling=SamplingParams(temperature=0.7), seed=0)
    with pytest.raises(ValueError, match="greedy"):
        generate(target, [1, 2], params, proposer)
    with pytest.raises(ValueError, match="error rate"):
        SyntheticProposer(None, [], 1.5, CFG.vocab_size)
