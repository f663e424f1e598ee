"""A/B of `auto` variants against `auto` as it is and plain decoding, interleaved per prompt (rotating start), greedy
output checked equal at T = 0. From the repository root, with the variant's patch applied:

    VERISPEC_KERNEL_ISA=avx2 python auto_ab.py copy-length T CATEGORIES LIMIT GAMMA CURVE   # planned-copy-length.patch
    VERISPEC_KERNEL_ISA=avx2 python auto_ab.py pause-margin T CATEGORIES LIMIT GAMMA        # pause-margin.patch

copy-length runs `curve-nolookup` (the draft's lengths planned with CURVE, e.g. 1:1,2:1.05,3:1.12,5:1.45,9:2.6) and
`curve` (that and the planned copy lengths); pause-margin runs `m1.03` and `m1.06` (drafting only above a predicted
1.03x / 1.06x a step). Prints decode tokens/s over `ar`, geometric means of per-prompt ratios, and tau per category.
"""
import os
import statistics as st
import sys
import time

import verispec.strategies as vs
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.sampling import SamplingParams
from verispec.strategies import StrategyOptions, make_proposer
from verispec.theory import interpolate_cost

variant, T, cats, limit, gamma = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(","), int(sys.argv[4]), int(sys.argv[5])
default_threads()
t = load(DEFAULT_TARGET, dtype="w4a8"); d = load(DEFAULT_DRAFT, dtype="w4a8-4bit"); truncate_head(d.model, 65536)
tok = t.tokenizer
ps = [(p.category, tok.chat(list(p.messages))) for p in load_prompts("suite", categories=cats, limit=limit)]
ctx = 64 if os.environ.get("VERISPEC_KERNEL_ISA", "") in ("avx2", "avxvnni") else None
default_cost = vs.verify_cost_of
if variant == "copy-length":
    curve = interpolate_cost([(int(k), float(v)) for k, v in (x.split(":") for x in sys.argv[6].split(","))])
    kinds = ["ar", "old", "curve-nolookup", "curve"]
else:
    kinds = ["ar", "old", "m1.03", "m1.06"]


def run(kind, p, n, seed):
    prop = None
    if kind != "ar":
        vs.verify_cost_of = (lambda m: curve) if kind.startswith("curve") else default_cost
        prop = make_proposer("auto", t, d, len(p) + n + gamma + 2, StrategyOptions(draft_context=ctx))
        if variant == "copy-length" and kind in ("old", "curve-nolookup"):
            prop.lookup_length = None  # copies as long as gamma
        if kind.startswith("m"):
            prop.draft.pause_margin = float(kind[1:])
    return generate(t.model, p, GenerationParams(max_new_tokens=n, gamma=gamma, eos_ids=tuple(tok.eos_ids),
                    sampling=SamplingParams(temperature=T), seed=seed), prop)


for k in kinds:  # warm-up
    run(k, ps[0][1], 8, 0)
res = {k: {} for k in kinds}
t0 = time.time()
for i, (cat, p) in enumerate(ps):
    outs = {}
    for k in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
        outs[k] = run(k, p, 128, i)
        res[k].setdefault(cat, []).append(outs[k].metrics)
    if T == 0:
        assert all(o.token_ids == outs["ar"].token_ids for o in outs.values()), f"greedy output differs on prompt {i}"
    print(f"[{time.time() - t0:5.0f}s] {cat}: " + ", ".join(f"{k} {outs[k].metrics.decode_tokens_per_s:.1f}" for k in kinds),
          file=sys.stderr, flush=True)
print(f"T={T}, gamma {gamma}, {len(ps)} prompts; geomean of per-prompt decode tok/s ratios over ar; variant {variant}")
print("| category | " + " | ".join(f"{k}/ar (tau)" for k in kinds[1:]) + " |")
print("|---|" + "---|" * (len(kinds) - 1))
every = {k: [] for k in kinds[1:]}
for cat in res["ar"]:
    cells = []
    for k in kinds[1:]:
        r = [x.decode_tokens_per_s / y.decode_tokens_per_s for x, y in zip(res[k][cat], res["ar"][cat])]
        every[k] += r
        cells.append(f"{st.geometric_mean(r):.3f} ({st.mean(x.mean_accepted_length for x in res[k][cat]):.2f})")
    print(f"| {cat} | " + " | ".join(cells) + " |")
print("| all | " + " | ".join(f"{st.geometric_mean(every[k]):.3f}" for k in kinds[1:]) + " |")
