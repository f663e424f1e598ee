"""Layer-skip self-speculation: q = the target's first ℓ layers, drafting in the target's own KV cache.

What is checked: `forward(layers=ℓ)` is a truly truncated model; greedy output equals plain decoding for several
ℓ and γ (with real rejections); every draft is the truncated model's prediction from a *fresh* prefill (so the
shared cache never hands the draft stale slots); after generation the target cache equals a fresh prefill in
every layer; sampling keeps the target's law (the statistical check of tests/test_losslessness.py); the strategy
refuses non-native models; calibration measures, picks, saves and loads.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from pathlib import Path

import pytest
import torch

from tests.conftest import fresh_logits, tiny_config
from tests.test_losslessness import Verdict, check
from verispec import strategies
from verispec.calibrate import calibrate
from verispec.engine import GenerationParams, generate
from verispec.models.llama import LlamaModel
from verispec.models.load import LoadedModel
from verispec.proposers.layerskip import (
    LayerSkipProposer, default_candidates, load_calibration, model_id, save_calibration,
)
from verispec.sampling import SamplingParams, logits_to_probs

GREEDY = SamplingParams(temperature=0.0)
MAX_NEW = 24


@pytest.fixture(scope="module")
def deep_target() -> LlamaModel:
    """4 layers, vocab 32: greedy alpha ~0.2 (ℓ=1) .. ~0.6 (ℓ=3, γ=1), so rounds both accept and reject."""
    return LlamaModel.random(tiny_config(vocab_size=32, layers=4, max_pos=256), seed=11, std=0.3)


@pytest.fixture(scope="module")
def deep_target64(deep_target) -> LlamaModel:
    return copy.deepcopy(deep_target).to(torch.float64)


def prompts(vocab: int, count: int = 12, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 2, 20] + [rng.randint(1, 20) for _ in range(count - 3)]
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def truncated(model: LlamaModel, layers: int) -> LlamaModel:
    """A separate model made of the first `layers` blocks, the final norm and the LM head."""
    small = LlamaModel(dataclasses.replace(model.cfg, num_hidden_layers=layers))
    state = {k: v for k, v in model.state_dict().items()
             if not k.startswith("layers.") or int(k.split(".")[1]) < layers}
    small.load_state_dict(state)
    return small.to(model.dtype).eval()


def shallow_logits(model: LlamaModel, tokens: list[int], layers: int) -> torch.Tensor:
    cache = model.new_cache(len(tokens) + 1)
    return model.forward(torch.tensor([tokens]), cache, layers=layers)[0]  # [T, V]


# ---- model level ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layers", [1, 2, 3, 4])
def test_forward_layers_equals_truncated_model(deep_target64, layers):
    """Prefill then one decoding step, through the cache: `layers=ℓ` of the full model == an ℓ-layer model."""
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    small = truncated(deep_target64, layers)
    full_cache, small_cache = deep_target64.new_cache(16), small.new_cache(16)
    a = deep_target64.forward(torch.tensor([tokens]), full_cache, layers=layers)[0]
    b = small.forward(torch.tensor([tokens]), small_cache)[0]
    assert torch.allclose(a, b, atol=1e-10, rtol=0)
    full_cache.commit(len(tokens))
    small_cache.commit(len(tokens))
    a = deep_target64.forward(torch.tensor([[7]]), full_cache, layers=layers, last_n=1)[0, -1]
    b = small.forward(torch.tensor([[7]]), small_cache, last_n=1)[0, -1]
    assert torch.allclose(a, b, atol=1e-10, rtol=0)
    if layers < 4:  # and it is really a different model from the full one
        assert not torch.allclose(a, fresh_logits(deep_target64, tokens + [7])[-1], atol=1e-3)


def test_shallow_forward_writes_only_its_layers(deep_target64):
    cache = deep_target64.new_cache(8)
    deep_target64.forward(torch.tensor([[1, 2, 3]]), cache, layers=2)
    assert cache.k[:2, :, :, :3].abs().sum() > 0 and cache.k[2:].abs().sum() == 0
    assert cache.length == 0


# ---- greedy identity --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plain_outputs(deep_target):
    params = GenerationParams(max_new_tokens=MAX_NEW, sampling=GREEDY)
    return {tuple(p): generate(deep_target, p, params).token_ids for p in prompts(deep_target.vocab_size)}


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_equals_plain(deep_target, plain_outputs, layers, gamma):
    accepted = drafted = 0
    for prompt, expected in plain_outputs.items():
        params = GenerationParams(max_new_tokens=MAX_NEW, gamma=gamma, sampling=GREEDY)
        res = generate(deep_target, list(prompt), params, LayerSkipProposer(deep_target, layers))
        assert res.token_ids == expected, (prompt, layers, gamma)
        accepted += res.metrics.accepted
        drafted += res.metrics.drafted
        assert res.metrics.draft_forwards > 0
    print(f"\nlayerskip greedy ℓ={layers} γ={gamma}: alpha={accepted / drafted:.3f}")
    assert 0 < accepted < drafted  # drafts were accepted and rejected: the shared cache was rolled back for real


class CheckedLayerSkip(LayerSkipProposer):
    """Checks every round against fresh prefills: each draft (and its q when sampling) is what the truncated model
    computes on the text so far, and propose() leaves cache.length as it found it."""

    def reset(self, rows, prompts, target=None, hidden=None) -> None:
        super().reset(rows, prompts, target)
        self.text = list(prompts[0])
        self.checked = self.cache_checks = 0

    def propose(self, rows, gammas, sampling, generators, shapes=None):
        length = self.target.length(rows[0])
        proposal = super().propose(rows, gammas, sampling, generators)[0]
        assert self.target.length(rows[0]) == length == len(self.text) - 1
        ctx = list(self.text)
        for i, d in enumerate(proposal.tokens.tolist()):
            ref = shallow_logits(self.model, ctx, self.layers)[-1]
            if sampling[0].greedy:
                assert d == int(ref.argmax()), "draft from a stale cache"
            else:
                assert torch.allclose(proposal.q[i], logits_to_probs(ref, sampling[0]), atol=1e-6)
            ctx.append(d)
            self.checked += 1
        return [proposal]

    def observe(self, row, outcome) -> None:
        super().observe(row, outcome)
        self.text += outcome.emitted
        # after the round's commit: the shared cache row holds the text but its pending token, in every layer
        assert_cache_is_fresh_prefill(self.model, self.target.cache, row, self.text)
        self.cache_checks += 1


def assert_cache_is_fresh_prefill(model: LlamaModel, cache, row: int, text: list[int]) -> None:
    """Row `row` of the BatchKVCache: the committed slots hold text[:-1] in every layer, exactly as a fresh
    prefill would, and the next logits match a fresh prefill of the whole text."""
    n = cache.lengths[row]
    assert n == len(text) - 1
    ref = model.new_cache(len(text) + 1)
    model.forward(torch.tensor([text[:-1]]), ref)
    assert torch.allclose(cache.k[:, row : row + 1, :, :n], ref.k[:, :, :, :n], atol=1e-9, rtol=0)
    assert torch.allclose(cache.v[:, row : row + 1, :, :n], ref.v[:, :, :, :n], atol=1e-9, rtol=0)
    nxt = model.forward(torch.tensor([text[-1:]]), cache.row(row), last_n=1)[0, -1]
    assert torch.allclose(nxt, fresh_logits(model, text)[-1], atol=1e-9, rtol=0)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)], ids=["greedy", "T1"])
@pytest.mark.parametrize("layers,gamma", [(1, 4), (2, 2), (3, 5)])
def test_drafts_and_target_cache_match_fresh_prefills(deep_target64, sampling, layers, gamma):
    checked = 0
    for i, prompt in enumerate(prompts(deep_target64.vocab_size, count=4, seed=layers)):
        proposer = CheckedLayerSkip(deep_target64, layers)
        params = GenerationParams(max_new_tokens=20, gamma=gamma, sampling=sampling, seed=i)
        res = generate(deep_target64, prompt, params, proposer)
        assert len(res.token_ids) == 20 and proposer.text == prompt + res.token_ids
        # the shared cache was checked after every round but the first (the proposer starts after it)
        assert proposer.cache_checks == res.metrics.rounds - 1
        checked += proposer.checked
    assert checked > 20


# ---- statistical losslessness -----------------------------------------------------------------------------------
def lossless_verdict(target, make_proposer, sampling, gamma, seed_base, max_new: int | None = None) -> Verdict:
    """The losslessness suite's verdict (TV against the measured noise floor, and chi-square) for any proposer
    (make_proposer(max_len, rows)) over tiny_target."""
    return check(target, None, sampling, gamma, seed_base, label="self-drafted", make_proposer=make_proposer,
                 max_new=max_new)


@pytest.mark.parametrize("temperature,gamma,seed_base", [(1.0, 3, 21_000_000),
                                                        pytest.param(0.7, 2, 22_000_000, marks=pytest.mark.slow)])
def test_sampling_matches_exact_law(tiny_target, temperature, gamma, seed_base):
    """tiny_target has 2 layers: ℓ = 1 drafts (alpha ~0.2-0.45 at these settings)."""
    verdict = lossless_verdict(tiny_target, lambda max_len, rows: LayerSkipProposer(tiny_target, 1),
                               SamplingParams(temperature=temperature), gamma, seed_base)
    assert verdict.alpha is not None and 0.1 < verdict.alpha < 0.9, verdict
    assert verdict.passes, verdict


# ---- strategy, errors -------------------------------------------------------------------------------------------
class NotNative:
    """Stands in for the Hugging Face adapter: a CausalLM without layer ranges."""

    vocab_size = 6


def loaded(model, path: str = "/models/tiny") -> LoadedModel:
    return LoadedModel(model=model, tokenizer=None, path=Path(path), name="tiny")


def test_non_native_model_is_refused():
    with pytest.raises(ValueError, match="native"):
        strategies.make_proposer("layerskip", loaded(NotNative()), None, 64)
    with pytest.raises(ValueError, match="native"):
        LayerSkipProposer(NotNative(), 1)


@pytest.mark.parametrize("layers", [0, 5, -1])
def test_layer_count_out_of_range(deep_target, layers):
    with pytest.raises(ValueError, match="1..4"):
        LayerSkipProposer(deep_target, layers)


def test_strategy_layers_from_option_calibration_or_half(deep_target, tmp_path, monkeypatch):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    target = loaded(deep_target, str(tmp_path / "model"))
    assert strategies.get("layerskip").needs_draft is False
    assert strategies.make_proposer("layerskip", target, None, 64).layers == 2  # no calibration: half
    save_calibration(None, model_id(target), {"best_layers": 3})
    assert strategies.make_proposer("layerskip", target, None, 64).layers == 3
    options = strategies.StrategyOptions(layerskip_layers=1)
    assert strategies.make_proposer("layerskip", target, None, 64, options).layers == 1


def test_calibration_file_roundtrip_and_corruption(tmp_path):
    path = tmp_path / "sub" / "cal.json"
    assert load_calibration(path, "a") is None
    save_calibration(path, "a", {"best_layers": 7})
    save_calibration(path, "b", {"best_layers": 9})
    assert load_calibration(path, "a") == {"best_layers": 7} and load_calibration(path, "b") == {"best_layers": 9}
    path.write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable"):
        assert load_calibration(path, "a") is None


def test_default_candidates():
    assert default_candidates(28) == [4, 7, 10, 14, 18, 21]
    assert default_candidates(2) == [1] and default_candidates(1) == [1]


def test_calibrate_measures_and_picks(deep_target):
    class Tok:
        eos_ids = ()

    target = LoadedModel(model=deep_target, tokenizer=Tok(), path=Path("/x"), name="tiny")
    lines: list[str] = []
    result = calibrate(target, prompts(32, count=3), [1, 3], gamma=3, max_new_tokens=8, log=lines.append)
    assert [r["layers"] for r in result["results"]] == [1, 3]
    best = max(result["results"], key=lambda r: r["tokens_per_s"])
    assert result["best_layers"] == best["layers"] and result["num_layers"] == 4
    assert all(0 <= r["alpha"] <= 1 and r["mean_accepted_length"] >= 1 and r["tokens_per_s"] > 0
               for r in result["results"])
    assert len(lines) == 3 and result["plain_tokens_per_s"] > 0
    with pytest.raises(ValueError, match="native"):
        calibrate(loaded(NotNative()), [[1]], [1])


# ---- the real target (GBs of weights) ---------------------------------------------------------------------------
@pytest.mark.slow
def test_real_target_greedy_identity_layerskip_and_lookahead():
    """Both training-free strategies reproduce plain greedy decoding on the real target, 48 tokens of code.

    ℓ = n - 4: on Qwen2.5-Coder-1.5B the first ℓ layers agree with the full model's argmax on ~80% of tokens at
    24 of 28 layers and almost never below 20, so this depth exercises both accepted and rejected drafts."""
    from verispec.models.load import load
    from verispec.models.packaged import DEFAULT_TARGET
    from verispec.proposers.lookahead import LookaheadProposer

    target = load(DEFAULT_TARGET, progress=False)
    tok = target.tokenizer
    prompt = tok.encode("def quicksort(arr):")
    params = GenerationParams(max_new_tokens=48, gamma=4, eos_ids=tok.eos_ids)
    plain = generate(target.model, prompt, params)
    n = target.model.cfg.num_hidden_layers
    for name, proposer in [("layerskip", LayerSkipProposer(target.model, n - 4)), ("lookahead", LookaheadProposer())]:
        spec = generate(target.model, prompt, params, proposer)
        assert spec.token_ids == plain.token_ids, (name, tok.decode(plain.token_ids), tok.decode(spec.token_ids))
        print(f"\n{name}: {spec.metrics.to_dict()}")
        assert 0 < spec.metrics.accepted < spec.metrics.drafted, name
