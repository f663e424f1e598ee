"""Weight-only int8 for linear layers (per-output-channel scales).

On this kind of CPU a 1-token matmul is bound by reading weights, and PyTorch's int8-weight kernel reads
half the bytes of bf16, so it is 2-3x faster there (slower for many tokens at once). That suits a draft
model, which runs one token at a time, and its precision is free: losslessness depends on the target only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from verispec.models.llama import LlamaModel


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


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear (including a tied LM head, which gets its own copy) in place; the model
    must run in bfloat16 activations afterwards."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, Int8Linear(child))
    return model


INT8_FILE = "verispec-int8.safetensors"


def load_int8_llama(path: Path, dtype: torch.dtype = torch.bfloat16) -> "LlamaModel":
    """A native model with int8 linears, from `path`'s cached int8 weights when present (quantizing costs
    seconds per start), else quantized now and cached when the directory is writable."""
    from safetensors.torch import load_file, save_file

    from verispec.models.llama import LlamaConfig, LlamaModel

    cached = path / INT8_FILE
    if cached.is_file():
        cfg = LlamaConfig.from_hf(json.loads((path / "config.json").read_text()))
        with torch.device("meta"):
            model = quantize_int8(LlamaModel(cfg))
        model.load_state_dict(load_file(str(cached)), strict=True, assign=True)
        model.init_rope()
        return model.eval()
    model = quantize_int8(LlamaModel.from_hf_dir(path, dtype=dtype))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    tmp = cached.with_suffix(".tmp")
    try:
        save_file(state, str(tmp))
        os.replace(tmp, cached)
    except OSError:  # a read-only model directory: just don't cache
        tmp.unlink(missing_ok=True)
    return model
