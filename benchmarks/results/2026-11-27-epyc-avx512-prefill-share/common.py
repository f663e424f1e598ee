"""What the scripts of this folder share: a model of the pair as verispec runs it by default, and its decoder
matmuls by kind with inputs of the right widths."""
import os

import torch

from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head

NONE = torch.empty(0)


def model(which: str):
    """The target ("t", w4a8) or the draft ("d", w4a8-4bit with its 65,536-row head); $DT overrides the dtype."""
    default_threads()
    draft = which == "d"
    m = load(DEFAULT_DRAFT if draft else DEFAULT_TARGET, dtype=os.environ.get("DT", "w4a8-4bit" if draft else "w4a8"),
             progress=False).model
    if draft:
        truncate_head(m, 65536)
    return m


def matmul_kinds(m, rows: int) -> dict:
    """kind -> per layer (weights, codes, units, bias) and an input [rows, K]: layer.cpp's 15 operands a layer."""
    cfg = m.cfg
    ops = [b.stack_operands()[0] for b in m.layers]
    widths = {"qkv": cfg.hidden_size, "o": cfg.num_attention_heads * cfg.head_dim, "w13": cfg.hidden_size,
              "w2": cfg.intermediate_size}
    at = {"qkv": (1, 2, 3, 4), "o": (5, 6, 7, None), "w13": (9, 10, 11, None), "w2": (12, 13, 14, None)}
    return {kind: ([(o[a], o[b], o[c], NONE if d is None else o[d]) for o in ops], torch.randn(rows, widths[kind]))
            for kind, (a, b, c, d) in at.items()}
