"""EAGLE's input projection on an AVX2 CPU: float32 (as now), bf16 through llama.Linear (Bf16Linear), bf16 plain F.linear."""
import statistics, sys, torch
import torch.nn.functional as F
from torch import nn
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.models.eagle import load_drafter, Bf16Linear
from verispec.proposers.eagle import EagleProposer
from verispec.engine import GenerationParams, generate
from verispec.bench.suite import load_prompts
default_threads()
target = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
model = target.model
drafter = load_drafter(sys.argv[1], model, quantize_kind="w4a8-4bit")
f32 = drafter.fc
class Plain(nn.Module):
    def __init__(self, fc):
        super().__init__(); self.w = fc.weight.detach().to(torch.bfloat16); self.b = None if fc.bias is None else fc.bias.detach().to(torch.bfloat16)
    def forward(self, x):
        return F.linear(x.to(torch.bfloat16), self.w, self.b).to(x.dtype)
variants = {"f32": f32, "bf16-Linear": Bf16Linear(f32), "bf16-plain": Plain(f32)}
prompts = [p for p in load_prompts("suite") if p.category in ("code_completion", "code_instruct")][:4]
tok = target.tokenizer
res = {k: [] for k in variants}
for rep in range(2):
    for i, p in enumerate(prompts):
        ids = tok.chat(list(p.messages))
        names = list(variants) if (i + rep) % 2 == 0 else list(variants)[::-1]
        for name in names:
            drafter.fc = variants[name]
            out = generate(model, ids, GenerationParams(max_new_tokens=64, gamma=2), EagleProposer(drafter, len(ids) + 80, model.vocab_size))
            m = out.metrics
            res[name].append((m.tokens_per_s, getattr(m, "c", None), m.accepted, m.drafted))
for k, v in res.items():
    print(k, "tok/s", round(statistics.median(x[0] for x in v), 2), "c", [round(x[1], 3) for x in v if x[1] is not None], "acc", sum(x[2] for x in v), "/", sum(x[3] for x in v))
