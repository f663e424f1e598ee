"""A/B: auto gamma 6 vs auto whose lookup rounds may run to LONG tokens (draft rounds still capped at 6)."""
import sys, time, statistics
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.sampling import SamplingParams
from verispec.strategies import StrategyOptions, make_proposer
from verispec.proposers import adaptive
default_threads()
T = float(sys.argv[1]); cats = sys.argv[2].split(","); limit = int(sys.argv[3]); LONG = int(sys.argv[4])
target = load(DEFAULT_TARGET, dtype="w4a8"); draft = load(DEFAULT_DRAFT, dtype="w4a8-4bit"); truncate_head(draft.model, 65536)
tok = target.tokenizer
CAP = [None]
orig = adaptive.AdaptiveGammaProposer._choose
adaptive.AdaptiveGammaProposer._choose = lambda self, row, gamma: orig(self, row, min(gamma, CAP[0]) if CAP[0] else gamma)
ps = [(p.category, tok.chat(list(p.messages))) for p in load_prompts("suite", categories=cats, limit=limit)]
def run(p, cfg, seed, n=128):
    g, CAP[0] = (6, None) if cfg == "ar" or cfg == "auto6" else (LONG, 6)
    prop = None if cfg == "ar" else make_proposer("auto", target, draft, len(p) + n + 32, StrategyOptions())
    return generate(target.model, p, GenerationParams(max_new_tokens=n, gamma=g, eos_ids=tuple(tok.eos_ids), sampling=SamplingParams(temperature=T), seed=seed), prop)
cfgs = ["ar", "auto6", "autolong"]
for c in cfgs: run(ps[0][1], c, 0, 8)
res = {c: [] for c in cfgs}
for i, (cat, p) in enumerate(ps):
    order = cfgs[i % 3:] + cfgs[:i % 3]
    outs = {}
    for c in order:
        r = run(p, c, i); res[c].append(r.metrics); outs[c] = r.token_ids
    same = "" if T > 0 else f" same={outs['auto6'] == outs['ar'] == outs['autolong']}"
    print(cat, " ".join(f"{c} {res[c][-1].decode_tokens_per_s:.1f} (rounds {res[c][-1].rounds})" for c in cfgs) + same, flush=True)
for c in cfgs[1:]:
    r = statistics.geometric_mean([m.decode_tokens_per_s / b.decode_tokens_per_s for m, b in zip(res[c], res["ar"])])
    w = statistics.geometric_mean([m.tokens_per_s / b.tokens_per_s for m, b in zip(res[c], res["ar"])])
    print(f"{c}: decode {r:.3f}x ar, whole {w:.3f}x ar")
r = statistics.geometric_mean([m.decode_tokens_per_s / b.decode_tokens_per_s for m, b in zip(res["autolong"], res["auto6"])])
print(f"autolong / auto6 decode: {r:.3f}x")
