import sys, time, torch
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.sampling import SamplingParams
from verispec.strategies import StrategyOptions, make_proposer
default_threads()
t = load(DEFAULT_TARGET, dtype="w4a8")
tok = t.tokenizer
p = tok.chat([{"role": "user", "content": "Write a Python function that parses a CSV file and returns the rows as dicts, with error handling."}])
def run(n):
    prop = make_proposer("ar", t, None, len(p)+n+8, StrategyOptions())
    t0 = time.perf_counter()
    generate(t.model, p, GenerationParams(max_new_tokens=n, gamma=1, eos_ids=(), sampling=SamplingParams(temperature=0)), prop)
    return time.perf_counter() - t0
run(8)
print("ready", flush=True)
for i in range(int(sys.argv[1])):
    dt = run(256); print(f"{256/dt:.1f} tok/s", flush=True)
