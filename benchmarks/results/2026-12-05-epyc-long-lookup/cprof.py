import sys, cProfile, pstats
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.sampling import SamplingParams
from verispec.strategies import StrategyOptions, make_proposer
default_threads()
T = float(sys.argv[1]); cats = sys.argv[2].split(",")
target = load(DEFAULT_TARGET, dtype="w4a8"); draft = load(DEFAULT_DRAFT, dtype="w4a8-4bit"); truncate_head(draft.model, 65536)
tok = target.tokenizer
ps = [tok.chat(list(p.messages)) for p in load_prompts("suite", categories=cats, limit=1)]
def go():
    for i, p in enumerate(ps):
        prop = make_proposer("auto", target, draft, len(p) + 160, StrategyOptions())
        generate(target.model, p, GenerationParams(max_new_tokens=128, gamma=6, eos_ids=tuple(tok.eos_ids), sampling=SamplingParams(temperature=T), seed=i), prop)
go()
pr = cProfile.Profile(); pr.enable(); go(); pr.disable()
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(25)
