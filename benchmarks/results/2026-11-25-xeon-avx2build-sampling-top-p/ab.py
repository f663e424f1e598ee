import sys, torch, statistics, json
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.sampling import SamplingParams
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.strategies import StrategyOptions, make_proposer
import verispec; tag = sys.argv[1]; print(tag, verispec.__file__, file=sys.stderr)
default_threads()
t = load(DEFAULT_TARGET, dtype="w4a8", progress=False); d = load(DEFAULT_DRAFT, dtype="w4a8-4bit", progress=False)
truncate_head(d.model, 65536)
tok = t.tokenizer
ps = [tok.chat(list(p.messages)) for p in load_prompts("suite", categories=["code_completion","math","translation"], limit=1)]
prop = make_proposer("ar", t, d, 800, StrategyOptions())
generate(t.model, ps[0], GenerationParams(max_new_tokens=8), prop)
for name, sp in (("T0.7", SamplingParams(temperature=0.7)), ("T0.7p0.9", SamplingParams(temperature=0.7, top_p=0.9))):
  for strat in ("ar", "auto"):
    rs = []
    for i, p in enumerate(ps):
        prop = make_proposer(strat, t, d, len(p)+140, StrategyOptions())
        params = GenerationParams(max_new_tokens=128, gamma=4, eos_ids=tuple(tok.eos_ids), seed=1, sampling=sp)
        m = generate(t.model, p, params, prop).metrics
        rs.append((m.decode_tokens_per_s, m.profile()))
    gm = statistics.geometric_mean([r[0] for r in rs])
    prof = {k: round(statistics.mean(r[1][k] for r in rs), 2) for k in rs[0][1]}
    print(json.dumps({"code": tag, "sampling": name, "strategy": strat, "decode_tok_s_geomean": round(gm, 2), **prof}), flush=True)
