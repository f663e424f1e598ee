"""A/B: auto pausing below X / cost(1) (pause-margin.patch applied) against auto as it is, interleaved per prompt: python pause_margin_ab.py T CATEGORIES LIMIT GAMMA"""
import sys, statistics as st, time
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.sampling import SamplingParams
from verispec.strategies import StrategyOptions, make_proposer
default_threads()
T = float(sys.argv[1]); cats = sys.argv[2].split(","); limit = int(sys.argv[3]); gamma = int(sys.argv[4]) if len(sys.argv) > 4 else 4
t = load(DEFAULT_TARGET, dtype="w4a8"); d = load(DEFAULT_DRAFT, dtype="w4a8-4bit"); truncate_head(d.model, 65536)
tok = t.tokenizer
ps = [(p.category, tok.chat(list(p.messages))) for p in load_prompts("suite", categories=cats, limit=limit)]
ctx = 64 if "avx2" in __import__("os").environ.get("VERISPEC_KERNEL_ISA", "") else None
import verispec.strategies as vs
from verispec.theory import interpolate_cost
default_cost = vs.verify_cost_of
curve = None
def run(kind, p, n, seed):
    if kind == "ar":
        prop = None
    else:
        prop = make_proposer("auto", t, d, len(p) + n + gamma + 2, StrategyOptions(draft_context=ctx))
        if kind.startswith("m"):
            prop.draft.pause_margin = float(kind[1:])
    return generate(t.model, p, GenerationParams(max_new_tokens=n, gamma=gamma, eos_ids=tuple(tok.eos_ids),
                    sampling=SamplingParams(temperature=T), seed=seed), prop)
kinds = ["ar", "old", "m1.03", "m1.06"]
for k in kinds: run(k, ps[0][1], 8, 0)
res = {k: {} for k in kinds}
t0 = time.time()
for i, (cat, p) in enumerate(ps):
    order = kinds[i % len(kinds):] + kinds[:i % len(kinds)]
    outs = {}
    for k in order:
        r = run(k, p, 128, i)
        outs[k] = r
        res[k].setdefault(cat, []).append(r.metrics)
    if T == 0:
        assert all(o.token_ids == outs["ar"].token_ids for o in outs.values()), f"greedy output differs on prompt {i}"
    print(f"[{time.time()-t0:5.0f}s] {cat}: " + ", ".join(f"{k} {outs[k].metrics.decode_tokens_per_s:.1f}" for k in kinds), file=sys.stderr, flush=True)
print(f"T={T}, gamma {gamma}, {len(ps)} prompts; geomean of per-prompt decode tok/s ratios over ar; mX: auto pausing below X / cost(1)")
print("| category | " + " | ".join(f"{k}/ar (tau)" for k in kinds[1:]) + " |")
print("|---|" + "---|" * (len(kinds) - 1))
allr = {k: [] for k in kinds[1:]}
for cat in res["ar"]:
    cells = []
    for k in kinds[1:]:
        r = [x.decode_tokens_per_s / y.decode_tokens_per_s for x, y in zip(res[k][cat], res["ar"][cat])]
        allr[k] += r
        cells.append(f"{st.geometric_mean(r):.3f} ({st.mean(x.mean_accepted_length for x in res[k][cat]):.2f})")
    print(f"| {cat} | " + " | ".join(cells) + " |")
print("| all | " + " | ".join(f"{st.geometric_mean(allr[k]):.3f}" for k in kinds[1:]) + " |")
