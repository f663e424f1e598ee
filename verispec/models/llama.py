"""A compact native decoder for the Llama family (Llama, Qwen2/2.5, Mistral, SmolLM) and Gemma 3.

In the spirit of gpt-fast's model.py: plain modules, a preallocated KV cache (verispec.cache), fused
q/k/v and gate/up projections, logits only for the positions a caller needs. Gemma 3 is the same decoder with a
few options switched on in its config (norms scaled by 1 + weight, q/k norms, norms around each sublayer, a GELU
gate, scaled embeddings, sliding-window attention on its local layers with their own rope base).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from verispec.cache import BatchKVCache, CacheFullError, KVCache


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    tie_word_embeddings: bool = False
    eos_token_id: int | None = None
    # Llama 3's long-context rope: each rotary frequency divided by its factor (llama.cpp's `rope_freqs` tensor;
    # from a transformers config's rope_scaling of type llama3); None: plain rope
    rope_freq_factors: tuple[float, ...] | None = None
    head_dim: int = 0  # 0: hidden_size // num_attention_heads (Gemma 3 270M: 256, not 640 // 4)
    # Gemma 3's options; the defaults are the Llama decoder.
    norm_unit_offset: bool = False  # RMSNorm scales by (1 + weight), in float32
    qk_norm: bool = False  # an RMSNorm over each head's query and key before rope
    sandwich_norms: bool = False  # an RMSNorm on each sublayer's output before the residual add
    activation: str = "silu"  # the MLP's gate: "silu" or "gelu_tanh"
    embed_scale: float = 1.0  # token embeddings times this (Gemma: sqrt(hidden_size), rounded to the model dtype)
    query_pre_attn_scalar: float | None = None  # attention scores scaled by its -1/2 power (None: head_dim's)
    sliding_window: int | None = None  # local layers see the keys fewer than this many positions behind a query
    layer_types: tuple[str, ...] | None = None  # per layer "sliding_attention" or "full_attention"
    rope_local_theta: float | None = None  # the sliding layers' rope base (Gemma 3: 10 000; global: rope_theta)

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not one of {', '.join(ACTIVATIONS)}")
        if self.sliding_window is not None and len(self.layer_types or ()) < self.num_hidden_layers:
            raise ValueError("a sliding window needs layer_types naming every layer")

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def plain_llama_layer(self) -> bool:
        """Whether a layer is the plain Llama one that kernels/layer.cpp computes (norm x weight, SiLU gate, head_dim
        scaling, no window)."""
        return (not (self.norm_unit_offset or self.qk_norm or self.sandwich_norms or self.sliding_window)
                and self.activation == "silu" and self.attention_scale == self.head_dim ** -0.5)

    def sliding(self, layer: int) -> bool:
        return self.sliding_window is not None and self.layer_types[layer] == "sliding_attention"

    @classmethod
    def from_hf(cls, cfg: dict) -> "LlamaConfig":
        model_type = cfg.get("model_type")
        if model_type == "gemma3_text":
            return cls._from_gemma3(cfg)
        if model_type not in ("llama", "qwen2", "mistral"):
            raise ValueError(f"native model supports llama/qwen2/mistral/gemma3_text, not {model_type!r}")
        known = {f.name for f in fields(cls)} - set(GEMMA_FIELDS)
        kwargs = {k: v for k, v in cfg.items() if k in known}
        eos = cfg.get("eos_token_id")
        kwargs["eos_token_id"] = eos[0] if isinstance(eos, list) else eos
        kwargs["attention_bias"] = model_type == "qwen2" or bool(cfg.get("attention_bias", False))
        # Refuse what this model does not implement rather than load it and compute wrong logits.
        rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if scaling:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind != "llama3":
                raise ValueError(f"rope scaling {kind!r} is not supported by the native model (llama3 is)")
            head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
            theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
            kwargs["rope_freq_factors"] = llama3_freq_factors(
                head_dim, theta, scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"],
                scaling["original_max_position_embeddings"])
        elif cfg.get("rope_freq_factors"):  # a converted GGUF's rope_freqs
            kwargs["rope_freq_factors"] = tuple(float(f) for f in cfg["rope_freq_factors"])
        if cfg.get("mlp_bias"):
            raise ValueError("mlp_bias is not supported by the native model")
        if cfg.get("attention_bias") and model_type != "qwen2":
            raise ValueError("an output-projection bias is not supported by the native model")
        if "rope_theta" not in cfg and rope:
            kwargs["rope_theta"] = rope.get("rope_theta", 10000.0)
        window = cfg.get("sliding_window")
        uses_window = cfg.get("use_sliding_window", model_type == "mistral")
        if window and uses_window:
            # Without a window mask the model is exact only up to the window: cap the context there.
            kwargs["max_position_embeddings"] = min(kwargs.get("max_position_embeddings", window), window)
        return cls(**kwargs)

    @classmethod
    def _from_gemma3(cls, cfg: dict) -> "LlamaConfig":
        """A transformers Gemma3TextConfig (config.json) as the native decoder's options; what it does not
        implement (softcapping, rope scaling, biases, bidirectional attention) is refused by name."""
        for key in ("final_logit_softcapping", "attn_logit_softcapping", "attention_bias",
                    "use_bidirectional_attention", "rope_scaling"):
            if cfg.get(key):
                raise ValueError(f"gemma3_text with {key}={cfg[key]!r} is not supported by the native model")
        if cfg.get("hidden_activation", "gelu_pytorch_tanh") not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"gemma3_text activation {cfg['hidden_activation']!r} is not supported")
        # transformers 5 nests the rope per layer type; older configs have rope_theta and rope_local_base_freq
        rope = cfg.get("rope_parameters") or {}
        full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
        for kind, params in (("full_attention", full), ("sliding_attention", local)):
            if params.get("rope_type", "default") != "default":
                raise ValueError(f"gemma3_text {kind} rope {params['rope_type']!r} is not supported (default is)")
        n_layers = cfg["num_hidden_layers"]
        pattern = cfg.get("sliding_window_pattern", 6)
        layer_types = cfg.get("layer_types") or [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)]
        eos = cfg.get("eos_token_id", 1)
        return cls(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=n_layers, num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg["num_key_value_heads"], head_dim=cfg.get("head_dim", 256),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=full.get("rope_theta", cfg.get("rope_theta", 1_000_000.0)),
            rope_local_theta=local.get("rope_theta", cfg.get("rope_local_base_freq", 10_000.0)),
            max_position_embeddings=cfg.get("max_position_embeddings", 131_072),
            tie_word_embeddings=cfg.get("tie_word_embeddings", True),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            norm_unit_offset=True, qk_norm=True, sandwich_norms=True, activation="gelu_tanh",
            embed_scale=cfg["hidden_size"] ** 0.5, query_pre_attn_scalar=cfg.get("query_pre_attn_scalar", 256),
            sliding_window=cfg.get("sliding_window", 4096), layer_types=tuple(layer_types),
        )


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # transformers' gelu_pytorch_tanh
}
# LlamaConfig's fields that only a Gemma config sets (never read from a Llama/Qwen2/Mistral config.json, whose
# sliding_window means something else there)
GEMMA_FIELDS = ("norm_unit_offset", "qk_norm", "sandwich_norms", "activation", "embed_scale",
                "query_pre_attn_scalar", "sliding_window", "layer_types", "rope_local_theta")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in float32 as the reference implementation does, then return to the model dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class UnitOffsetRMSNorm(RMSNorm):
    """Gemma's RMSNorm: scales by (1 + weight), in float32, before returning to the model dtype (transformers'
    Gemma3RMSNorm). The weight is stored as transformers stores it (around 0); llama.cpp's GGUF stores 1 + weight,
    which gguf_convert undoes."""

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


def make_norm(cfg: LlamaConfig, dim: int | None = None) -> RMSNorm:
    """The config's RMSNorm over `dim` features (default: the hidden size)."""
    return (UnitOffsetRMSNorm if cfg.norm_unit_offset else RMSNorm)(dim or cfg.hidden_size, cfg.rms_norm_eps)


class Linear(nn.Linear):
    """nn.Linear, except that a bfloat16 matmul of a single row on a CPU runs as two rows and keeps one, and one
    of a few hundred rows runs in blocks where the CPU's GEMM rounds rows apart beyond some row count.

    There, one row goes down a GEMV path that rounds differently from the GEMM that every wider forward uses,
    and is slower (a 1-token step of the 1.5B target: 143 ms, against 112 ms for 2 tokens). The GEMM's rows do
    not depend on how many rows it has up to a point (on an Intel Xeon with AMX, 32 rows; wider calls take
    another kernel), so a decoding step's linear layers give a token the bits a verification forward, or a
    batched round of several requests, gives it. Forwards wider than EXACT_ROWS_MAX (prompt prefills, the same
    call with and without speculation) run whole.
    """

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype != torch.bfloat16 or x.device.type != "cpu":
            return super().forward(x)
        rows = x.numel() // x.shape[-1]
        if rows == 1:
            return super().forward(torch.cat([x, x], dim=-2))[..., :1, :]
        block = bf16_rows_alike()
        if block is None or rows <= block or rows > EXACT_ROWS_MAX:
            return super().forward(x)
        flat = x.reshape(rows, x.shape[-1])
        parts = [super(Linear, self).forward(c if len(c) > 1 else torch.cat([c, c]))[: len(c)]
                 for c in flat.split(block)]
        return torch.cat(parts).reshape(*x.shape[:-1], self.out_features)


EXACT_ROWS_MAX = 512  # Linear: wider bfloat16 forwards on a CPU are prompt prefills, run whole


@functools.cache
def bf16_rows_alike() -> int | None:
    """The most rows this CPU's bfloat16 GEMM takes in one call giving each row the bits it gives that row in a
    2-row call (None: every count up to 64 does), measured once on a random matrix of the 1.5B target's width."""
    gen = torch.Generator().manual_seed(0)
    w = (0.05 * torch.randn(1536, 1536, generator=gen)).to(torch.bfloat16)
    x = torch.randn(64, 1536, generator=gen).to(torch.bfloat16)
    alike = 2
    with torch.no_grad():
        pairs = torch.cat([F.linear(x[i : i + 2], w)[:1] for i in range(64)])
        for m in (8, 16, 32, 48, 64):
            if not torch.equal(F.linear(x[:m], w), pairs[:m]):
                return alike
            alike = m
    return None


# Forwards of up to this many tokens (verifications, not prefills) attend each query that sees a plain prefix
# of the keys on its own, exactly as a decoding step attends its one token, where torch's attention is used.
# Attention kernels round a query's softmax-weighted sum differently with other queries or a mask beside it;
# one at a time, the forward is the same function of (cache, token) for every position. With Linear's one-row
# path this makes bfloat16 speculative greedy output equal plain decoding's bit for bit on a CPU. verispec's own
# CPU attention (kernels/attention.cpp) computes every query on its own in any case, in one call per layer.
EXACT_ATTENTION_MAX = 16

Attend = Callable[[Tensor, Tensor, Tensor], Tensor]  # (q [B, H, T, D], keys, values [B, KV, S, D]) -> [B, H, T, D]


def seen_prefixes(mask: Tensor) -> list[int | None]:
    """For each query row of a [T, S] bool mask: n if it sees exactly keys 0 .. n-1, else None."""
    counts = mask.sum(-1)
    is_prefix = mask.int().cumprod(-1).sum(-1) == counts  # no key seen after one unseen
    return [int(n) if p else None for n, p in zip(counts.tolist(), is_prefix.tolist())]


class KernelAttend:
    """verispec's attention kernel with one forward's mask ([B, T, S] bool, or empty: causal). A w4a8 layer that
    sees it runs whole in one compiled call (kernels/layer.cpp `layer`), attention included."""

    def __init__(self, kernel: Any, mask: Tensor, scale: float | None = None) -> None:
        self.kernel, self.mask, self.scale = kernel, mask, scale
        self.plan: Plan | None = None  # cache_plan()'s, made once per forward

    def cache_plan(self, cache: Any, batch: int, t: int) -> Plan:
        """The cache's write plan for this forward's t new tokens of `batch` rows, made by the first layer that asks
        (the cache's length moves only at commit, after the forward)."""
        if self.plan is None:
            self.plan = cache.plan(batch, t)
        return self.plan

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self.kernel.attention(q, k, v, self.mask, self.scale or q.shape[-1] ** -0.5)


def attention(mask: Tensor | None, batch: int, kv_dtype: torch.dtype, device: torch.device,
              scale: float | None = None) -> Attend:
    """How one forward attends, chosen once for all its layers of one kind. mask: [T, S] or [B, 1, T, S] bool (which
    keys each query sees), None for one token that sees them all. scale: of the scores (None: head_dim ** -0.5).

    On a CPU with a float32 cache: verispec's kernel, each query on its own. Elsewhere torch's attention, with the
    queries that see a plain prefix attended one at a time in forwards of up to EXACT_ATTENTION_MAX tokens; on a GPU
    with Triton those, and a decoding step's query, in one launch of triton_attention.prefix_attention."""
    from verispec.models import triton_attention
    from verispec.models.kernels import attention_kernel

    kernel = attention_kernel() if device.type == "cpu" and kv_dtype == torch.float32 else None
    if kernel is not None:
        return KernelAttend(kernel, torch.empty(0, dtype=torch.bool) if mask is None else
                            mask.reshape(-1, *mask.shape[-2:]).expand(batch, -1, -1).contiguous(), scale)
    if mask is not None and mask.dim() == 2:
        mask = mask[None, None]
    seen = ([seen_prefixes(m[0]) for m in mask.expand(batch, -1, -1, -1)]
            if mask is not None and batch * mask.shape[-2] <= EXACT_ATTENTION_MAX else None)
    gpu = device.type == "cuda"
    alone = one_query_attention if gpu else torch_attention
    whole = gpu_attention if gpu else torch_attention
    one_launch = gpu and triton_attention.available(str(device))  # all queries alone in one launch, where shapes allow
    counts: dict[tuple[int, int], Tensor] = {}

    def launch_counts(q: Tensor, k: Tensor) -> Tensor:
        """The keys each query of a launch sees [B, T], put on the device once for the forward, not at every layer:
        a step's query sees them all; a verification's, its prefix (1 where the masked call attends it instead)."""
        key = (q.shape[0], k.shape[2])
        if key not in counts:
            rows = [[k.shape[2]]] * q.shape[0] if seen is None else [[n or 1 for n in row] for row in seen]
            counts[key] = torch.tensor(rows, dtype=torch.int32, device=q.device)
        return counts[key]

    def sdpa(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        fused = one_launch and triton_attention.supports(q.shape[1], k.shape[1], q.shape[3])
        if seen is None:
            if mask is not None or q.shape[2] != 1:
                return whole(q, k, v, mask, scale)
            if fused:
                return triton_attention.prefix_attention(q, k, v, launch_counts(q, k), scale)
            return alone(q, k, v, scale=scale)
        # the masked call covers only the query positions some row cannot attend alone
        rest = sorted({i for row in seen for i, n in enumerate(row) if n is None})
        at = {i: j for j, i in enumerate(rest)}
        masked = whole(q[:, :, rest], k, v, mask[..., rest, :], scale) if rest else None
        if fused:
            out = triton_attention.prefix_attention(q, k, v, launch_counts(q, k), scale)
            for b, row in enumerate(seen):
                for i, n in enumerate(row):
                    if n is None:
                        out[b, :, i] = masked[b, :, at[i]]
            return out
        return torch.cat([torch.cat([
            masked[b : b + 1, :, at[i] : at[i] + 1] if n is None else alone(
                q[b : b + 1, :, i : i + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n], scale=scale)
            for i, n in enumerate(row)], dim=2) for b, row in enumerate(seen)], dim=0)

    return sdpa


def torch_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                    scale: float | None = None) -> Tensor:
    """torch's attention, k and v with fewer heads than q where the model groups its queries (GQA)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1], scale=scale)


def one_query_attention(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
    """Attention of one query a row (q [B, H, 1, D]) in float32: two batched matmuls and a softmax, every query
    head that shares a key head in one matmul (no copy of the cache). On a GPU this replaces torch's attention,
    whose one backend for grouped heads there (cuDNN's) gave the same query other bits from one call to the next
    and built a new graph, ~2 ms of CPU, for each new key count: for every layer of every decoding step
    (benchmarks/results/2026-11-27-h200-cuda-check). Deterministic, and a function of (query, keys) alone, so a
    verification forward attends each query exactly as a decoding step does."""
    b, h, _, d = q.shape
    kv = k.shape[1]
    qg = q.reshape(b, kv, h // kv, d).float()  # [B, KV, H / KV, D]: the query heads of each key head
    scores = torch.matmul(qg, k.float().transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    out = torch.matmul(scores.softmax(-1), v.float())  # [B, KV, H / KV, D]
    return out.reshape(b, h, 1, d).to(q.dtype)


def gpu_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                  scale: float | None = None) -> Tensor:
    """Many queries (a prompt, a wide tree) on a GPU: torch's attention without cuDNN's backend (see
    one_query_attention), the keys' heads repeated so that the memory-efficient kernel, deterministic in its
    forward, can take grouped heads."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def llama3_freq_factors(head_dim: int, theta: float, factor: float, low_freq_factor: float,
                        high_freq_factor: float, original_max: int) -> tuple[float, ...]:
    """Llama 3's rope divisors per frequency: 1 for wavelengths shorter than original_max / high_freq_factor,
    `factor` for those longer than original_max / low_freq_factor, and in between a smooth blend of the two
    frequencies (what llama.cpp stores as `rope_freqs` and transformers computes for rope_type llama3)."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < original_max / high_freq_factor:
            out.append(1.0)
        elif wavelen > original_max / low_freq_factor:
            out.append(float(factor))
        else:
            smooth = (original_max / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(out)


def rope_tables(head_dim: int, max_len: int, theta: float,
                factors: tuple[float, ...] | None = None) -> tuple[Tensor, Tensor]:
    cpu = torch.device("cpu")  # also when a model is built under torch.device("meta"), where ops cost imports
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=cpu) / head_dim))
    if factors is not None:
        inv_freq = inv_freq / torch.tensor(factors, dtype=torch.float64, device=cpu)
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float64, device=cpu), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().float(), emb.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, H, T, D]; cos/sin [T, D] (rotate-half convention, as HF Llama/Qwen2)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qkv_out = (self.n_heads + 2 * self.n_kv) * self.hd
        self.attn_norm = make_norm(cfg)
        self.wqkv = Linear(cfg.hidden_size, qkv_out, bias=cfg.attention_bias)
        self.wo = Linear(self.n_heads * self.hd, cfg.hidden_size, bias=False)
        self.ffn_norm = make_norm(cfg)
        self.w13 = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)  # gate and up, fused
        self.w2 = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = ACTIVATIONS[cfg.activation]
        # Gemma: norms over each head's q and k, and on each sublayer's output (absent, not identity, in a Llama
        # layer, so that its weights and cached quantized files keep their names)
        self.q_norm = make_norm(cfg, self.hd) if cfg.qk_norm else None
        self.k_norm = make_norm(cfg, self.hd) if cfg.qk_norm else None
        self.post_attn_norm = make_norm(cfg) if cfg.sandwich_norms else None
        self.post_ffn_norm = make_norm(cfg) if cfg.sandwich_norms else None
        self.plain = cfg.plain_llama_layer  # what kernels/layer.cpp can compute (quant.quantize reads it)
        # Set by quant.quantize where all four linears run on the w4a8 kernel: the layer's other work then runs in
        # two compiled calls (kernels/layer.cpp) instead of ~40 torch calls.
        self.w4a8 = False
        self._ops: tuple[tuple[Tensor, ...], ...] | None = None  # _operands()

    def forward(self, x: Tensor, layer: int, cache: KVCache | None, cos: Tensor, sin: Tensor,
                attend: Attend) -> Tensor:
        """attend: how this forward attends (`attention`), the same for every layer."""
        if self.w4a8 and x.dtype == torch.float32 and cache is not None:
            from verispec.models.kernels import layer_kernel

            kernel = layer_kernel()
            if kernel is not None:
                return self._compiled(kernel, x, layer, cache, cos, sin, attend)
        batch, t, _ = x.shape
        qkv = self.wqkv(self.attn_norm(x))
        q, k, v = qkv.split([self.n_heads * self.hd, self.n_kv * self.hd, self.n_kv * self.hd], dim=-1)
        q = q.view(batch, t, self.n_heads, self.hd).transpose(1, 2)  # [B, H, T, D]
        k = k.view(batch, t, self.n_kv, self.hd).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = v.view(batch, t, self.n_kv, self.hd).transpose(1, 2)
        # [B, KV, length + T, D], in the cache's dtype (attention_dtype); no cache: training (EAGLE's drafter)
        k_all, v_all = (k, v) if cache is None else cache.write(layer, k, v)
        attn = attend(q.to(k_all.dtype), k_all, v_all)
        out = self.wo(attn.to(x.dtype).transpose(1, 2).reshape(batch, t, -1))
        x = x + (out if self.post_attn_norm is None else self.post_attn_norm(out))
        gate, up = self.w13(self.ffn_norm(x)).chunk(2, dim=-1)
        out = self.w2(self.act(gate) * up)
        return x + (out if self.post_ffn_norm is None else self.post_ffn_norm(out))

    def _compiled(self, kernel: Any, x: Tensor, layer: int, cache: KVCache, cos: Tensor, sin: Tensor,
                  attend: Attend) -> Tensor:
        """forward, with the work before and after attention in kernels/layer.cpp (w4a8 linears only)."""
        batch, t, width = x.shape
        rows = x.reshape(batch * t, width).contiguous()
        cos, sin = (c.reshape(-1, t, self.hd).contiguous() for c in (cos, sin))
        ops = self._operands()
        if isinstance(attend, KernelAttend):  # the whole layer in one call
            kc, vc = cache.layer_kv(layer)
            index, slots, read = attend.cache_plan(cache, batch, t)
            out = kernel.layer(rows, self.attn_norm.weight, self.attn_norm.eps, *ops[0], cos, sin, self.n_heads,
                               self.n_kv, kc, vc, index, slots, read, attend.mask, *ops[1], self.ffn_norm.weight,
                               self.ffn_norm.eps, *ops[2], *ops[3])
            return out.view(batch, t, width)
        qkv = kernel.layer_pre(rows, self.attn_norm.weight, self.attn_norm.eps, *ops[0], cos, sin, self.n_heads,
                               self.n_kv, t).view(batch, t, -1)
        q, k, v = (part.view(batch, t, -1, self.hd).transpose(1, 2) for part in qkv.split(
            [self.n_heads * self.hd, self.n_kv * self.hd, self.n_kv * self.hd], dim=-1))
        k_all, v_all = cache.write(layer, k, v)
        attn = attend(q, k_all, v_all).transpose(1, 2).reshape(batch * t, -1)
        out = kernel.layer_post(rows, attn, *ops[1], self.ffn_norm.weight, self.ffn_norm.eps, *ops[2], *ops[3])
        return out.view(batch, t, width)

    def stack_operands(self) -> tuple[list[Tensor], list[float]]:
        """This layer's 15 operands and 2 epsilons in kernels/layer.cpp `layer`'s order (for a LayerStack)."""
        ops = self._operands()
        return ([self.attn_norm.weight, *ops[0], *ops[1], self.ffn_norm.weight, *ops[2], *ops[3]],
                [self.attn_norm.eps, self.ffn_norm.eps])

    def _operands(self) -> tuple[tuple[Tensor, ...], ...]:
        """The four linears' kernel operands (qkv with its bias), gathered once rather than in every forward."""
        ops = self._ops
        if ops is None or ops[0][0] is not self.wqkv.weight:  # rebuilt if the weights were replaced
            ops = self._ops = (self.wqkv.operands(), self.wo.operands()[:3], self.w13.operands()[:3],
                               self.w2.operands()[:3])
        return ops


def last_block(features: Tensor, hidden_size: int) -> Tensor:
    """The last block's output in the features `LlamaModel.forward(hidden=True)` returns: their last hidden_size
    columns, whatever feature layers come before them."""
    return features[..., -hidden_size:]


class LlamaModel(nn.Module):
    """Implements verispec.models.base.CausalLM."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = cfg.vocab_size
        # no random init: every caller loads or draws the weights (and on the meta device torch's init would
        # import its Python decompositions, 1.3 s of every start)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = make_norm(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self._stack: tuple[list[Tensor], Any, Any] | None = None  # _layer_stack(): (weights, kernel module, stack)
        # the features `forward(hidden=True)` returns: the outputs after the first k blocks for each k here, then the
        # last block's, concatenated ([..., (len + 1) * H]); set by an EAGLE-3 drafter's loading (its low and mid taps)
        self.feature_layers: tuple[int, ...] = ()
        self.register_buffer("cos", None, persistent=False)
        self.register_buffer("sin", None, persistent=False)
        self.register_buffer("cos_local", None, persistent=False)  # the sliding layers' rope, where it differs
        self.register_buffer("sin_local", None, persistent=False)
        if not torch.empty(()).is_meta:  # on the meta device the loader computes them once the weights are in
            self.init_rope()

    def init_rope(self) -> None:
        """Compute the rope tables; also needed after the model was built on the meta device."""
        cfg = self.cfg
        self.cos, self.sin = rope_tables(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                         cfg.rope_freq_factors)
        if cfg.rope_local_theta is not None:
            self.cos_local, self.sin_local = rope_tables(cfg.head_dim, cfg.max_position_embeddings,
                                                         cfg.rope_local_theta)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the embedding table may be stored narrower: see quant.compact_embedding)."""
        return self.norm.weight.dtype

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens).to(self.dtype)
        if self.cfg.embed_scale != 1.0:  # Gemma: times sqrt(hidden_size) rounded to the model dtype, as transformers
            x = x * torch.tensor(self.cfg.embed_scale, dtype=self.dtype)
        return x

    @property
    def attention_dtype(self) -> torch.dtype:
        """The KV cache's and attention's dtype: float32 for a bfloat16 model on a CPU, where torch's one-query
        bf16 attention is 10x slower than float32's (0.67 vs 0.06 ms a layer over 600 keys: 19 ms of a 1.5B
        decoding step). Keys and values are rounded to bf16 first, as they would be in a bf16 cache."""
        return torch.float32 if self.dtype == torch.bfloat16 and self.device.type == "cpu" else self.dtype

    def new_cache(self, max_len: int, batch: int = 1) -> KVCache:
        max_len = min(max_len, self.cfg.max_position_embeddings)
        return KVCache(
            self.cfg.num_hidden_layers, self.cfg.num_key_value_heads, self.cfg.head_dim, max_len,
            batch=batch, dtype=self.attention_dtype, device=self.device,
        )

    def new_batch_cache(self, rows: int, max_len: int, slack: int) -> BatchKVCache:
        """A cache of `rows` sequences of up to max_len tokens (capped at the context) + `slack` scratch slots."""
        cfg = self.cfg
        return BatchKVCache(
            cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, min(max_len, cfg.max_position_embeddings),
            rows=rows, slack=slack, dtype=self.attention_dtype, device=self.device,
        )

    @torch.inference_mode()
    def forward(
        self,
        tokens: Tensor,
        cache: KVCache,
        *,
        last_n: int | None = None,
        positions: Tensor | None = None,
        tree_mask: Tensor | None = None,
        layers: int | None = None,
        features: Tensor | None = None,
        hidden: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The CausalLM forward, plus the options the proposers need:

        positions  [T] offsets from cache.length (default 0..T-1): tokens of parallel branches share positions
        tree_mask  [T, K + T] bool, which of the last K cached tokens and of the new tokens each new token sees
                   (default causal, K = 0); the tokens before those are always seen
        layers     run only the first `layers` blocks, then the final norm and LM head (self-speculation)
        features   [B, T, F] per-token inputs beside the tokens, for models whose `inputs` reads them (EAGLE)
        hidden     also return the last block's output [B, T, H] (all T positions, before the final norm): the
                   features a feature-level drafter reads; computed anyway, so free. With `feature_layers` set,
                   the outputs after those blocks come first: [B, T, (len(feature_layers) + 1) * H]
        """
        t = tokens.shape[1]
        start = cache.length
        pos = start + (torch.arange(t) if positions is None else positions.to(torch.long).cpu())  # [T], absolute
        if tree_mask is not None:
            prefix = torch.ones(t, start + t - tree_mask.shape[1], dtype=torch.bool, device=tokens.device)
            mask = torch.cat([prefix, tree_mask.to(device=tokens.device, dtype=torch.bool)], dim=1)
        elif t > 1:  # query i (absolute position start + i) sees keys 0 .. start + i
            mask = torch.ones(t, start + t, dtype=torch.bool, device=tokens.device).tril(start)
        else:  # a single token sees everything
            mask = None
        key_pos = torch.cat([torch.arange(start), pos])  # [S]: the cached keys sit at their positions (see layer_plan)
        plan = self.layer_plan(pos, key_pos, mask, tokens.shape[0])
        x, features_out = self.run_layers(self.inputs(tokens, features), cache, plan, layers, hidden)
        logits = self.lm_head(self.norm(x if last_n is None else x[:, -last_n:]))
        return (logits, features_out) if hidden else logits

    def run_layers(self, x: Tensor, cache: Any, plan: list[tuple[Tensor, Tensor, Attend]],
                   layers: int | None = None, tap: bool = False) -> tuple[Tensor, Tensor]:
        """The first `layers` blocks (default all) over x [B, T, H], writing their keys and values to `cache` (a
        KVCache, a batch cache's row or rows view): in one compiled call where every block would run whole in its
        own (kernels/layer.cpp), else block by block. Both give the same bits. Returns the output and the features
        `forward(hidden=True)` returns: with `tap`, the outputs after the first k blocks for each k in
        `feature_layers` below `layers` before it, concatenated; else the output itself."""
        n = len(self.layers) if layers is None else layers
        cuts = [k for k in self.feature_layers if 0 < k < n] if tap else []
        taps: list[Tensor] = []
        stack = self._layer_stack(x, plan, n)
        if stack is None:
            for i in range(n):
                if i in cuts:
                    taps.append(x)
                x = self.layers[i](x, i, cache, *plan[i])
        else:
            cos, sin, attend = plan[0]
            batch, t, width = x.shape
            index, slots, read = attend.cache_plan(cache, batch, t)
            cos, sin = (c.reshape(-1, t, self.cfg.head_dim).contiguous() for c in (cos, sin))
            k, v = cache.buffers()
            rows = x.reshape(batch * t, width).contiguous()
            start = 0
            for end in [*cuts, n]:  # one call, or one a segment between the taps
                rows = stack.run(end, rows, cos, sin, k, v, index, slots, read, attend.mask, start)
                if end < n:
                    taps.append(rows.view(batch, t, width))
                start = end
            x = rows.view(batch, t, width)
        return x, torch.cat([*taps, x], -1) if taps else x

    def _layer_stack(self, x: Tensor, plan: list[tuple[Tensor, Tensor, Attend]], n: int) -> Any | None:
        """The compiled LayerStack of this model's blocks where the first n run in it: all w4a8, float32 activations,
        one kernel attention and one rope for every layer. None elsewhere (or under $VERISPEC_LAYER=python)."""
        from verispec.models.kernels import layer_kernel

        if (n == 0 or x.dtype != torch.float32 or not isinstance(plan[0][2], KernelAttend)
                or any(p is not plan[0] for p in plan[1:n]) or not self.layers[0].w4a8):
            return None
        kernel = layer_kernel()
        if kernel is None:
            return None
        built = self._stack
        # each block's q/k/v weights, read from the modules' dicts: nn.Module attribute lookups cost ~25 us a forward
        weights = [b._modules["wqkv"]._buffers.get("weight") for b in self.layers]
        if built is None or built[1] is not kernel or any(a is not b for a, b in zip(built[0], weights)):
            if not all(b.w4a8 for b in self.layers):
                return None
            ops, eps = zip(*(b.stack_operands() for b in self.layers))
            stack = kernel.LayerStack([t for o in ops for t in o], [e for pair in eps for e in pair],
                                      self.cfg.num_attention_heads, self.cfg.num_key_value_heads)
            built = self._stack = (weights, kernel, stack)  # rebuilt when the weights or the build change
        return built[2]

    def layer_plan(self, pos: Tensor, key_pos: Tensor, mask: Tensor | None,
                   batch: int) -> list[tuple[Tensor, Tensor, Attend]]:
        """Each layer's rope rows (cos, sin) and attention for one forward.

        pos      [T] (or [B, T], a row per sequence): the new tokens' absolute positions
        key_pos  [S] (or [B, S]): the position of each key slot the forward reads
        mask     [T, S] (or [B, 1, T, S]) bool: which keys each query sees; None: one token that sees them all

        A sliding layer (Gemma's local ones) also hides the keys `sliding_window` or more positions behind the
        query: a mask over positions, so that rolled-back drafts and tree slots need nothing more. A committed key
        sits at the position of its slot; the slots that do not (a drafter's provisional tree nodes, at most a tree
        deep) are the query's nearest keys, never at the window's edge.
        """
        cfg = self.cfg
        if int(pos.max()) >= self.cos.shape[0]:
            raise CacheFullError(f"position {int(pos.max())} is past the model's context of {self.cos.shape[0]}")

        def rope(cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
            c, s = (table[pos.to(table.device)].to(self.dtype) for table in (cos, sin))
            return (c[:, None], s[:, None]) if pos.dim() == 2 else (c, s)  # [B, 1, T, D]: broadcast over heads

        full = (*rope(self.cos, self.sin),
                attention(mask, batch, self.attention_dtype, self.device, cfg.attention_scale))
        if cfg.sliding_window is None:
            return [full] * cfg.num_hidden_layers
        near = (pos[..., :, None] - key_pos[..., None, :]) < cfg.sliding_window  # [T, S] or [B, T, S]
        near = near.to(self.device)
        if pos.dim() == 2:
            near = near[:, None]
        attend = full[2]
        if not bool(near.all()):
            local_mask = near if mask is None else mask.to(self.device) & near
            attend = attention(local_mask, batch, self.attention_dtype, self.device, cfg.attention_scale)
        local = (*rope(self.cos_local, self.sin_local), attend) if self.cos_local is not None else (*full[:2], attend)
        return [local if cfg.sliding(i) else full for i in range(cfg.num_hidden_layers)]

    def inputs(self, tokens: Tensor, features: Tensor | None) -> Tensor:
        """The first block's input [B, T, H]: the token embeddings (a drafter that also reads features overrides
        this)."""
        if features is not None:
            raise ValueError(f"{type(self).__name__} takes no input features")
        return self.embed_tokens(tokens)

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def random(cls, cfg: LlamaConfig, *, seed: int = 0, std: float = 0.02, dtype: torch.dtype = torch.float32) -> "LlamaModel":
        """A randomly initialised model, for tests; a larger std gives peakier next-token distributions."""
        gen = torch.Generator().manual_seed(seed)
        model = cls(cfg)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
                else:
                    param.copy_(std * torch.randn(param.shape, generator=gen))
        return model.to(dtype).eval()

    @classmethod
    def from_hf_dir(cls, path: str | Path, *, dtype: torch.dtype = torch.bfloat16, device: str = "cpu") -> "LlamaModel":
        """Load config.json + *.safetensors (HF parameter names) from a Hugging Face style directory."""
        from safetensors import safe_open

        path = Path(path)
        cfg = LlamaConfig.from_hf(json.loads((path / "config.json").read_text()))
        files = hf_weight_files(path)
        if not files:
            raise FileNotFoundError(f"no .safetensors files in {path}")
        with torch.device("meta"):
            model = cls(cfg)
        hf: dict[str, Tensor] = {}
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for key in f.keys():
                    hf[key] = f.get_tensor(key)
        state = _hf_to_native(hf, cfg)
        del hf
        state = {k: v.to(dtype) for k, v in state.items()}
        model.load_state_dict(state, strict=False, assign=True)
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed.weight
        missing = [n for n, p in model.named_parameters() if p.is_meta]
        if missing:
            raise ValueError(f"checkpoint in {path} lacks {missing[:3]}...")
        model.init_rope()
        return model.to(device).eval()


def _hf_to_native(hf: dict[str, Tensor], cfg: LlamaConfig) -> dict[str, Tensor]:
    """Map HF Llama/Qwen2/Gemma3 parameter names onto the fused native layout."""
    out = {"embed.weight": hf["model.embed_tokens.weight"], "norm.weight": hf["model.norm.weight"]}
    if "lm_head.weight" in hf:
        out["lm_head.weight"] = hf["lm_head.weight"]
    elif not cfg.tie_word_embeddings:
        out["lm_head.weight"] = hf["model.embed_tokens.weight"]
    for i in range(cfg.num_hidden_layers):
        out.update({f"layers.{i}.{k}": v for k, v in hf_block_to_native(hf.__getitem__, cfg, i).items()})
    return out


def hf_weight_files(path: Path) -> list[Path]:
    """A Hugging Face style directory's weight files, in name order: its *.safetensors but verispec's own caches
    (verispec-*), which sit beside them."""
    return sorted(f for f in path.glob("*.safetensors") if not f.name.startswith("verispec-"))


def hf_block_to_native(get: Callable[[str], Tensor], cfg: LlamaConfig, i: int) -> dict[str, Tensor]:
    """Block i's parameters by their native (fused) names within the block, each HF tensor read by `get`."""
    pre = f"model.layers.{i}."
    att, mlp = pre + "self_attn.", pre + "mlp."
    out = {"wqkv.weight": torch.cat([get(att + f"{n}_proj.weight") for n in "qkv"])}
    if cfg.attention_bias:
        out["wqkv.bias"] = torch.cat([get(att + f"{n}_proj.bias") for n in "qkv"])
    out["wo.weight"] = get(att + "o_proj.weight")
    out["w13.weight"] = torch.cat([get(mlp + "gate_proj.weight"), get(mlp + "up_proj.weight")])
    out["w2.weight"] = get(mlp + "down_proj.weight")
    out["attn_norm.weight"] = get(pre + "input_layernorm.weight")
    if not cfg.sandwich_norms:  # Llama: the norm after attention is the MLP's input norm
        out["ffn_norm.weight"] = get(pre + "post_attention_layernorm.weight")
        return out
    # Gemma: post_attention_layernorm is the attention output's own norm; the MLP's input norm is another
    out["post_attn_norm.weight"] = get(pre + "post_attention_layernorm.weight")
    out["ffn_norm.weight"] = get(pre + "pre_feedforward_layernorm.weight")
    out["post_ffn_norm.weight"] = get(pre + "post_feedforward_layernorm.weight")
    if cfg.qk_norm:
        out["q_norm.weight"] = get(att + "q_norm.weight")
        out["k_norm.weight"] = get(att + "k_norm.weight")
    return out
