"""The transformers adapter and the quantized (int8, int4) models, each held to the same greedy identity as the
native path."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import tiny_config
from tests.tiny_hf import make_tiny_hf_dir
from verispec.engine import GenerationParams, generate
from verispec.models import kernels
from verispec.models.errors import ModelError
from verispec.models.hf import HFCausalLM
from verispec.models.llama import LlamaModel
from verispec.models.load import load
from verispec.models.quant import INT4_GROUP, Int4Linear, Int8Linear, RowInt8Linear, cache_file, quantize, quantize_int8
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


def test_int4_linear_matches_its_own_dequantized_weights():
    """The packed kernel computes x @ ((q - 8) * scale + zero)^T for the grid built from each group's min/max,
    and that grid is within half a step of the float weights."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(2 * INT4_GROUP, 48, bias=True)
    q = Int4Linear(layer)
    w = layer.weight.detach().reshape(48, 2, INT4_GROUP)
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    step = (hi - lo) / 15
    grid = (lo + ((w - lo) / step).round() * step).reshape(48, -1)
    assert (grid - layer.weight).abs().le(step.reshape(48, 2, 1).expand_as(w).reshape(48, -1) / 2 + 1e-6).all()
    x = torch.randn(5, 2 * INT4_GROUP)
    ref = x.bfloat16().float() @ grid.t() + layer.bias.detach()
    out = q(x).float()
    torch.testing.assert_close(out, ref, atol=0.02 + 0.02 * ref.abs().max().item(), rtol=0.02)
    # and a wrong zero point would be caught: shifting it moves the output far beyond that tolerance
    q.scales_and_zeros[..., 1] += 0.05
    assert (q(x).float() - ref).abs().max() > 0.1


def test_int4_falls_back_to_int8_where_the_kernel_cannot_go():
    model = quantize(LlamaModel.random(tiny_config(vocab_size=6), seed=0).to(torch.bfloat16), "int4")
    assert isinstance(model.lm_head, Int8Linear)  # 6 outputs: not a multiple of 16
    assert any(isinstance(m, Int4Linear) for m in model.modules())


@pytest.mark.parametrize("kind", ["int8", "int4", "w8a8"])
def test_quantized_target_speculative_equals_its_own_plain(kind, tmp_path):
    """A quantized target is a model of its own: speculation reproduces *its* greedy output, and the cached
    quantized weights load back to the same model. (Peaky weights, std 1.5: with bf16 activations a 5-token
    forward rounds differently from a 1-token one, which flips near-ties of flatter random models.)"""
    if kind == "w8a8" and kernels.w8a8_refusal():
        pytest.skip("w8a8 is refused on a CPU without AVX-512 VNNI (test_w8a8_is_refused_without_vnni)")
    target_dir = make_tiny_hf_dir(tmp_path / "t", seed=0, std=1.5)
    draft_dir = make_tiny_hf_dir(tmp_path / "d", seed=1, noise_from=target_dir)
    first = load(str(target_dir), dtype=kind, progress=False)
    assert (target_dir / cache_file(kind)).is_file()
    again = load(str(target_dir), dtype=kind, progress=False)  # from the cache file
    draft = load(str(draft_dir), dtype="int8", progress=False)
    params = GenerationParams(max_new_tokens=30, gamma=4)
    for prompt in PROMPTS:
        plain = generate(first.model, prompt, params)
        assert generate(again.model, prompt, params).token_ids == plain.token_ids
        spec = generate(first.model, prompt, params, DraftModelProposer(draft.model, 64))
        assert spec.token_ids == plain.token_ids
        assert spec.metrics.accepted > 0


def test_w8a8_rows_do_not_depend_on_the_rest_of_the_batch():
    """Per-token activation quantization through a per-batch kernel: each row is normalised first, so a token is
    quantized the same alone or beside others (later drafts must not change an earlier position's logits).
    Rows of very different ranges make a per-batch scale show. What is left is float rounding: fbgemm's
    epilogue rounds differently with the row count (33 of 200 random 5-row batches differed in the last bits),
    so w8a8 is close, not bit-exact; this batch happens to match to the bit. Without AVX-512 VNNI, fbgemm sums
    u8 x s8 pairs into saturating int16 and rows came out 17-22% off: w8a8 is refused there, and this skips."""
    if kernels.w8a8_refusal():
        pytest.skip("w8a8 needs AVX-512 VNNI (fbgemm's int16 sums saturate without it); refused on this CPU")
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48, bias=True)
    q = RowInt8Linear(layer)
    x = torch.randn(6, 64) * torch.tensor([0.01, 1.0, 30.0, 1.0, 5.0, 0.2])[:, None]
    x[3] += 4.0  # a row far from zero: the shift must be undone exactly
    together = q(x)
    alone = torch.cat([q(x[i : i + 1]) for i in range(6)])
    assert torch.equal(together, alone)
    ref = layer(x)
    rel = (together - ref).norm(dim=-1) / ref.norm(dim=-1)
    assert rel.max() < 0.03, rel  # 8-bit weights and 8-bit activations: ~1% error per row


def test_w8a8_is_refused_without_vnni(tmp_path, monkeypatch):
    """A CPU without AVX-512 VNNI (an AMD Zen 3, say) gets one line saying why and what to use instead, before
    any conversion starts; a w8a8 draft is refused alike, as the CLI loads drafts through load() too. Where VNNI
    is there, w8a8 loads."""
    path = make_tiny_hf_dir(tmp_path / "m", seed=0)
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw"}))
    with pytest.raises(ModelError) as refused:
        load(str(path), dtype="w8a8", progress=False)
    message = str(refused.value)
    assert "AVX-512 VNNI" in message and "avx512_vnni" in message and "w4a8" in message and "\n" not in message
    assert not (path / cache_file("w8a8")).exists()  # refused before quantizing
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c", "avx512_vnni"}))
    assert kernels.w8a8_refusal() is None
    assert any(isinstance(m, RowInt8Linear) for m in load(str(path), dtype="w8a8", progress=False).model.modules())


def test_w8a8_without_row_normalisation_would_depend_on_the_batch():
    """The check above has teeth: fbgemm's own per-batch activation scale does change a row's output."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48, bias=False)
    q = RowInt8Linear(layer)
    q.pack()
    x = torch.randn(2, 64) * torch.tensor([0.01, 30.0])[:, None]
    raw = lambda t: torch.ops.quantized.linear_dynamic(t, q._packed, False)  # noqa: E731
    assert not torch.equal(raw(x)[:1], raw(x[:1]))


# ---- a draft that proposes only the first ids (--draft-vocab) --------------------------------------------------
@pytest.mark.parametrize("kind,vocab,keep", [("float", 32, 20), ("int8", 32, 20), ("w8a8", 32, 20), ("w4a8-4bit", 96, 40),
                                             ("w4a8-4bit", 96, 48)])
def test_truncated_head_keeps_the_first_rows_of_the_logits(kind, vocab, keep):
    """The head computes only the rows it keeps (w4a8: whole blocks of 16, the last one partly used)."""
    from verispec.models.quant import W4A8Linear, truncate_head

    if kind.startswith("w4a8") and not kernels.available_isas():
        pytest.skip("the w4a8 kernel needs an x86 CPU with AVX2 (or AVX-512 VNNI)")
    model = LlamaModel.random(tiny_config(vocab_size=vocab), seed=0, std=0.3)
    if kind != "float":
        model = quantize(model.to(torch.bfloat16) if kind == "int8" else model, kind)
    x = torch.tensor([[3, 1, 4, 1, 5]])
    full = model.forward(x, model.new_cache(8))[0]
    truncate_head(model, keep)
    cut = model.forward(x, model.new_cache(8))[0]
    assert cut.shape[-1] == keep
    torch.testing.assert_close(cut, full[:, :keep], rtol=0, atol=0)
    if isinstance(model.lm_head, W4A8Linear):
        assert model.lm_head.weight.shape[0] == -(-keep // 16)  # the dropped blocks are not read


def test_truncated_draft_is_still_lossless(tiny_target, tiny_draft):
    """Sampling with a draft that can never propose ids 4 and 5 of 6 keeps the target's law (q is 0 there, so
    every such token comes from the residual); greedy output still equals plain decoding."""
    from tests.test_losslessness import N, Verdict, chi_square_pvalue, exact_law, noise_floor, sample_engine, tv
    from verispec.models.quant import truncate_head
    from verispec.sampling import SamplingParams

    draft = truncate_head(copy.deepcopy(tiny_draft), 4)
    sampling = SamplingParams(temperature=1.0)
    law = exact_law(tiny_target, sampling)
    run = sample_engine(tiny_target, draft, sampling, 3, 61_000_000)
    verdict = Verdict(tv(run.counts, law), noise_floor(law, N, seed=12345), chi_square_pvalue(run.counts, law),
                      run.alpha)
    print(f"\n[draft vocab 4 of 6] {verdict}")
    assert verdict.alpha is not None and 0.05 < verdict.alpha < 0.95 and verdict.passes, verdict
    first = law.reshape(law.shape[0], -1).sum(-1)  # the law of the first sampled token
    assert first[4:].sum() > 0.05  # ids the draft cannot propose do carry mass: the residual must supply them
    params = GenerationParams(max_new_tokens=20, gamma=3)
    for prompt in ([1], [2, 3, 4]):
        plain = generate(tiny_target, prompt, params)
        assert generate(tiny_target, prompt, params, DraftModelProposer(draft, 64)).token_ids == plain.token_ids


def test_memory_check_ignores_cached_quantized_copies(tmp_path, monkeypatch):
    """The quantized caches sit beside the model's weights; counting them refused a float32 load that fits
    (22.5 GiB 'needed' for a 3.5 GB model once four caches were there)."""
    import verispec.models.load as load_mod
    from verispec.models.errors import ModelError

    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    with open(tmp_path / "verispec-w4a8.safetensors", "wb") as f:
        f.truncate(10**6)  # sparse: a big cache file costs no disk
    monkeypatch.setattr(load_mod, "_available_bytes", lambda: 5000)
    load_mod._check_memory(tmp_path, {"torch_dtype": "bfloat16"}, torch.float32)  # 2000 bytes needed: fits
    monkeypatch.setattr(load_mod, "_available_bytes", lambda: 1500)
    with pytest.raises(ModelError, match="not enough memory"):
        load_mod._check_memory(tmp_path, {"torch_dtype": "bfloat16"}, torch.float32)


def test_auto_strategy_runs_over_the_transformers_adapter():
    """`auto` sizes its draft cost from the weights behind the adapter, and stays greedy-identical there."""
    from pathlib import Path

    import transformers

    from verispec import strategies
    from verispec.models.hf import HFCausalLM
    from verispec.models.load import LoadedModel

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    target, draft = HFCausalLM(transformers.LlamaForCausalLM(cfg)), HFCausalLM(transformers.LlamaForCausalLM(cfg))
    proposer = strategies.make_proposer("auto", LoadedModel(target, None, Path("/t"), "t"),
                                        LoadedModel(draft, None, Path("/d"), "d"), 64)
    assert proposer.draft.prior[2] == pytest.approx(1.0)  # c: the draft is the target's size
    plain = generate(target, [1, 2, 3], GenerationParams(max_new_tokens=8)).token_ids
    assert generate(target, [1, 2, 3], GenerationParams(max_new_tokens=8, gamma=3), proposer).token_ids == plain


def test_tree_strategy_refuses_the_transformers_adapter_with_one_line():
    """Trees need tree masks and path commits in both models: the adapter's models say so before any request."""
    from pathlib import Path

    import transformers

    from verispec import strategies
    from verispec.models.load import LoadedModel

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    hf = HFCausalLM(transformers.LlamaForCausalLM(cfg))
    native = LlamaModel.random(tiny_config(vocab_size=64), seed=0)
    for target, draft, who in ((hf, native, "target"), (native, hf, "draft")):
        with pytest.raises(ValueError, match=f"needs a native Llama-family {who}"):
            strategies.make_proposer("tree", LoadedModel(target, None, Path("/t"), "t"),
                                     LoadedModel(draft, None, Path("/d"), "d"), 64)
