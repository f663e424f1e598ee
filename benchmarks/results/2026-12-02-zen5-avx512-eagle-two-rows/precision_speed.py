"""The EAGLE drafter's feature half three ways, over the target's features of the suite's first prompt of each
category (300 tokens each): its error against float32 weights and inputs, how often the drafter's first guess
(teacher-forced) differs from float32's, and its time for one row from cold caches (64 MB read between calls) and
warm (median of 200).

    python precision_speed.py DRAFTER_DIR
"""
import sys
import time

import torch

from verispec.bench.suite import load_prompts
from verispec.models.eagle import Bf16Linear, TwoRowInt8Linear, _float_linear, load_drafter
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET

default_threads()
loaded = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
target, tok = loaded.model, loaded.tokenizer
drafter = load_drafter(sys.argv[1], target, quantize_kind="w4a8-4bit")
split = drafter.fc
H = drafter.eagle.hidden_size
w = load_drafter(sys.argv[1], target).fc.weight.detach().float()[:, H:]
f32 = _float_linear(w)
two = split.feature_part
assert isinstance(two, TwoRowInt8Linear)
variants = {"bf16 weights (torch's linear; until now)": Bf16Linear(_float_linear(w)),
            "8-bit weights, one int8 row (the kernel alone)": two.inner,
            "8-bit weights, two int8 rows (TwoRowInt8Linear)": two}


def features(ids):
    with torch.no_grad():
        return target.forward(torch.tensor([ids]), target.new_cache(len(ids) + 1), hidden=True)[1][0]


texts = [tok.chat(list(p.messages))[:300] for p in load_prompts("suite", limit=1)]
feats = [features(ids)[:-1] for ids in texts]
for name, part in variants.items():
    errs, agree, total = [], 0, 0
    for ids, h in zip(texts, feats):
        with torch.no_grad():
            ref = f32(h)
            errs.append(float((part(h)[1:] - ref[1:]).norm() / ref[1:].norm()))  # position 0 apart (|h| 1484)
            guesses = []
            for p in (f32, part):
                split.feature_part = p
                guesses.append(drafter.forward(torch.tensor([ids[1:]]), drafter.new_cache(len(ids) + 1),
                                               features=h[None])[0].argmax(-1))
            split.feature_part = two
        agree += int((guesses[0] == guesses[1]).sum())
        total += guesses[0].numel()
    print(f"{name}: error against float32 {min(errs):.4f}-{max(errs):.4f}; first guess = float32's at "
          f"{agree}/{total} = {agree / total:.4f}", flush=True)
big = torch.ones(16 << 20)


def median_ms(part, x, cold):
    times = []
    for _ in range(200):
        if cold:
            big.sum()
        t0 = time.perf_counter()
        part(x)
        times.append(time.perf_counter() - t0)
    return sorted(times)[100] * 1e3


x = feats[0][5:6][None]
for name, part in variants.items():
    print(f"{name}: one row {median_ms(part, x, True):.3f} ms cold, {median_ms(part, x, False):.3f} ms warm")
