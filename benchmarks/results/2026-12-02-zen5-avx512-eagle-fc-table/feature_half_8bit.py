"""The feature half on the w4a8 kernel with 8-bit weights against its bf16 weights, over the target's features of the suite's
first prompt of each category (300 tokens each): the relative error of its output, and how often the drafter's first
guess (teacher-forced over the sequence) changes. python feature_half_8bit.py (the drafter: /tmp/eagle-zen5)."""
import torch, sys
from verispec.models.load import load, default_threads
from verispec.models.packaged import DEFAULT_TARGET
from verispec.models.eagle import load_drafter, TokenTableFc
from verispec.models.quant import W4A8Linear
from verispec.bench.suite import load_prompts
default_threads()
T = load(DEFAULT_TARGET, dtype="w4a8", progress=False); t = T.model; tok = T.tokenizer
dr = load_drafter("/tmp/eagle-zen5", t, quantize_kind="w4a8-4bit")
H = dr.eagle.hidden_size
split = dr.fc
assert isinstance(split, TokenTableFc)
fp = split.feature_part  # Bf16Linear
w = fp.inner.weight.float()
lin = torch.nn.Linear(H, H, bias=False); lin.weight.data = w.clone()
q8 = W4A8Linear(lin, bits=8)
texts = [tok.chat(list(p.messages)) for p in load_prompts("suite", limit=1)]
agree = total = 0
errs = []
for ids in texts:
    ids = ids[:300]
    cache = t.new_cache(len(ids) + 1)
    with torch.no_grad():
        _, h = t.forward(torch.tensor([ids]), cache, hidden=True)
        h = h[0, :-1]  # features h_t, paired with token t+1
        toks = torch.tensor([ids[1:]])
        a = fp(h)
        b = q8(h)
        errs.append(float((a - b).norm() / a.norm()))
        # drafter's first guess from each true pair, both ways (teacher-forced, whole sequence causal)
        outs = []
        for fcv in (fp, q8):
            split.feature_part = fcv
            c2 = dr.new_cache(len(ids) + 1)
            logits = dr.forward(toks, c2, features=h[None])
            outs.append(logits[0].argmax(-1))
        split.feature_part = fp
    agree += int((outs[0] == outs[1]).sum()); total += outs[0].numel()
print(f"feature half: relative error of the 8-bit kernel against bf16 weights {min(errs):.4f}-{max(errs):.4f}; drafter first guess agrees on {agree}/{total} = {agree/total:.4f} positions over {len(texts)} prompts")
print("max |h|", float(h.abs().max()), "rms", float(h.pow(2).mean().sqrt()))
