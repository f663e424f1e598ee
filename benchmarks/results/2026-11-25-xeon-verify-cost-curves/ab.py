"""auto with the AVX2 build's old verification-cost table against today's measured one, interleaved."""
import sys, time, statistics, json
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.sampling import SamplingParams
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.strategies import StrategyOptions, make_proposer, _draft, _prices, Size
from verispec.proposers.adaptive import AdaptiveGammaProposer
from verispec.proposers.mix import DraftNgramProposer
from verispec.theory import interpolate_cost
default_threads()
t = load(DEFAULT_TARGET, dtype="w4a8", progress=False); d = load(DEFAULT_DRAFT, dtype="w4a8-4bit", progress=False)
truncate_head(d.model, 65536)
tok = t.tokenizer
TABLES = {"old": eval(sys.argv[4]) if len(sys.argv) > 4 else [(1, 1.0), (2, 1.4), (5, 2.6), (9, 4.2)], "new": eval(sys.argv[1])}
cats = "code_completion,code_instruct,code_edit,math,qa,translation,summarization,rag,multi_turn".split(",")
ps = [tok.chat(list(p.messages)) for p in load_prompts("suite", categories=cats, limit=1)]
def auto(table, n):
    c, _ = _prices(t, d)
    size = Size(rows=1, max_len=n, max_gamma=16)
    a = AdaptiveGammaProposer(_draft(t, d, size, StrategyOptions()), verify_cost=interpolate_cost(table), pause=True, prior_c=c, measure_c=False)
    return DraftNgramProposer(a, 3, min_match=3), a
configs = ["ar", "old", "new"]
temps = [float(x) for x in sys.argv[2].split(",")]
SEED = int(sys.argv[3]) if len(sys.argv) > 3 else 7
rows = {(T, c): [] for T in temps for c in configs}
generate(t.model, ps[0], GenerationParams(max_new_tokens=8), None)
for T in temps:
  for i, p in enumerate(ps):
    for c in configs[i % 3:] + configs[:i % 3]:
        prop, a = (None, None) if c == "ar" else auto(TABLES[c], len(p) + 160)
        params = GenerationParams(max_new_tokens=128, gamma=4, eos_ids=tuple(tok.eos_ids), seed=SEED, sampling=SamplingParams(temperature=T))
        g = generate(t.model, p, params, prop)
        m = g.metrics
        rows[(T, c)].append(dict(tok=len(g.token_ids), dec=m.decode_tokens_per_s, whole=len(g.token_ids)/m.seconds, mal=m.mean_accepted_length or 1.0,
                               gam=statistics.mean(a.gammas) if a and a.gammas else 0, ids=g.token_ids))
        print(T, cats[i], c, round(m.decode_tokens_per_s, 2), round(m.mean_accepted_length or 1, 2), file=sys.stderr, flush=True)
for T in temps:
  base = rows[(T, "ar")]
  for c in configs:
    r = rows[(T, c)]
    sp = statistics.geometric_mean([x["dec"] / b["dec"] for x, b in zip(r, base)])
    spw = statistics.geometric_mean([x["whole"] / b["whole"] for x, b in zip(r, base)])
    same = sum(x["ids"] == b["ids"] for x, b in zip(r, base)) if T == 0 else None
    print(json.dumps(dict(T=T, config=c, decode_geomean=round(statistics.geometric_mean([x["dec"] for x in r]), 2), decode_vs_ar=round(sp, 3), whole_vs_ar=round(spw, 3),
                          mean_acc_len=round(statistics.mean(x["mal"] for x in r), 2), mean_gamma_chosen=round(statistics.mean(x["gam"] for x in r), 2),
                          greedy_equal_ar=same, by_prompt=[round(x["dec"] / b["dec"], 2) for x, b in zip(r, base)])))
