"""Does the drafter's first guess get worse with more context than its 256-token training sequences?
Held-out shard: agreement at positions 256..511 of two consecutive sequences joined, against the same tokens as
their own 256-token sequence."""
import sys, torch
from safetensors.torch import load_file
from verispec.models.eagle import load_drafter
from verispec.models.load import load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.models.llama import last_block
import torch.nn.functional as F
target = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
kind = sys.argv[3] if len(sys.argv) > 3 else None
dr = load_drafter(sys.argv[1], target.model, quantize_kind=kind)
dr.eval()
print(kind, {type(m).__name__ for m in dr.modules()})
val = load_file(sys.argv[2])
tok, feat = val["tokens"].long(), val["features"].float()
head = load_drafter(sys.argv[1], target.model).lm_head.weight.float()  # the teacher's rows, float
def agree(t, f):
    with torch.no_grad():
        pred = dr.train_unrolled(t, f, 1)[0]
        last = last_block(f[:, 1:], dr.eagle.hidden_size)
        teach = F.linear(dr.norm(last), head).argmax(-1)
        return (dr.lm_head(dr.norm(pred)).argmax(-1) == teach).float()  # [B, T-1]
alone = agree(tok, feat)  # [16, 255]
joined = agree(torch.cat([tok[:-1], tok[1:]], 1), torch.cat([feat[:-1], feat[1:]], 1))  # [15, 511]
a = alone[1:, 32:].mean().item(); j = joined[:, 256 + 32:].mean().item()
print(f"positions 32-254 of sequences 1-15: alone {a:.3f}, after 256 tokens of the previous sequence {j:.3f}")
print(f"first 32 positions alone {alone[1:, :32].mean().item():.3f}, joined {joined[:, 256:288].mean().item():.3f}")
