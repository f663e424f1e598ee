"""Gemma 3 on the native decoder, against transformers' Gemma3ForCausalLM (float32, atol 1e-4) on tiny random models.

What is checked: logits of a prefill longer than the sliding window (so the local layers' window and their own rope
base matter), of incremental chunks committed in part (speculation's pattern: rolled-back slots must not leak
through the window), of batched rows of different lengths and of token-tree nodes (positions that differ from
slots); the control, the same model with the window taken off, must fail. A GGUF written as llama.cpp writes a
gemma3 one (norms stored as 1 + weight, a sentencepiece vocabulary) converts to a directory that gives the same
logits and a tokenizer that starts a prompt with <bos>. Greedy speculation (n-gram, lookahead, layer skip) equals
plain decoding in bfloat16 past the window, and a w4a8 Gemma runs its layers on the torch path.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from verispec.batch import forward_rows, tree_layout
from verispec.engine import GenerationParams, generate
from verispec.models.llama import LlamaModel

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
WINDOW = 5
# 5 sliding layers and a global one: llama.cpp's gemma3 pattern (every 6th layer global), which a GGUF implies
LAYER_TYPES = ["sliding_attention"] * 5 + ["full_attention"]
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
PIECES = ["▁", "a", "b", "c", "d", "e", "▁a", "▁b", "ab", "▁ab", "cd", "▁cd", "abcd", "▁abcd"]


def _vocabulary() -> list[str]:
    return SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + PIECES


def _hf_gemma(seed: int = 0, **extra) -> torch.nn.Module:
    """A random Gemma3ForCausalLM (head_dim 16, not hidden / heads = 12); weights large enough that a 1e-4
    tolerance is a real check, norms near 0 (transformers scales by 1 + weight)."""
    cfg = transformers.Gemma3TextConfig(**{
        **dict(vocab_size=len(_vocabulary()), hidden_size=48, intermediate_size=96, num_hidden_layers=6,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
               sliding_window=WINDOW, layer_types=LAYER_TYPES, query_pre_attn_scalar=16, rms_norm_eps=1e-6),
        **extra})
    model = transformers.Gemma3ForCausalLM(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(0.2 * noise if "norm" in name else 0.3 * noise)
    return model.eval()


def _logits(hf: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    err = (a - b).abs().max().item()
    assert err < ATOL, f"max |diff| = {err:.3g}"


TEXT = [int(x) for x in torch.randint(6, 280, (24,), generator=torch.Generator().manual_seed(3))]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[torch.nn.Module, LlamaModel]:
    """transformers' model (attention scaled by query_pre_attn_scalar 20, not head_dim 16) and the native one
    loaded from its saved directory."""
    hf = _hf_gemma(query_pre_attn_scalar=20)
    path = tmp_path_factory.mktemp("gemma3")
    hf.save_pretrained(str(path))
    native = LlamaModel.from_hf_dir(path, dtype=torch.float32)
    assert native.cfg.sliding_window == WINDOW and native.cfg.head_dim == 16
    return hf, native


def test_prefill_past_the_window_matches_transformers(pair):
    hf, native = pair
    ref = _logits(hf, TEXT)
    assert ref.abs().max() > 1.0  # not a comparison of near-zero numbers
    _close(native.forward(torch.tensor([TEXT]), native.new_cache(64))[0], ref)


def test_without_the_window_the_logits_differ_past_it(pair):
    """The control: local layers that see every key match transformers only up to the window."""
    hf, native = pair
    ref = _logits(hf, TEXT)
    unwindowed = dataclasses.replace(native.cfg, sliding_window=10**6)
    native.cfg, cfg = unwindowed, native.cfg
    try:
        got = native.forward(torch.tensor([TEXT]), native.new_cache(64))[0]
    finally:
        native.cfg = cfg
    _close(got[:WINDOW], ref[:WINDOW])
    assert (got[WINDOW:] - ref[WINDOW:]).abs().max() > 0.1


def test_chunks_committed_in_part_match_transformers(pair):
    """Prefill, then chunks of which only some tokens are committed (the rest are rejected drafts that the next
    chunk overwrites), then one token at a time: every real position's logits equal a full forward's."""
    hf, native = pair
    ref = _logits(hf, TEXT)
    cache = native.new_cache(64)
    _close(native.forward(torch.tensor([TEXT[:4]]), cache)[0], ref[:4])
    cache.commit(4)
    at = 4
    for keep in (2, 1, 3):
        junk = [7, 8, 9]  # drafts that will be rejected
        out = native.forward(torch.tensor([TEXT[at : at + keep] + junk]), cache)[0]
        _close(out[:keep], ref[at : at + keep])
        cache.commit(keep)
        at += keep
    while at < len(TEXT):
        _close(native.forward(torch.tensor([[TEXT[at]]]), cache)[0], ref[at : at + 1])
        cache.commit(1)
        at += 1


def test_batched_rows_and_tree_nodes_match_transformers(pair):
    """forward_rows over rows of different lengths, and a token tree whose nodes' positions are not their slots."""
    hf, native = pair
    cache = native.new_batch_cache(2, 64, slack=8)
    a, b = TEXT[:13], TEXT[3:20]
    forward_rows(native, [a[:-3], b[:-1]], cache)
    cache.commit(0, len(a) - 3)
    cache.commit(1, len(b) - 1)
    out = forward_rows(native, [a[-3:], b[-1:]], cache)
    _close(out[0], _logits(hf, a)[-3:])
    _close(out[1], _logits(hf, b)[-1:])
    # row 0: a tree under its pending token: x and y its children, z under x
    x, y, z = 11, 12, 13
    tree = tree_layout([-1, -1, 0])
    out = forward_rows(native, [[a[-3], x, y, z], b[-1:]], cache, trees=[tree, None])[0]
    prefix = a[:-2]
    _close(out[1], _logits(hf, prefix + [x])[-1:][0])
    _close(out[2], _logits(hf, prefix + [y])[-1:][0])
    _close(out[3], _logits(hf, prefix + [x, z])[-1:][0])


def _write_gemma_gguf(path: Path, hf: torch.nn.Module) -> None:
    """`hf` as llama.cpp's converter writes a gemma3 GGUF: its tensor names, every norm stored as 1 + weight,
    float32 tensors (no quantization: the conversion must be exact), a sentencepiece vocabulary with byte
    fallback and no merges."""
    cfg = hf.config
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_sliding_window(cfg.sliding_window)
    tokens = _vocabulary()
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(SPECIALS) + [0.0] * 256 + [-float(i) for i in range(len(PIECES))])
    w.add_token_types([3, 3, 3, 2, 3, 3] + [6] * 256 + [1] * len(PIECES))
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for name, p in hf.state_dict().items():
        if name == "lm_head.weight":  # tied
            continue
        if name.startswith("model.layers."):
            _, _, i, local = name.split(".", 3)
            gname = f"blk.{i}.{layer[local.removesuffix('.weight')]}.weight"
        else:
            gname = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}[name]
        a = p.detach().float().numpy()
        w.add_tensor(gname, a + np.float32(1.0) if name.endswith("norm.weight") else a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_converts_to_the_same_model_and_a_bos_tokenizer(tmp_path):
    from verispec.models.gguf_convert import convert_gguf
    from verispec.models.tokenizer import Tokenizer

    hf = _hf_gemma(seed=1)
    _write_gemma_gguf(tmp_path / "tiny-gemma3.gguf", hf)
    out = convert_gguf(tmp_path / "tiny-gemma3.gguf", cache=tmp_path / "cache", dtype=torch.float32, progress=False)
    native = LlamaModel.from_hf_dir(out, dtype=torch.float32)
    assert native.cfg.layer_types == tuple(LAYER_TYPES) and native.cfg.rope_local_theta == 10_000.0
    _close(native.forward(torch.tensor([TEXT]), native.new_cache(64))[0], _logits(hf, TEXT))
    tok = Tokenizer.from_dir(out)
    assert tok.bos_ids == (2,) and set(tok.eos_ids) == {1, 5}  # <eos> and <end_of_turn>
    ids = tok.encode("abcd ab")
    assert ids[0] == 2 and tok.encode("abcd ab", bos=False) == ids[1:]
    assert tok.decode(ids) == "abcd ab"


@pytest.fixture(scope="module")
def bf16_native(tmp_path_factory) -> LlamaModel:
    """A bfloat16 model whose greedy text varies (a random model with a tied head repeats its last token)."""
    path = tmp_path_factory.mktemp("gemma3-untied")
    _hf_gemma(seed=0, tie_word_embeddings=False).save_pretrained(str(path))
    return LlamaModel.from_hf_dir(path, dtype=torch.bfloat16)


@pytest.mark.parametrize("strategy", ["ngram", "lookahead", "layerskip"])
def test_greedy_speculation_equals_plain_decoding_past_the_window(bf16_native, strategy):
    from verispec.proposers.layerskip import LayerSkipProposer
    from verispec.proposers.lookahead import LookaheadProposer
    from verispec.proposers.ngram import NgramProposer

    prompt = [2] + TEXT[:12]
    params = GenerationParams(max_new_tokens=24, gamma=3)
    plain = generate(bf16_native, prompt, params)
    assert len(set(plain.token_ids)) > 8
    proposer = {"ngram": lambda: NgramProposer(), "lookahead": lambda: LookaheadProposer(window=3),
                "layerskip": lambda: LayerSkipProposer(bf16_native, 3)}[strategy]()
    got = generate(bf16_native, prompt, params, proposer)
    assert got.token_ids == plain.token_ids
    assert got.metrics.drafted > 0


def test_w4a8_gemma_runs_its_layers_on_the_torch_path(pair):
    from verispec.models import kernels
    from verispec.models.quant import quantize

    if not kernels.available_isas():
        pytest.skip("no w4a8 kernel build runs on this CPU")
    _, native = pair
    model = LlamaModel(native.cfg)
    model.load_state_dict(native.state_dict())
    quantize(model.eval(), "w4a8")
    assert not any(block.w4a8 for block in model.layers)  # kernels/layer.cpp computes Llama layers only
    ref = native.forward(torch.tensor([TEXT]), native.new_cache(64))[0]
    got = model.forward(torch.tensor([TEXT]), model.new_cache(64))[0]
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.7  # the same model, up to 4- and 6-bit weights
