"""How much of the target's sampled law (T = 0.7) the 0.5B draft catches with some of its linears on a 3-bit grid,
teacher-forced over the target's own sampled continuations (the suite's first prompt of each category, 128 tokens,
seed = prompt index): a fake quantization (each group of 32 weights re-gridded as the kernel's w4a8_grid would, at 8
levels instead of 16, bf16 activations), beside the draft as the default runs it (the w4a8-4bit kernel). Per position
the acceptance of one drafted token, sum_x min(p(x), q(x)), both at T = 0.7, q over the draft's first 65,536 ids.

    python draft_bits.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for draft_temperature's helpers
from draft_temperature import acceptance, logits_of  # noqa: E402

from verispec.bench.suite import load_prompts  # noqa: E402
from verispec.engine import GenerationParams, generate  # noqa: E402
from verispec.models.load import default_threads, load  # noqa: E402
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET  # noqa: E402
from verispec.models.quant import w4a8_grid  # noqa: E402
from verispec.sampling import SamplingParams  # noqa: E402

T = 0.7
default_threads()
target = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
tok = target.tokenizer
seqs = []
for i, p in enumerate(load_prompts("suite", limit=1)):
    ids = tok.chat(list(p.messages))
    out = generate(target.model, ids, GenerationParams(max_new_tokens=128, sampling=SamplingParams(temperature=T),
                                                       seed=i, eos_ids=tuple(tok.eos_ids)))
    s, n = ids + out.token_ids, len(out.token_ids)
    seqs.append((p.category, s, n, torch.softmax(logits_of(target.model, s, n) / T, -1)))
del target


def regrid(levels_of):
    model = load(DEFAULT_DRAFT, dtype="bfloat16", progress=False).model
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            w = mod.weight.detach().float()
            q, step, off, _, _ = w4a8_grid(w, levels_of(name))
            n, k = w.shape
            mod.weight.data = (q.reshape(n, k // 32, 32).float() * step[..., None] + off[..., None]).reshape(n, k).to(
                mod.weight.dtype)
    return model


variants = {
    "w4a8-4bit, as run (the kernel)": lambda: load(DEFAULT_DRAFT, dtype="w4a8-4bit", progress=False).model,
    "3-bit gate/up (w13), 4-bit rest": lambda: regrid(lambda n: 7 if n.endswith("w13") else 15),
    "3-bit MLP (w13, w2), 4-bit rest": lambda: regrid(lambda n: 7 if n.endswith(("w13", "w2")) else 15),
    "3-bit everywhere": lambda: regrid(lambda n: 7),
}
for name, make in variants.items():
    model = make()
    by: dict[str, list[torch.Tensor]] = {}
    for cat, s, n, p in seqs:
        by.setdefault(cat, []).append(acceptance(p, logits_of(model, s, n)[:, :65536], T, 1.0))
    every = torch.cat([torch.cat(v) for v in by.values()])
    print(f"{name}: all {every.mean():.4f} | " + " ".join(f"{c} {torch.cat(v).mean():.3f}" for c, v in by.items()),
          flush=True)
    del model
