"""Convert a llama.cpp GGUF file (llama / qwen2 / gemma3 architectures) into a Hugging Face style model directory.

The engine, like transformers, loads plain `config.json` + `model.safetensors` + `tokenizer.json`; a GGUF holds
the same model quantized and under llama.cpp's names. We dequantize once and cache the result under
`<cache>/converted/<sha256[:16]>-<dtype>/`, keyed by the file's content, so a second run costs a stat().
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verispec.models.errors import ModelError
from verispec.models.files import GGUF_MAGIC, cache_dir, file_sha256

FORMAT_VERSION = 1  # bump when the converted layout changes, so old cache entries are rebuilt
MARKER = "verispec.json"
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "gemma3")

_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "f16": torch.float16,
    "float32": torch.float32, "fp32": torch.float32, "f32": torch.float32,
}
_SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
_CHUNK_ELEMENTS = 1 << 22  # dequantize ~4M weights at a time: bounded scratch memory, work for every core
_HASH_CHUNK = 8 << 20

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_REQUIRED = (
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
    "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
)
# Gemma 3 adds q/k norms and a norm after each sublayer; its ffn_norm is the MLP's input norm, which transformers
# names pre_feedforward_layernorm (its post_attention_layernorm is the attention output's norm)
_GEMMA3_LAYER_NAMES = {
    **_LAYER_NAMES,
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
_GEMMA3_LAYER_REQUIRED = (*_LAYER_REQUIRED, "post_attention_norm.weight", "post_ffw_norm.weight",
                          "attn_q_norm.weight", "attn_k_norm.weight")
_ATTN_BIASES = {
    "qwen2": ("attn_q.bias", "attn_k.bias", "attn_v.bias"),  # Qwen2 always has these, and no o_proj bias
    "llama": ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias"),  # all or none (attention_bias)
    "gemma3": (),
}
# Strings the converted tokenizer must encode and decode exactly as the GGUF one does.
_TOKENIZER_PROBES = (
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "你好，世界！这是一个测试。",
    "  two leading spaces\ttab\r\nCRLF and 1234567 digits, emoji 🙂",
    "e\u0301 caf\u00e9 (decomposed and composed accents)",
    "<|im_start|>user\nhi<|im_end|>\n",
)


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, str):
        if dtype.lower() not in _DTYPES:
            raise ModelError(f"unsupported dtype '{dtype}'; use one of: bfloat16, float16, float32")
        return _DTYPES[dtype.lower()]
    if dtype not in _SAFETENSORS_DTYPES:
        raise ModelError(f"unsupported dtype {dtype}; use torch.bfloat16, torch.float16 or torch.float32")
    return dtype


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def gguf_sha256(path: Path, progress: bool = False) -> str:
    """Hex sha256 of a file's bytes: the cache key of its conversion."""
    return file_sha256(path, progress, f"hashing {path.name}")


def _source_sha256(path: Path, root: Path, progress: bool) -> str:
    """The file's sha256, remembered per (path, size, mtime) so that a second run does not re-read a gigabyte."""
    st = path.stat()
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    index = root / ".sources" / f"{key}.json"
    stamp = {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    try:
        known = json.loads(index.read_text())
        if {k: known.get(k) for k in stamp} == stamp and isinstance(known.get("sha256"), str):
            return known["sha256"]
    except (OSError, ValueError):
        pass
    sha = gguf_sha256(path, progress)
    index.parent.mkdir(parents=True, exist_ok=True)
    tmp = index.with_name(f"{index.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({**stamp, "sha256": sha}))
    os.replace(tmp, index)
    return sha


def _is_converted(out: Path, sha: str) -> bool:
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("format") == FORMAT_VERSION and marker.get("source_sha256") == sha


def _open_reader(path: Path) -> Any:
    """A GGUFReader over a file known to be a whole, well-formed GGUF (else a one-line ModelError)."""
    from gguf import GGUFReader

    if not path.is_file():
        raise ModelError(f"no GGUF file at {path}")
    with open(path, "rb") as f:
        head = f.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        raise ModelError(f"{path} is not a GGUF file (it starts with {head!r}, expected {GGUF_MAGIC!r})")
    try:
        reader = GGUFReader(path)
    except Exception as e:  # the reader fails with ValueError, IndexError, struct errors... on a damaged file
        raise ModelError(f"{path} is truncated or corrupt: the GGUF reader failed ({type(e).__name__}: {e})") from e
    size = path.stat().st_size
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size or t.data.nbytes != int(t.n_bytes):
            raise ModelError(f"{path} is truncated: tensor {t.name} ends at byte {end} but the file has {size} bytes")
    return reader


def _metadata(reader: Any) -> dict[str, Any]:
    """Scalar and short-array metadata (the vocabulary and merges are left to the tokenizer builder)."""
    from gguf import GGUFValueType

    meta: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if field.types and field.types[0] == GGUFValueType.ARRAY and len(field.data) > 1024:
            continue
        try:
            meta[name] = field.contents()
        except Exception:  # an exotic value type we do not need
            continue
    return meta


def _f32(value: Any) -> float:
    """A float32 metadata value as the short decimal it was written from (1e-06, not 9.999999974752427e-07)."""
    return float(str(np.float32(value)))


def _hf_config(path: Path, meta: dict[str, Any], arch: str, tensors: dict[str, Any], dtype: torch.dtype) -> dict:
    """config.json for Qwen2ForCausalLM / LlamaForCausalLM from llama.cpp's `<arch>.*` metadata keys."""

    def get(key: str, default: Any = ...) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is ...:
            raise ModelError(f"{path}: metadata key '{arch}.{key}' is missing")
        if isinstance(value, list):
            raise ModelError(f"{path}: per-layer '{arch}.{key}' values are not supported")
        return value

    hidden, n_head = int(get("embedding_length")), int(get("attention.head_count"))
    n_kv = int(get("attention.head_count_kv", n_head))
    head_dim = int(get("attention.key_length", hidden // n_head))
    rope_dims = int(get("rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ModelError(f"{path}: partial rotary embeddings ({rope_dims} of {head_dim} dims) are not supported")
    scaling = get("rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise ModelError(f"{path}: rope scaling '{scaling}' is not supported by the converter (llama3's rope_freqs is)")
    cfg: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"],
        "model_type": arch,
        "vocab_size": int(tensors["token_embd.weight"].shape[1]),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "hidden_act": "silu",
        "max_position_embeddings": int(get("context_length", 4096)),
        "rms_norm_eps": _f32(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": _f32(get("rope.freq_base", 10000.0)),
        "rope_scaling": None,
        # Llama 3: llama.cpp's per-frequency rope divisors, read by verispec's native model (not by transformers)
        **({"rope_freq_factors": [float(f) for f in np.asarray(tensors["rope_freqs.weight"].data, dtype=np.float32)]}
           if "rope_freqs.weight" in tensors else {}),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": _dtype_name(dtype),
    }
    if head_dim != hidden // n_head:
        cfg["head_dim"] = head_dim
    if arch == "gemma3":
        del cfg["hidden_act"]  # Gemma's is hidden_activation
        cfg.update(_gemma3_config(path, meta, cfg))
    elif arch == "qwen2":
        cfg["use_sliding_window"] = False
    else:
        cfg["attention_bias"] = "blk.0.attn_q.bias" in tensors
        cfg["mlp_bias"] = False
    for name in ("bos", "eos", "pad"):
        token_id = meta.get(f"tokenizer.ggml.{'padding' if name == 'pad' else name}_token_id")
        if token_id is not None:
            cfg[f"{name}_token_id"] = int(token_id)
    return cfg


def _gemma3_config(path: Path, meta: dict[str, Any], cfg: dict) -> dict[str, Any]:
    """What a Gemma3TextConfig adds to the common keys, as llama.cpp reads a gemma3 GGUF: every 6th layer global,
    the others sliding over `attention.sliding_window` tokens with rope base 10 000, scores scaled by
    head_dim ** -0.5 (hidden / heads for the 27B model), no softcapping unless the file says so."""
    n_layers, head_dim = cfg["num_hidden_layers"], cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    window = meta.get("gemma3.attention.sliding_window")
    if not window:
        raise ModelError(f"{path}: a gemma3 GGUF without attention.sliding_window is not supported")
    pattern = meta.get("gemma3.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # per layer: true where the layer slides
        sliding = [bool(p) for p in pattern]
    else:
        sliding = [(i + 1) % int(pattern) != 0 for i in range(n_layers)]
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if meta.get(f"gemma3.{key}"):
            raise ModelError(f"{path}: gemma3 with {key} is not supported by the native model")
    scale = meta.get("gemma3.attention.scale")
    scalar = (1.0 / float(scale) ** 2 if scale else
              cfg["hidden_size"] // cfg["num_attention_heads"] if n_layers == 62 else head_dim)  # llama.cpp's rule
    return {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "head_dim": head_dim,
        "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": scalar,
        "sliding_window": int(window),
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "rope_local_base_freq": _f32(meta.get("gemma3.rope.freq_base_swa", 10000.0)),
        "final_logit_softcapping": None, "attn_logit_softcapping": None, "attention_bias": False,
    }


def _expected_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """HF shape of each tensor kind (GGUF name without the `blk.N.` prefix), from the config."""
    h, ff, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    head_dim = cfg.get("head_dim", h // cfg["num_attention_heads"])
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    return {
        "token_embd.weight": (vocab, h), "output.weight": (vocab, h), "output_norm.weight": (h,),
        "attn_norm.weight": (h,), "ffn_norm.weight": (h,),
        "attn_q.weight": (q, h), "attn_k.weight": (kv, h), "attn_v.weight": (kv, h), "attn_output.weight": (h, q),
        "attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,), "attn_output.bias": (h,),
        "ffn_gate.weight": (ff, h), "ffn_up.weight": (ff, h), "ffn_down.weight": (h, ff),
        "post_attention_norm.weight": (h,), "post_ffw_norm.weight": (h,),
        "attn_q_norm.weight": (head_dim,), "attn_k_norm.weight": (head_dim,),
    }


Step = tuple[str, Any, int, float]  # (HF name, GGUF tensor, heads to un-permute or 0, shift subtracted from it)


def _plan(path: Path, arch: str, tensors: dict[str, Any], cfg: dict) -> list[Step]:
    """(HF name, GGUF tensor, heads to un-permute or 0, shift) for every tensor, after checking that none is
    missing, unknown or of the wrong shape for the config. The shift is 1 for Gemma's norms: llama.cpp stores
    1 + weight where transformers stores weight (and scales by 1 + weight)."""
    n_layers = cfg["num_hidden_layers"]
    shapes = _expected_shapes(cfg)
    names = _GEMMA3_LAYER_NAMES if arch == "gemma3" else _LAYER_NAMES
    plan: list[Step] = []
    layer_names: dict[int, set[str]] = {i: set() for i in range(n_layers)}
    for name, t in tensors.items():
        kind = name.split(".", 2)[2] if name.startswith("blk.") and name.count(".") >= 2 else name
        if kind in shapes and _hf_shape(t) != shapes[kind]:
            raise ModelError(
                f"{path}: tensor {name} has shape {_hf_shape(t)}, expected {shapes[kind]} from the metadata"
            )
        shift = 1.0 if arch == "gemma3" and name.endswith("norm.weight") else 0.0
        if name in _GLOBAL_NAMES:
            plan.append((_GLOBAL_NAMES[name], t, 0, shift))
            continue
        if name == "rope_freqs.weight":  # in config.json (rope_freq_factors), not a weight
            continue
        parts = name.split(".", 2)
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in names:
            i, local = int(parts[1]), parts[2]
            if i >= n_layers:
                raise ModelError(f"{path}: tensor {name} belongs to layer {i}, but the model has {n_layers} layers")
            layer_names[i].add(local)
            heads = 0
            # llama.cpp rotates interleaved pairs, so its converter permuted HF's q/k rows for the llama
            # architecture (not for qwen2, which uses the NEOX layout HF has); undo it.
            if arch == "llama" and local.startswith("attn_q."):
                heads = cfg["num_attention_heads"]
            elif arch == "llama" and local.startswith("attn_k."):
                heads = cfg["num_key_value_heads"]
            plan.append((f"model.layers.{i}.{names[local]}", t, heads, shift))
            continue
        raise ModelError(
            f"{path}: unsupported tensor '{name}' (this converter handles plain {'/'.join(SUPPORTED_ARCHITECTURES)} "
            "decoders)"
        )
    for name in ("token_embd.weight", "output_norm.weight"):
        if name not in tensors:
            raise ModelError(f"{path}: required tensor '{name}' is missing")
    biases = _ATTN_BIASES[arch]
    required = _GEMMA3_LAYER_REQUIRED if arch == "gemma3" else _LAYER_REQUIRED
    for i, present in layer_names.items():
        missing = [n for n in required if n not in present]
        have_bias = [b for b in biases if b in present]
        if arch == "qwen2" or have_bias:
            missing += [b for b in biases if b not in present]
        if arch == "qwen2" and "attn_output.bias" in present:
            raise ModelError(f"{path}: qwen2 layer {i} has an attn_output.bias, which Qwen2 does not have")
        if missing:
            raise ModelError(f"{path}: layer {i} lacks tensor(s) {', '.join('blk.%d.%s' % (i, n) for n in missing)}")
    return plan


def _hf_shape(t: Any) -> tuple[int, ...]:
    """GGUF lists dimensions innermost first; PyTorch outermost first."""
    return tuple(int(d) for d in reversed(t.shape))


def _check_dequantizable(path: Path, t: Any) -> None:
    from gguf.quants import dequantize

    rows = t.data.reshape(-1, t.data.shape[-1]) if t.data.ndim > 1 else t.data.reshape(1, -1)
    try:
        dequantize(rows[:1], t.tensor_type)
    except NotImplementedError:
        raise ModelError(
            f"{path}: tensor {t.name} uses type {t.tensor_type.name}, which the gguf package cannot dequantize"
        ) from None


def _dequantize_chunks(t: Any, dtype: torch.dtype, pool: ThreadPoolExecutor, shift: float = 0.0) -> Iterator[torch.Tensor]:
    """The tensor minus `shift` (in float32) as flat `dtype` pieces, in order, dequantized a few million weights at
    a time across threads."""
    from gguf.quants import dequantize

    rows = t.data.reshape(-1, t.data.shape[-1]) if t.data.ndim > 1 else t.data.reshape(1, -1)
    cols = int(t.shape[0])
    step = max(1, _CHUNK_ELEMENTS // cols)

    def work(start: int) -> torch.Tensor:
        arr = np.asarray(dequantize(rows[start:start + step], t.tensor_type), dtype=np.float32)
        if not arr.flags.writeable or not arr.flags.c_contiguous:
            arr = np.array(arr, dtype=np.float32, order="C")
        if shift:
            arr = arr - np.float32(shift)
        return torch.from_numpy(arr).reshape(-1).to(dtype)

    yield from pool.map(work, range(0, rows.shape[0], step))


def _unpermute_rope(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's `permute`: rows of each head go from interleaved pairs back to two halves."""
    shape = w.shape
    return w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _write_safetensors(out: Path, plan: list[Step], dtype: torch.dtype, progress: bool) -> None:
    """Stream the tensors into one safetensors file: the header is known up front from the GGUF's shapes, so
    only one tensor's worth of weights is ever in memory, not the whole model."""
    from tqdm import tqdm

    itemsize = torch.empty((), dtype=dtype).element_size()
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "source": "verispec.gguf_convert"}}
    offset = 0
    for hf_name, t, _, _ in plan:
        n = int(t.n_elements) * itemsize
        header[hf_name] = {
            "dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(_hf_shape(t)), "data_offsets": [offset, offset + n]
        }
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    try:
        workers = len(os.sched_getaffinity(0))
    except AttributeError:
        workers = os.cpu_count() or 1
    with open(out, "wb") as f, ThreadPoolExecutor(max_workers=max(1, min(workers, 8))) as pool, tqdm(
        total=offset, unit="B", unit_scale=True, desc="converting weights", disable=not progress, file=sys.stderr
    ) as bar:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for hf_name, t, heads, shift in plan:
            start = f.tell()
            chunks = _dequantize_chunks(t, dtype, pool, shift)
            if heads:
                chunks = iter([_unpermute_rope(torch.cat(list(chunks)).reshape(_hf_shape(t)), heads).reshape(-1)])
            for chunk in chunks:
                f.write(chunk.view(torch.uint8).numpy())
                bar.update(chunk.numel() * itemsize)
            if f.tell() - start != int(t.n_elements) * itemsize:
                raise ModelError(f"internal error: tensor {t.name} produced {f.tell() - start} bytes")


def _write_tokenizer(gguf_path: Path, out: Path, meta: dict[str, Any], max_length: int) -> None:
    """tokenizer.json + tokenizer_config.json via transformers' GGUF tokenizer builder, then check that the
    directory (config.json already in it) reloads to a tokenizer that encodes and decodes like the GGUF one."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    if "tokenizer.ggml.model" not in meta:
        raise ModelError(f"{gguf_path} has no tokenizer (no tokenizer.ggml.* metadata)")
    # transformers takes a directory plus a file name and would also read any tokenizer files lying next to
    # the GGUF; a private directory holding only a link to it keeps those out.
    src = out / ".gguf-src"
    src.mkdir()
    link = src / "model.gguf"
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        try:
            link.symlink_to(gguf_path.resolve())
        except OSError:
            shutil.copyfile(gguf_path, link)
        # The generic class takes the tokenizer transformers builds from the GGUF as it is. (AutoTokenizer gives
        # the same tokenizer, but first parses the whole file again to pick a class: 20 s instead of 2.)
        tok = PreTrainedTokenizerFast.from_pretrained(str(src), gguf_file=link.name, local_files_only=True)
        tok.save_pretrained(str(out))
        cfg_path = out / "tokenizer_config.json"
        tok_cfg = json.loads(cfg_path.read_text())
        for junk in ("is_local", "local_files_only", "name_or_path", "gguf_file", "vocab_file"):
            tok_cfg.pop(junk, None)
        tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        tok_cfg["model_max_length"] = max_length
        if meta.get("tokenizer.chat_template"):
            tok_cfg["chat_template"] = meta["tokenizer.chat_template"]  # also where transformers 4.x looks
        cfg_path.write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")
        saved = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
        added = saved.backend_tokenizer.normalizer if tok.backend_tokenizer.normalizer is None else None
        if added is not None:
            # transformers 5 loads a qwen2 directory as Qwen2Tokenizer whatever tokenizer_config says, and that
            # class adds NFC normalization (as the upstream Qwen tokenizer.json has; llama.cpp does not).
            # Record it in tokenizer.json too, so every loader of this directory tokenizes alike.
            tok_json = json.loads((out / "tokenizer.json").read_text())
            tok_json["normalizer"] = json.loads(saved.backend_tokenizer.to_str())["normalizer"]
            (out / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False))
    except Exception as e:  # the tokenizer builders raise anything from ValueError to KeyError
        raise ModelError(f"cannot build a tokenizer from {gguf_path}: {type(e).__name__}: {e}") from e
    finally:
        hf_logging.set_verbosity(verbosity)
        shutil.rmtree(src, ignore_errors=True)
    if saved.get_vocab() != tok.get_vocab():
        raise ModelError(f"the tokenizer saved from {gguf_path} has a different vocabulary than the GGUF one")
    for text in _TOKENIZER_PROBES:
        ids = tok.encode(added.normalize_str(text) if added is not None else text, add_special_tokens=False)
        if saved.encode(text, add_special_tokens=False) != ids or saved.decode(ids) != tok.decode(ids):
            raise ModelError(f"the tokenizer saved from {gguf_path} does not match the GGUF tokenizer on {text!r}")


def _generation_config(meta: dict[str, Any]) -> dict[str, Any]:
    """Stop on end-of-sequence and end-of-turn alike, as llama.cpp does."""
    eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    eos = list(dict.fromkeys(int(e) for e in eos if e is not None))
    gen: dict[str, Any] = {}
    if meta.get("tokenizer.ggml.bos_token_id") is not None:
        gen["bos_token_id"] = int(meta["tokenizer.ggml.bos_token_id"])
    if eos:
        gen["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    if meta.get("tokenizer.ggml.padding_token_id") is not None:
        gen["pad_token_id"] = int(meta["tokenizer.ggml.padding_token_id"])
    return gen


def convert_gguf(
    gguf_path: Path,
    cache: Path | None = None,
    dtype: torch.dtype | str = torch.bfloat16,
    progress: bool = True,
    *,
    sha256: str | None = None,
) -> Path:
    """GGUF file -> cached Hugging Face style directory (config, safetensors, tokenizer, generation config).

    `sha256` is the file's hash when the caller already knows it (a packaged model); otherwise it is computed
    once and remembered against the file's path, size and mtime. The directory is built under a temporary
    name, with the `verispec.json` marker written last, and renamed into place, so a half-written conversion
    is never reused.
    """
    gguf_path = Path(gguf_path).expanduser()
    dtype = _as_dtype(dtype)
    root = (Path(cache) if cache else cache_dir()) / "converted"
    if not gguf_path.is_file():
        raise ModelError(f"no GGUF file at {gguf_path}")
    sha = sha256 or _source_sha256(gguf_path, root, progress)
    out = root / f"{sha[:16]}-{_dtype_name(dtype)}"
    if _is_converted(out, sha):
        return out

    if progress:
        print(f"reading {gguf_path.name}", file=sys.stderr)
    reader = _open_reader(gguf_path)
    meta = _metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelError(
            f"{gguf_path}: architecture '{arch}' is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ModelError(f"{gguf_path}: required tensor 'token_embd.weight' is missing")
    cfg = _hf_config(gguf_path, meta, arch, tensors, dtype)
    plan = _plan(gguf_path, arch, tensors, cfg)
    for _, t, _, _ in plan:
        _check_dequantizable(gguf_path, t)

    root.mkdir(parents=True, exist_ok=True)
    if _is_converted(out, sha):  # another process finished it meanwhile
        return out
    if out.exists():  # a stale entry (older format, or its marker lost): rebuild it
        shutil.rmtree(out)
    need = sum(int(t.n_elements) for _, t, _, _ in plan) * torch.empty((), dtype=dtype).element_size()
    free = shutil.disk_usage(root).free
    if free < need:
        raise ModelError(
            f"not enough disk space in {root} to convert {gguf_path.name}: need {need / 2**30:.1f} GiB, "
            f"{free / 2**30:.1f} GiB free (set VERISPEC_CACHE to use another directory)"
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=root))
    tmp.chmod(0o755)  # mkdtemp makes it private; the finished directory is an ordinary cache entry
    try:
        _write_safetensors(tmp / "model.safetensors", plan, dtype, progress)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (tmp / "generation_config.json").write_text(json.dumps(_generation_config(meta), indent=2) + "\n")
        if progress:
            print(f"building the tokenizer from {gguf_path.name}", file=sys.stderr)
        _write_tokenizer(gguf_path, tmp, meta, cfg["max_position_embeddings"])
        marker = {
            "format": FORMAT_VERSION,
            "source_sha256": sha,
            "source_file": gguf_path.name,
            "architecture": arch,
            "dtype": _dtype_name(dtype),
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        try:
            os.rename(tmp, out)
        except OSError:
            if not _is_converted(out, sha):  # another process finishing the same conversion is fine
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
