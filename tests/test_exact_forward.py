"""A verification forward gives each token the bits a decoding step gives it (bfloat16, native model).

Greedy speculation equals plain greedy decoding exactly only if the target's logits for a position do not
depend on how many tokens shared its forward. Linear layers run one row as two (models.llama.Linear) and every
query is attended on its own (verispec's attention kernel, or torch's one query at a time), so they do not, on CPUs whose bf16 GEMM
rows are independent of the row count (checked first; elsewhere these tests skip).
"""

from __future__ import annotations

import pytest
import torch

import verispec.models.llama as llama
from verispec.engine import GenerationParams, generate
from verispec.models.kernels import ATTENTION_ENV
from verispec.models.llama import LlamaConfig, LlamaModel, seen_prefixes
from verispec.proposers.draft_model import DraftModelProposer
from tests.conftest import triton_on_cpu

# The real target's widths (Qwen2.5-1.5B: 1536 wide, 12 heads of 128, 2 KV heads): smaller matmuls take the same
# kernel path at one row as at several, and would hide what the one-row path does.
CFG = LlamaConfig(vocab_size=2048, hidden_size=1536, intermediate_size=4480, num_hidden_layers=2,
                  num_attention_heads=12, num_key_value_heads=2, attention_bias=True, max_position_embeddings=512)


@pytest.fixture(scope="module")
def bf16_target() -> LlamaModel:
    x = torch.randn(5, CFG.hidden_size).to(torch.bfloat16)
    w = torch.randn(4 * CFG.hidden_size, CFG.hidden_size).to(torch.bfloat16)
    wide = torch.nn.functional.linear(x, w)
    pairs = torch.stack([torch.nn.functional.linear(x[i : i + 2], w)[0] for i in range(4)])
    if not torch.equal(pairs, wide[:4]):
        pytest.skip("this CPU's bf16 GEMM rows depend on the row count")
    return LlamaModel.random(CFG, seed=3, std=0.05, dtype=torch.bfloat16)  # small std: many near-ties


def _steps(model: LlamaModel, prefix: torch.Tensor, chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of `chunk` after `prefix`: one forward over the chunk, and one decoding step per token."""
    wide_cache, step_cache = model.new_cache(256), model.new_cache(256)
    for c in (wide_cache, step_cache):
        model.forward(prefix, c, last_n=1)
        c.commit(prefix.shape[1])
    wide = model.forward(chunk, wide_cache)
    steps = []
    for i in range(chunk.shape[1]):
        steps.append(model.forward(chunk[:, i : i + 1], step_cache))
        step_cache.commit(1)
    return wide, torch.cat(steps, dim=1)


@pytest.mark.parametrize("width", [2, 5, 9])
def test_verification_logits_equal_decoding_steps_bit_for_bit(bf16_target, width):
    gen = torch.Generator().manual_seed(width)
    tokens = torch.randint(0, CFG.vocab_size, (1, 40 + width), generator=gen)
    wide, steps = _steps(bf16_target, tokens[:, :40], tokens[:, 40:])
    assert torch.equal(wide, steps)


def _one_row_linear_rounds_apart(model: LlamaModel) -> bool:
    """Whether this CPU's one-row bfloat16 matmul (torch's GEMV path) gives some row other bits than the
    many-row GEMM does, for one of the model's own matrices."""
    gen = torch.Generator().manual_seed(0)
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for layer in {(m.in_features, m.out_features): m for m in layers}.values():
        x = torch.randn(5, layer.in_features, generator=gen).to(torch.bfloat16)
        with torch.no_grad():
            wide = torch.nn.functional.linear(x, layer.weight, layer.bias)
            alone = torch.cat([torch.nn.functional.linear(x[i : i + 1], layer.weight, layer.bias) for i in range(5)])
        if not torch.equal(wide, alone):
            return True
    return False


def _masked_attention_rounds_apart(model: LlamaModel) -> bool:
    """Whether this CPU's attention gives a query, attended beside others under a causal mask, other bits than
    the same query attended alone over the keys it sees (in the model's attention dtype)."""
    gen = torch.Generator().manual_seed(0)
    dtype, heads, kv, hd = model.attention_dtype, CFG.num_attention_heads, CFG.num_key_value_heads, CFG.head_dim
    q = torch.randn(1, heads, 5, hd, generator=gen).to(torch.bfloat16).to(dtype)
    k, v = (torch.randn(1, kv, 45, hd, generator=gen).to(torch.bfloat16).to(dtype) for _ in range(2))
    mask = torch.ones(5, 45, dtype=torch.bool).tril(40)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    together = sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
    alone = torch.cat([sdpa(q[:, :, i : i + 1], k[:, :, : 41 + i], v[:, :, : 41 + i], enable_gqa=True)
                       for i in range(5)], dim=2)
    return not torch.equal(together, alone)


@pytest.mark.parametrize("drop", ["attention", "linear"])
def test_each_exact_path_is_needed(bf16_target, monkeypatch, drop):
    """The check above has teeth: without either path (torch's attention in one masked call over the chunk,
    instead of verispec's kernel or one call per query; one-row GEMVs), the chunk's logits round apart from the decoding steps'. Each is needed only where this CPU's
    kernels round the two ways apart (AVX-512 machines do; an AVX2 one's bf16 GEMV rounds like its GEMM), so it
    is measured first on the model's own shapes: where they agree there is nothing to catch, and the test
    skips."""
    if drop == "attention":
        if not _masked_attention_rounds_apart(bf16_target):
            pytest.skip("this CPU's attention rounds a query alike alone and beside masked others")
        monkeypatch.setenv(ATTENTION_ENV, "sdpa")  # torch's attention, the chunk's queries in one masked call
        monkeypatch.setattr(llama, "EXACT_ATTENTION_MAX", 0)
    else:
        if not _one_row_linear_rounds_apart(bf16_target):
            pytest.skip("this CPU's one-row bf16 matmul rounds like its many-row GEMM")
        monkeypatch.setattr(llama.Linear, "forward", torch.nn.Linear.forward)
    # Where the two paths round apart only for some inputs (an Intel Xeon with AMX: about one chunk in three),
    # one chunk may happen to agree; a broken path shows on some chunk of a few.
    for seed in range(16):
        tokens = torch.randint(0, CFG.vocab_size, (1, 45), generator=torch.Generator().manual_seed(seed))
        wide, steps = _steps(bf16_target, tokens[:, :40], tokens[:, 40:])
        if not torch.equal(wide, steps):
            return
    pytest.fail("16 chunks got the same logits with the exact path dropped")


@pytest.mark.parametrize("fused", [False, True], ids=["one-query-calls", "triton"])
def test_the_gpus_way_of_attending_gives_each_query_its_step_bits(bf16_target, monkeypatch, fused):
    """On a GPU every query of a verification forward is attended on its own, as a decoding step's is (torch's
    cuDNN attention gave the same query other bits from call to call there): in one Triton launch
    (triton_attention), else one_query_attention a query. Forced here on the CPU's tensors (Triton's interpreter):
    the chunk's logits equal the steps' bit for bit, and one_query_attention agrees with torch's."""
    from verispec.models import triton_attention

    if fused:
        triton_on_cpu()
    monkeypatch.setattr(triton_attention, "available", lambda device="cuda": fused)  # these tensors are the CPU's
    plain = llama.attention
    monkeypatch.setattr(llama, "attention", lambda mask, batch, kv_dtype, device, scale=None: plain(
        mask, batch, kv_dtype, torch.device("cuda"), scale))
    gen = torch.Generator().manual_seed(7)
    for width in (2, 5, 9):
        tokens = torch.randint(0, CFG.vocab_size, (1, 40 + width), generator=gen)
        wide, steps = _steps(bf16_target, tokens[:, :40], tokens[:, 40:])
        assert torch.equal(wide, steps)
    q = torch.randn(2, 12, 1, 64, generator=gen)
    k, v = (torch.randn(2, 2, 37, 64, generator=gen) for _ in range(2))
    for scale in (None, 0.3):
        torch.testing.assert_close(llama.one_query_attention(q, k, v, scale=scale),
                                   llama.torch_attention(q, k, v, scale=scale), atol=1e-5, rtol=1e-5)
    mask = torch.ones(3, 37, dtype=torch.bool).tril(34)
    q3 = torch.randn(2, 12, 3, 64, generator=gen)
    torch.testing.assert_close(llama.gpu_attention(q3, k, v, mask), llama.torch_attention(q3, k, v, mask),
                               atol=1e-5, rtol=1e-5)


def test_speculative_greedy_equals_plain_in_bf16(bf16_target):
    """A draft that is the target itself at another seed's noise: rounds accept, reject and roll back, and the
    output is plain decoding's, token for token."""
    draft = LlamaModel.random(CFG, seed=4, std=0.05, dtype=torch.bfloat16)
    with torch.no_grad():  # the target plus a little noise: about 60% of drafts accepted (0.9 / 0.1: 10%)
        for pd, pt in zip(draft.parameters(), bf16_target.parameters()):
            pd.copy_(0.99 * pt.float() + 0.01 * pd.float())
    gen = torch.Generator().manual_seed(1)
    accepted = drafted = 0
    # where bf16 is emulated (AMD Zen 3) a step of this model takes ~35 ms: one gamma a prompt, and drafts accepted
    # often enough that rounds are few (22 s with both gammas for each prompt and 10% accepted; ~5 s so)
    for n, gamma in enumerate((3, 6)):
        prompt = torch.randint(0, CFG.vocab_size, (12 + n,), generator=gen).tolist()
        plain = generate(bf16_target, prompt, GenerationParams(max_new_tokens=24))  # gamma plays no part in it
        params = GenerationParams(max_new_tokens=24, gamma=gamma)
        spec = generate(bf16_target, prompt, params, DraftModelProposer(draft, len(prompt) + 40))
        assert spec.token_ids == plain.token_ids
        accepted, drafted = accepted + spec.metrics.accepted, drafted + spec.metrics.drafted
    assert 0 < accepted < drafted, (accepted, drafted)


def testseen_prefixes():
    causal = torch.ones(3, 7, dtype=torch.bool).tril(4)
    assert seen_prefixes(causal) == [5, 6, 7]
    tree = causal.clone()
    tree[2, 5] = False  # sees key 6 but not key 5: not a prefix
    assert seen_prefixes(tree) == [5, 6, None]


def test_small_batched_rounds_equal_lone_sequences_bit_for_bit(bf16_target):
    """The server's batched round (rows of different lengths) gives each row the logits its lone sequence's
    forward gives, so concurrent greedy requests reproduce `generate` exactly while a round's rows hold at most
    EXACT_ATTENTION_MAX tokens (here 3 rows x 5)."""
    from verispec.batch import forward_rows

    model = bf16_target
    gen = torch.Generator().manual_seed(7)
    seqs = [torch.randint(0, CFG.vocab_size, (n,), generator=gen).tolist() for n in (30, 21, 26)]
    news = [torch.randint(0, CFG.vocab_size, (n,), generator=gen).tolist() for n in (4, 2, 3)]
    cache = model.new_batch_cache(3, 64, slack=16)
    for r, s in enumerate(seqs):
        model.forward(torch.tensor([s[:-1]]), cache.row(r), last_n=1)
        cache.commit(r, len(s) - 1)
    batched = forward_rows(model, [s[-1:] + n for s, n in zip(seqs, news)], cache)
    for got, s, n in zip(batched, seqs, news):
        alone = model.new_cache(64)
        model.forward(torch.tensor([s[:-1]]), alone, last_n=1)
        alone.commit(len(s) - 1)
        assert torch.equal(got, model.forward(torch.tensor([s[-1:] + n]), alone)[0])


@pytest.mark.parametrize("rows", [17, 48, 100])
def test_a_wide_bf16_forward_gives_each_row_its_own_bits(rows):
    """A batched round of several requests is a forward of many rows: each row gets the bits a 2-row call gives
    it (on an Intel Xeon with AMX the GEMM rounds rows apart past 32 rows; models.llama.Linear then runs blocks)."""
    gen = torch.Generator().manual_seed(rows)
    layer = llama.Linear(1536, 2048, bias=True).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(0.05 * torch.randn(2048, 1536, generator=gen))
        x = torch.randn(1, rows, 1536, generator=gen).to(torch.bfloat16)
        wide = layer(x)[0]
        pairs = torch.cat([layer(x[0, i : i + 2])[:1] for i in range(rows)])
    assert torch.equal(wide, pairs)
