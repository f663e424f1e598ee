"""The native Llama/Qwen2 model reproduces Hugging Face transformers' logits (float32, atol 1e-4), for a full
prefill and for prefill + incremental chunks through the KVCache, including the speculative pattern (a chunk of
which only part is committed)."""

from __future__ import annotations

import pytest
import torch

from verispec.models.llama import LlamaModel

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)


def randomize(model, seed: int = 0):
    """HF initialises with std 0.02, which gives near-zero logits (a 1e-4 tolerance would then prove nothing).
    Use std 0.3 (logits of magnitude ~5), norms 1 + 0.1 N(0, 1), non-zero biases."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if "norm" in name else 0.3 * noise)
    return model.eval()


def save_hf(kind: str, path, **extra):
    cfg_cls, model_cls = {
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[kind]
    hf = randomize(model_cls(cfg_cls(**{**BASE, **extra})))
    hf.save_pretrained(str(path))
    return hf


def hf_logits(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def native_forward(model, tokens: list[int], cache) -> torch.Tensor:
    return model.forward(torch.tensor([tokens]), cache)[0]


def assert_close(a, b) -> None:
    err = (a - b).abs().max().item()
    assert err < ATOL, f"max |diff| = {err:.3g}"


CASES = {
    "qwen2": ("qwen2", dict(rope_theta=1e6)),  # q/k/v biases; a non-default rope theta
    "qwen2-tied": ("qwen2", dict(tie_word_embeddings=True)),
    "llama": ("llama", dict()),
    "llama-tied-mha": ("llama", dict(tie_word_embeddings=True, num_key_value_heads=4)),
    "mistral": ("mistral", dict(sliding_window=None)),
}


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def pair(request, tmp_path_factory):
    kind, extra = CASES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    hf = save_hf(kind, path, **extra)
    native = LlamaModel.from_hf_dir(path, dtype=torch.float32)
    assert native.dtype == torch.float32
    return hf, native


TEXT = [int(x) for x in torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(3))]


def test_full_prefill(pair):
    hf, native = pair
    ref = hf_logits(hf, TEXT)
    assert ref.abs().max() > 1.0  # the comparison is not between near-zero numbers
    assert_close(native_forward(native, TEXT, native.new_cache(64)), ref)


def test_last_n(pair):
    hf, native = pair
    out = native.forward(torch.tensor([TEXT[:10]]), native.new_cache(16), last_n=3)[0]
    assert out.shape == (3, 64)
    assert_close(out, hf_logits(hf, TEXT[:10])[-3:])


def test_prefill_then_incremental_chunks(pair):
    hf, native = pair
    ref = hf_logits(hf, TEXT)
    cache = native.new_cache(64)
    pos = 0
    for size in [7, 1, 1, 5, 2, 1, 8, 3, 1, 11]:
        chunk = TEXT[pos : pos + size]
        assert_close(native_forward(native, chunk, cache), ref[pos : pos + size])
        cache.commit(size)
        pos += size
    assert pos == len(TEXT)


def test_partially_committed_chunks(pair):
    """The speculative pattern: score pending + drafts, keep only some, continue with other tokens."""
    hf, native = pair
    cache = native.new_cache(64)
    gen = torch.Generator().manual_seed(4)
    text = TEXT[:6]
    native_forward(native, text[:-1], cache)
    cache.commit(len(text) - 1)
    for keep, size in [(1, 4), (3, 4), (5, 5), (2, 6), (1, 1)]:
        drafts = torch.randint(0, 64, (size - 1,), generator=gen).tolist()
        chunk = [text[-1]] + drafts
        out = native_forward(native, chunk, cache)
        assert_close(out, hf_logits(hf, text + drafts)[-size:])
        cache.commit(keep)  # pending + keep - 1 drafts
        text = text + drafts[: keep - 1] + [int(torch.randint(0, 64, (1,), generator=gen))]
        assert cache.length == len(text) - 1
    assert_close(native_forward(native, [text[-1]], cache)[-1], hf_logits(hf, text)[-1])


def test_config_fields(tmp_path):
    save_hf("qwen2", tmp_path, rope_theta=1e6, eos_token_id=[5, 7])
    native = LlamaModel.from_hf_dir(tmp_path, dtype=torch.float32)
    assert native.cfg.attention_bias and native.cfg.rope_theta == 1e6 and native.cfg.eos_token_id == 5


# Configurations the native model does not implement must be refused (ValueError at load, or a refusal when the
# cache is created / written), never loaded into a model that silently computes something else.
UNSUPPORTED = {
    "llama-attention-bias": ("llama", dict(attention_bias=True)),  # HF Llama then also has an o_proj bias
    "llama-mlp-bias": ("llama", dict(mlp_bias=True)),
    "llama-rope-scaling": ("llama", dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama-head-dim": ("llama", dict(head_dim=16)),
    "mistral-sliding-window": ("mistral", dict(sliding_window=4)),
    "qwen2-sliding-window": ("qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=0)),
}


@pytest.mark.parametrize("name", list(UNSUPPORTED))
def test_unsupported_configs_match_or_are_refused(tmp_path, name):
    kind, extra = UNSUPPORTED[name]
    hf = save_hf(kind, tmp_path, **extra)
    text = TEXT[:12]
    try:
        native = LlamaModel.from_hf_dir(tmp_path, dtype=torch.float32)
        out = native_forward(native, text, native.new_cache(len(text)))
    except (ValueError, RuntimeError):  # refused (CacheFullError, state-dict shape errors are RuntimeErrors)
        return
    assert_close(out, hf_logits(hf, text))


# ---- a decoding step's linear layers round like a verification forward's -------------------------------------
@pytest.mark.parametrize("k,n", [(1536, 4096), (4480, 1536)])  # small shapes take one path whatever the rows
def test_one_row_bf16_linear_gives_the_bits_of_a_wider_forward(k, n):
    """A 1-token step must give a token the logits a 5-token verification gives it, or greedy speculation drifts
    from plain decoding on near-ties. torch's one-row bfloat16 matmul rounds differently from its GEMM; the
    native Linear runs one row as two. Where the GEMM itself depends on its row count, nothing can hold."""
    from verispec.models.llama import Linear

    torch.manual_seed(0)
    layer = Linear(k, n, bias=True).to(torch.bfloat16)
    x = torch.randn(1, 5, k).to(torch.bfloat16)
    with torch.no_grad():
        wide = layer(x)
        two = torch.stack([torch.nn.functional.linear(x[0, i : i + 2], layer.weight, layer.bias)[0] for i in range(4)])
        if not torch.equal(two, wide[0, :4]):
            pytest.skip("this CPU's bf16 GEMM rows depend on the row count")
        alone = torch.cat([layer(x[:, i : i + 1]) for i in range(5)], dim=1)
        assert torch.equal(alone, wide)
        assert alone.shape == wide.shape
        plain = torch.cat([torch.nn.functional.linear(x[:, i : i + 1], layer.weight, layer.bias) for i in range(5)], dim=1)
        if torch.equal(plain, wide):  # the check below has teeth only where the hardware shows the difference
            pytest.skip("this CPU's one-row bf16 matmul rounds like its GEMM: nothing for Linear to fix here")
        assert not torch.equal(plain, wide)  # the GEMV path does round differently (why Linear exists)
