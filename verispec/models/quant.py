"""Weight-only quantized linear layers: int8 (per-output-channel scales) and int4 (groupwise, asymmetric).

On this kind of CPU a 1-token matmul is bound by reading weights, and PyTorch's int8- and int4-weight
kernels read a half / about a third of the bytes of bf16, so they are faster there (less so, or slower, for
many tokens at once). A draft model runs one token at a time and its precision is free: losslessness depends
on the target only. A quantized *target* is a different model: speculative output is then lossless relative
to that model as run, which is what `--dtype int8|int4` means.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from verispec.models.llama import LlamaModel

QUANTIZED = ("int8", "int4", "w8a8", "w4a8", "w4a8-4bit", "w4a8-3bit")
INT4_GROUP = 32  # the sub-block of GGUF's Q4_K: its 4-bit grids requantize with little extra error


class Int8Linear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()  # [N, K]
        scale = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0
        self.register_buffer("weight", (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(torch.bfloat16))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(torch.bfloat16), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


class Int4Linear(nn.Module):
    """4-bit weights in groups of `group` along the input: w = (q - 8) * scale + zero, q in 0..15, with the
    group's min and max on the grid. PyTorch's CPU kernel wants N % 16 == 0 and K % group == 0."""

    def __init__(self, linear: nn.Linear, group: int = INT4_GROUP) -> None:
        super().__init__()
        n, k = linear.out_features, linear.in_features
        w = linear.weight.detach().float().reshape(n, k // group, group)
        lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15.0).clamp_min(1e-8)
        q = ((w - lo) / scale).round().clamp(0, 15).reshape(n, k).to(torch.int32)
        zero = lo + 8.0 * scale
        self.register_buffer("weight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        sz = torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous()  # [K / group, N, 2]
        self.register_buffer("scales_and_zeros", sz.to(torch.bfloat16))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(torch.bfloat16), requires_grad=False)
        self.in_features, self.out_features, self.group = k, n, group

    @staticmethod
    def fits(linear: nn.Linear, group: int = INT4_GROUP) -> bool:
        return linear.out_features % 16 == 0 and linear.in_features % group == 0

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.weight, self.group, self.scales_and_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


class RowInt8Linear(nn.Module):
    """int8 weights (per output channel) times int8 activations (per token): fbgemm's VNNI GEMM, which costs
    about the same for 1 to 8 tokens, so verification stays as cheap as a decoding step.

    fbgemm quantizes its input with one affine scale for the whole batch, which would make a token's result
    depend on the other tokens in the forward (the drafts after it). So each row is first mapped affinely
    onto exactly [-1, 1]: every batch then gets the same quantization, row by row, and with integer
    accumulation a row's output is bit-identical whatever else is in the batch. The shift is undone with the
    weights' column sums: y = s * (x' W^T) + c * sum_k W[:, k], where x = s * x' + c.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()  # [N, K]
        scale = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0
        self.register_buffer("weight", (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().float(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._packed: Any = None
        self._colsum: Tensor | None = None

    def pack(self) -> None:
        import warnings

        with warnings.catch_warnings():  # torch's quantized-tensor constructors warn of a future deprecation
            warnings.simplefilter("ignore")
            q = torch._make_per_channel_quantized_tensor(
                self.weight, self.scales.double(), torch.zeros_like(self.scales, dtype=torch.long), 0)
            self._packed = torch.ops.quantized.linear_prepack(q, None)
        # sum_k W[:, k] = scale * (exact integer row sum): no float copy of the weights (it took 10 s at start-up)
        self._colsum = self.weight.sum(dim=1, dtype=torch.int32).float() * self.scales

    def forward(self, x: Tensor) -> Tensor:
        if self._packed is None:
            self.pack()
        flat = x.reshape(-1, self.in_features).float()
        hi, lo = flat.amax(-1, keepdim=True), flat.amin(-1, keepdim=True)
        shift, span = (hi + lo) / 2, ((hi - lo) / 2).clamp_min(1e-20)
        y = torch.ops.quantized.linear_dynamic((flat - shift) / span, self._packed, False)
        y = y * span + shift * self._colsum
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def affine_groups(w: Tensor, levels: int, group: int = 32) -> tuple[Tensor, Tensor, Tensor]:
    """[N, K] -> q [N, K] uint8 in 0..levels, and fp16 scale and offset [N, K / group] with w ~ s * q + o.

    The group's min is the offset. The step is (max - min) / levels, unless the group's values already sit on a
    coarser grid that spans fewer levels (a GGUF Q4_K group whose codes skip 0 or 15): its step, the smallest
    gap between two of its values, is then kept, so such weights are reproduced rather than re-quantized."""
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    step = (hi - lo) / levels
    if levels < group:  # a group can show every level of a 4-bit grid, so a gap can reveal its step
        srt = g.sort(-1).values
        gaps = srt.diff(dim=-1)
        gap = torch.where(gaps > (hi - lo)[..., None] * 1e-3, gaps, torch.inf).amin(-1)
        span = ((hi - lo) / gap).round()
        fits = (span < levels) & (span > 0) & torch.isfinite(gap)
        step = torch.where(fits, (hi - lo) / span.clamp_min(1), step)
    s = torch.where(hi > lo, step, 1.0).half().clamp_min(2**-24)  # a constant group: any step, q = 0
    o = lo.half()
    q = ((g - o.float()[..., None]) / s.float()[..., None]).round().clamp(0, levels).to(torch.uint8)
    return q.reshape(n, k), s, o


def on_4bit_grid(w: Tensor, group: int = 32) -> bool:
    """Whether a 4-bit grid per group holds these weights: true of GGUF's Q4_K tensors (dequantized, rounded to
    bf16), false of Q6_K, Q8_0 or full-precision ones."""
    return grid_holds(w, *affine_groups(w, 15, group), group=group)


def grid_holds(w: Tensor, q: Tensor, s: Tensor, o: Tensor, *, group: int = 32) -> bool:
    """Whether the codes q with scales s and offsets o (affine_groups) reproduce w: in 9 groups of 10 they err by
    under a tenth of a step (a weight off the grid errs by ~0.29 of a step, RMS)."""
    n, k = w.shape
    err = q.reshape(n, k // group, group).float() * s.float()[..., None] + o.float()[..., None] - w.reshape(n, k // group, group)
    rel = err.square().mean(-1).sqrt() / s.float()
    return bool((rel < 0.1).float().mean() >= 0.9)


UNIT_GROUPS = 8  # groups of 32 inputs whose step and offset codes share a unit (kernels/w4a8.cpp kUnitGroups)


def unit_codes(s: Tensor, o: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-group steps s (> 0) and offsets o [N, G] as the kernel stores them: 8-bit codes on a bf16 unit per
    UNIT_GROUPS groups. Returns the decoded step and offset [N, G] float32 (exactly what the kernel computes), the
    codes [N, G, 2] uint8 (a in 0..255, b in -127..127 as its two's complement) and the units [N, U, 2] bf16."""
    n, g = s.shape
    u = -(-g // UNIT_GROUPS)
    pad = u * UNIT_GROUPS - g

    def split(v: Tensor, top: int) -> tuple[Tensor, Tensor]:
        blocks = torch.nn.functional.pad(v.float(), (0, pad)).reshape(n, u, UNIT_GROUPS)
        exact = blocks.abs().amax(-1) / top  # [N, U]: the largest value's code is `top`
        unit = exact.bfloat16().float()
        up = unit < exact  # rounded down: the next bf16 up, so that no code passes `top`
        unit = torch.where(up, (unit.view(torch.int32) + 0x10000).view(torch.float32), unit)
        unit = torch.where(unit > 0, unit, torch.ones_like(unit))  # all zero: any unit
        code = (blocks / unit[..., None]).round().clamp(-top, top)
        return code.reshape(n, -1)[:, :g], unit

    a, su = split(s, 255)
    a = a.clamp_min(1)  # a step never decodes to 0
    b, ou = split(o, 127)
    step = a * su.repeat_interleave(UNIT_GROUPS, 1)[:, :g]
    offset = b * ou.repeat_interleave(UNIT_GROUPS, 1)[:, :g]
    codes = torch.stack([a.to(torch.uint8), b.to(torch.int8).view(torch.uint8)], -1)
    return step, offset, codes, torch.stack([su, ou], -1).bfloat16()


def w4a8_grid(w: Tensor, levels: int, groups: tuple[Tensor, Tensor, Tensor] | None = None,
              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """[N, K] weights -> codes q [N, K] in 0..levels on the decoded grid of `unit_codes` (q re-rounded to it, so
    that a step's 8-bit code does not shift a group's weights), that grid's step and offset [N, K / 32], and the
    stored step/offset codes and units. groups: affine_groups(w, levels) where already computed."""
    n, k = w.shape
    _, s, o = groups if groups is not None else affine_groups(w, levels)
    step, offset, codes, units = unit_codes(s.float(), o.float())
    q = ((w.reshape(n, k // 32, 32) - offset[..., None]) / step[..., None]).round().clamp(0, levels)
    return q.reshape(n, k).to(torch.uint8), step, offset, codes, units


class W4A8Linear(nn.Module):
    """4-bit weights (groups of 32, w = s * q + o) times per-row int8 activations, on verispec's kernel
    (kernels/w4a8.cpp: an AVX-512 VNNI build and a bit-identical AVX2 one, picked from the CPU's flags). It
    reads 0.58 bytes a weight at 4 bits (bf16 reads 2; GGUF's Q4_K 0.56), and with VNNI a 5-token verification costs little more
    than a 1-token step (AVX2 takes about twice the instructions per product, so there its many-row matmuls are
    slower). `bits=None` gives 6 bits to a matrix that a 4-bit grid would coarsen (GGUF's Q6_K tensors), so a
    target converted from Q4_K/Q6_K keeps about its precision: 0.83 bytes a weight where 8 bits read 1.08 (the
    LM head and half the down projections are a third of the 1.5B target's bytes). A row's output does not
    depend on the other rows in the forward: greedy speculation equals plain decoding bit for bit."""

    def __init__(self, linear: nn.Linear, bits: int | None = None) -> None:
        super().__init__()
        n, k = linear.out_features, linear.in_features
        np_, kp = -(-n // 16) * 16, -(-k // 32) * 32  # the kernel's tiles; only tiny test models need the padding
        self.bits = bits or 4  # on the meta device the cached weights' shapes decide (_load_from_state_dict)
        g, u = kp // 32, -(-kp // (32 * UNIT_GROUPS))
        if linear.weight.device.type == "meta":  # shapes only (ops on meta tensors import torch's decompositions)
            packed = torch.empty(np_ // 16, kp // 8, 64, dtype=torch.uint8, device="meta")
            codes = torch.empty(np_ // 16, g, 32, dtype=torch.uint8, device="meta")
            units = torch.empty(np_ // 16, u, 32, dtype=torch.bfloat16, device="meta")
            bias = None if linear.bias is None else torch.empty(np_, device="meta")
        else:
            w = torch.nn.functional.pad(linear.weight.detach().float(), (0, kp - k, 0, np_ - n))
            groups = affine_groups(w, 2**self.bits - 1)
            if bits is None and not grid_holds(w, *groups):  # a matrix that a 4-bit grid would coarsen
                self.bits, groups = 6, None
            q, _, _, codes, units = w4a8_grid(w, 2**self.bits - 1, groups)
            packed = self.pack(q, self.bits)
            # [N, G, 2] -> [N / 16, G, 32]: a block's 16 columns' step codes, then their offset codes (units alike)
            codes, units = (t.reshape(np_ // 16, 16, -1, 2).permute(0, 2, 3, 1).reshape(np_ // 16, -1, 32).contiguous()
                            for t in (codes, units))
            bias = None if linear.bias is None else torch.nn.functional.pad(linear.bias.detach().float(), (0, np_ - n))
        self.register_buffer("weight", packed)
        self.register_buffer("codes", codes)
        self.register_buffer("units", units)
        self.register_buffer("bias", bias)
        self.in_features, self.out_features, self._padded = k, n, (kp, np_)

    @staticmethod
    def pack(q: Tensor, bits: int) -> Tensor:
        """[N, K] codes -> the kernel's layout: 16 columns a vector, 4 consecutive inputs a lane (see w4a8.cpp)."""
        n, k = q.shape
        if bits == 8:
            return q.reshape(n // 16, 16, k // 4, 4).permute(0, 2, 1, 3).reshape(n // 16, k // 4, 64).contiguous()
        if bits == 3:  # per group of 32 inputs: the low 2 bits as 2 blocks of 2-bit fields, then a block of top bits
            low = W4A8Linear.fields2(q & 3)
            # top bits: block, group, lane, byte j, bit f = input 4 f + j
            top = (q >> 2).reshape(n // 16, 16, k // 32, 8, 4).permute(0, 2, 1, 4, 3).to(torch.int32)
            top = (top << torch.arange(8, dtype=torch.int32)).sum(-1).to(torch.uint8)
            return torch.cat([low, top.reshape(n // 16, k // 32, 64)], -1).reshape(n // 16, 3 * k // 32, 64)
        if bits == 6:  # per group of 32 inputs: the low nibbles as 4 bits, then 2 blocks of the top 2 bits
            low = W4A8Linear.pack(q & 15, 4).reshape(n // 16, k // 32, 256)
            top = W4A8Linear.fields2(q >> 4)
            return torch.cat([low, top], -1).reshape(n // 16, 3 * k // 16, 64)
        qb = q.reshape(n // 16, 16, k // 8, 2, 4).permute(0, 2, 1, 4, 3)  # block, octet, lane, byte, nibble
        return (qb[..., 0] | (qb[..., 1] << 4)).reshape(n // 16, k // 8, 64).contiguous()

    @staticmethod
    def fields2(q: Tensor) -> Tensor:
        """[N, K] 2-bit values -> [N / 16, K / 32, 128]: per group of 32 inputs 2 blocks, byte 4 * lane + j of block p
        holding, from bit 0 up, inputs 16 p + 4 f + j for f = 0..3 (the 6-bit layout's top bits, the 3-bit one's low)."""
        n, k = q.shape
        # block, group, plane p, lane, byte j, field f
        f = q.reshape(n // 16, 16, k // 32, 2, 4, 4).permute(0, 2, 3, 1, 5, 4)
        return (f[..., 0] | (f[..., 1] << 2) | (f[..., 2] << 4) | (f[..., 3] << 6)).reshape(n // 16, k // 32, 128)

    def _load_from_state_dict(self, state: dict, prefix: str, *args: Any) -> None:
        """A cached matrix may hold 3-, 6- or 8-bit codes where this module was built (on the meta device) for 4."""
        saved = state.get(prefix + "weight")
        if saved is not None and saved.shape != self.weight.shape:
            kp = self._padded[0]
            self.bits = {kp // 4: 8, 3 * kp // 16: 6, 3 * kp // 32: 3}.get(saved.shape[1], 4)
            self.weight = torch.empty(saved.shape, dtype=saved.dtype, device=self.weight.device)
        super()._load_from_state_dict(state, prefix, *args)

    @property
    def unpadded(self) -> bool:
        """Whether the kernel's tiles fit the matrix exactly (true of real models), so its operands are the layer."""
        return self._padded == (self.in_features, self.out_features)

    def operands(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The kernel's arguments after the activations: packed weights, step/offset codes, their units, bias
        (empty: none)."""
        bias = self.bias if self.bias is not None else torch.empty(0)
        return self.weight, self.codes, self.units, bias

    def forward(self, x: Tensor, *, split: bool = False) -> Tensor:
        """x W^T + b in float32; split: each row sent as two int8 rows, its codes and their residual (the kernel's
        w4a8_mm_split, for inputs with outlier dimensions: eagle.TwoRowInt8Linear)."""
        from verispec.models.kernels import w4a8

        flat = x.reshape(-1, self.in_features).float()
        kp, np_ = self._padded
        flat = torch.nn.functional.pad(flat, (0, kp - self.in_features)) if kp != self.in_features else flat.contiguous()
        kernel = w4a8()
        y = (kernel.w4a8_mm_split if split else kernel.w4a8_mm)(flat, *self.operands())
        if np_ != self.out_features:
            y = y[:, : self.out_features]
        return y.reshape(*x.shape[:-1], self.out_features)


def w4a8_bits(kind: str, name: str) -> int | None:
    """A w4a8 kind's bits for the linear `name` (None: 4, or 6 where a 4-bit grid would coarsen it): w4a8-4bit 4
    everywhere; w4a8-3bit 3 for the MLP (w13, w2: ~3/4 of a Qwen2.5 layer's weights) and 4 for the rest, a draft's
    layout (it changes acceptance only, never the output)."""
    if kind == "w4a8-3bit":
        return 3 if name in ("w13", "w2") else 4
    return 4 if kind == "w4a8-4bit" else None


def quantize(model: nn.Module, kind: str = "int8") -> nn.Module:
    """Replace every nn.Linear (including a tied LM head, which gets its own copy) in place; the model
    must run in bfloat16 activations afterwards. int4 falls back to int8 for a layer its kernel cannot take."""
    from verispec.models.llama import Block, LlamaModel

    if kind not in QUANTIZED:
        raise ValueError(f"unknown quantization {kind!r}; choose from {', '.join(QUANTIZED)}")
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                if kind == "w8a8":
                    setattr(module, child_name, RowInt8Linear(child))
                    continue
                if kind.startswith("w4a8"):
                    setattr(module, child_name, W4A8Linear(child, bits=w4a8_bits(kind, child_name)))
                    continue
                four = kind == "int4" and Int4Linear.fits(child)
                setattr(module, child_name, Int4Linear(child) if four else Int8Linear(child))
    for block in model.modules():
        if isinstance(block, Block):
            linears = (block.wqkv, block.wo, block.w13, block.w2)
            # kernels/layer.cpp computes a Llama layer; a Gemma layer (its norms, GELU gate, attention scale and
            # window) runs its w4a8 linears from the torch path instead
            block.w4a8 = block.plain and all(isinstance(m, W4A8Linear) and m.unpadded for m in linears)
    if kind.startswith("w4a8") and isinstance(model, LlamaModel):
        compact_embedding(model)
    return model


def compact_embedding(model: "LlamaModel") -> bool:
    """Keep a float32 model's embedding table in bfloat16 when that loses nothing (weights converted from a GGUF
    are bf16 values): rows are widened back to float32 as they are looked up, so the model computes the same
    bits, and the table costs half (the 1.5B target's 0.93 GB -> 0.47 GB, the 0.5B draft's 0.54 -> 0.27)."""
    w = model.embed.weight
    if w.device.type == "meta" or w.dtype != torch.float32:
        return False
    narrow = w.detach().to(torch.bfloat16)
    rows = 4096  # compared in slices: a whole float32 copy of the table would cost what compacting saves
    if not all(torch.equal(narrow[i : i + rows].float(), w[i : i + rows]) for i in range(0, w.shape[0], rows)):
        return False
    model.embed.weight = nn.Parameter(narrow, requires_grad=False)
    return True


def quantize_int8(model: nn.Module) -> nn.Module:
    return quantize(model, "int8")


# cache files of layouts since replaced (w4a8 with an fp16 step and offset per group, until 2026-11-26)
SUPERSEDED = {"w4a8": ("verispec-w4a8-q6.safetensors",), "w4a8-4bit": ("verispec-w4a8-4bit.safetensors",)}


def cache_file(kind: str) -> str:
    return {"int8": "verispec-int8.safetensors", "w8a8": "verispec-w8a8.safetensors",
            "w4a8": "verispec-w4a8-q6-u8.safetensors", "w4a8-4bit": "verispec-w4a8-4bit-u8.safetensors",
            "w4a8-3bit": "verispec-w4a8-3bit-mlp.safetensors"}.get(
        kind, f"verispec-int4-g{INT4_GROUP}.safetensors")


def load_quantized_llama(path: Path, kind: str = "int8", dtype: torch.dtype = torch.bfloat16) -> "LlamaModel":
    """A native model with quantized linears, from `path`'s cached quantized weights when present (quantizing
    costs seconds per start), else quantized now and cached when the directory is writable."""
    from verispec.models.files import aligned_safetensors, read_safetensors
    from verispec.models.llama import LlamaConfig, LlamaModel

    if kind == "w8a8" or kind.startswith("w4a8"):
        dtype = torch.float32  # activations stay float32 between the integer matmuls
    cached = path / cache_file(kind)
    if cached.is_file():
        cfg = LlamaConfig.from_hf(json.loads((path / "config.json").read_text()))
        with torch.device("meta"):
            model = quantize(LlamaModel(cfg).to(dtype), kind)
        # mapped: every tensor a 64-byte aligned view of the page cache (the kernels' vector loads need it)
        model.load_state_dict(read_safetensors(cached), strict=True, assign=True)
        model.init_rope()
        # a cache written before tables were kept in bf16, or before tensors were aligned: rewrite it once
        if compact_embedding(model) or not aligned_safetensors(cached):
            _save(model, cached)
        return _packed(model.eval())
    import sys

    print(f"quantizing {path.name} to {kind} (once; cached in {cached.name})...", file=sys.stderr)
    model = quantize(LlamaModel.from_hf_dir(path, dtype=dtype), kind)
    _save(model, cached)
    for old in SUPERSEDED.get(kind, ()):  # an earlier layout's cache of the same model: never read again
        (path / old).unlink(missing_ok=True)
    return _packed(model)


def _save(model: nn.Module, cached: Path) -> None:
    """Write the quantized model's cache file atomically (a file of this process's own first: server replicas
    starting side by side may all quantize); a read-only model directory just goes without."""
    from verispec.models.files import write_safetensors

    tmp = cached.with_suffix(f".tmp-{os.getpid()}")
    try:
        write_safetensors(tmp, model.state_dict())
        os.replace(tmp, cached)
    except OSError:
        tmp.unlink(missing_ok=True)


def _packed(model: nn.Module) -> nn.Module:
    """Pack w8a8 weights for fbgemm now (about 6 s for the 1.5B model), while loading, so that a server's first
    request or a user's first token does not wait for it. The packed form cannot be cached: torch serialises
    it unpacked."""
    for m in model.modules():
        if isinstance(m, RowInt8Linear):
            m.pack()
    return model


def load_int8_llama(path: Path, dtype: torch.dtype = torch.bfloat16) -> "LlamaModel":
    return load_quantized_llama(path, "int8", dtype)


def truncate_head(model: nn.Module, keep: int) -> nn.Module:
    """Keep only the first `keep` rows of the LM head (a draft-only saving: byte-level BPE ids are roughly in
    merge order, so the first ids are the common tokens). The draft then never proposes the other ids; the
    proposers pad its logits with -inf up to the target's vocabulary, and verification stays exact."""
    head = getattr(model, "lm_head", None)
    if head is None:
        raise ValueError("a truncated LM head needs the native Llama-family draft model")
    if not 0 < keep < head.out_features:
        return model
    if isinstance(head, Int4Linear):  # its packed layout is tiled across rows
        raise ValueError("a truncated LM head needs a bfloat16, float32, int8, w8a8 or w4a8 draft, not int4")
    if isinstance(head, W4A8Linear):  # 16 rows a block: keep whole blocks, and the rows past `keep` go unused
        blocks = -(-keep // 16)
        head.weight, head.codes, head.units = (t[:blocks] for t in (head.weight, head.codes, head.units))
        if head.bias is not None:
            head.bias = head.bias[: 16 * blocks]
        head.out_features, head._padded = keep, (head._padded[0], 16 * blocks)
        return model
    if isinstance(head, nn.Linear):
        new = type(head)(head.in_features, keep, bias=head.bias is not None, device=head.weight.device,
                        dtype=head.weight.dtype)
        with torch.no_grad():
            new.weight.copy_(head.weight[:keep])  # a copy: a tied embedding keeps all its rows
            if head.bias is not None:
                new.bias.copy_(head.bias[:keep])
        new.requires_grad_(False)
        model.lm_head = new
        return model
    for name, buf in list(head.named_buffers(recurse=False)):
        if name == "scales_and_zeros":  # int4: [K / group, N, 2]
            setattr(head, name, buf[:, :keep].contiguous())
        else:
            setattr(head, name, buf[:keep].clone())
    if head.bias is not None:
        head.bias = nn.Parameter(head.bias[:keep].clone(), requires_grad=False)
    head.out_features = keep
    if isinstance(head, RowInt8Linear):
        head._packed = None
    return model
