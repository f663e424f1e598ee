"""The EAGLE drafter's forward inside real rounds, each call made twice (a forward writes its keys and values without
committing them, so the second call is the same one): the first from the caches the round left, the second warm.
3 code prompts (the first, a warm-up, not counted), greedy, 64 tokens, gamma = 2.  python coldwarm.py
"""
import sys, time, torch, statistics
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.eagle import load_drafter
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.proposers.eagle import EagleProposer
import verispec.proposers.eagle as pe
import verispec.proposers.draft_model as dm
default_threads()
loaded = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
target, tok = loaded.model, loaded.tokenizer
drafter = load_drafter("/tmp/eagle-zen5", target, quantize_kind="w4a8-4bit")
prompts = [tok.chat(list(p.messages)) for p in load_prompts("suite", categories=["code_completion"], limit=3)]
def run(prompt):
    proposer = EagleProposer(drafter, len(prompt) + 80, target.vocab_size)
    return generate(target, prompt, GenerationParams(max_new_tokens=64, gamma=2, eos_ids=tuple(tok.eos_ids)), proposer)
run(prompts[0])
cold, warm, steps = [], [], []
orig = dm.draft_steps
def wrapped(model, *a, **k):
    f0 = model.forward
    def fwd(*aa, **kk):
        t0 = time.perf_counter(); f0(*aa, **kk); t1 = time.perf_counter(); r = f0(*aa, **kk); t2 = time.perf_counter()
        cold.append(t1 - t0); warm.append(t2 - t1); return r
    model.forward = fwd
    try:
        return orig(model, *a, **k)
    finally:
        del model.forward
pe.draft_steps = wrapped
for p in prompts[1:]:
    run(p)
print(f"Rows.forward in rounds: first call {statistics.median(cold)*1e3:.3f} ms, the same call again {statistics.median(warm)*1e3:.3f} ms (medians of {len(cold)})")
