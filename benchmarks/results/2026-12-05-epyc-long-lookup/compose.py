"""Whole-request composition of auto rounds at T=0.7 on a few suite prompts."""
import sys, time, statistics
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.quant import truncate_head
from verispec.sampling import SamplingParams
from verispec.strategies import StrategyOptions, make_proposer
default_threads()
T = float(sys.argv[1]) if len(sys.argv) > 1 else 0.7
cats = sys.argv[2] if len(sys.argv) > 2 else "translation,summarization,qa,multi_turn,rag,code_completion,math,code_instruct,code_edit"
target = load(DEFAULT_TARGET, dtype="w4a8"); draft = load(DEFAULT_DRAFT, dtype="w4a8-4bit"); truncate_head(draft.model, 65536)
tok = target.tokenizer
ps = [(p.category, tok.chat(list(p.messages))) for p in load_prompts("suite", categories=cats.split(","), limit=1)]
def run(prompt, strat, n=128, seed=0):
    prop = None if strat == "ar" else make_proposer(strat, target, draft, len(prompt) + n + 16, StrategyOptions())
    params = GenerationParams(max_new_tokens=n, gamma=6, eos_ids=tuple(tok.eos_ids), sampling=SamplingParams(temperature=T), seed=seed)
    t0 = time.perf_counter(); m = generate(target.model, prompt, params, prop).metrics; return m, time.perf_counter() - t0
run(ps[0][1], "auto", 8); run(ps[0][1], "ar", 8)
print("cat | plen | new | wall s | prefill s | dprefill s | rounds | drafted | acc | dfwd | draft ms/fwd | tgt ms/round | ar tgt ms | ar wall")
for i, (cat, p) in enumerate(ps):
    a, wa = run(p, "ar", seed=i); m, w = run(p, "auto", seed=i)
    print(f"{cat} | {len(p)} | {m.new_tokens} | {w:.2f} | {m.prefill_seconds:.2f} | {m.proposer_prefill_seconds:.2f} | {m.rounds} | {m.drafted} | {m.accepted} | {m.draft_forwards} | "
          f"{1000*m.draft_seconds/max(1,m.draft_forwards):.1f} | {1000*m.target_seconds/m.rounds:.1f} | {1000*a.target_seconds/a.rounds:.1f} | {wa:.2f}", flush=True)
