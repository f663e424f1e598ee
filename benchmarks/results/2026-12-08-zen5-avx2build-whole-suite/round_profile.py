"""Per-round timing of ar vs auto on chosen prompts: target forward time by width, the rest of the round."""
import statistics, sys, time, json
import torch
from verispec.bench.suite import load_prompts
from verispec.defaults import default_draft_dtype
from verispec.engine import GenerationParams, generate
import verispec.engine as E
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.sampling import SamplingParams
from verispec.strategies import StrategyOptions, make_proposer
import verispec.batch as B
from verispec.models.quant import truncate_head

default_threads()
target = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
draft = load(DEFAULT_DRAFT, dtype=default_draft_dtype("w4a8", "cpu"), progress=False)
truncate_head(draft.model, 65536)
tok = target.tokenizer
ids = sys.argv[1].split(",")
temp = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
prompts = {p.id: tok.chat(list(p.messages)) for p in load_prompts("suite") if p.id in ids}
log = []
orig = B.NativeRows.forward
def fwd(self, rows, chains, **kw):
    t = time.perf_counter(); out = orig(self, rows, chains, **kw)
    log.append(("T" if self.model is target.model else "D", len(chains[0]), time.perf_counter() - t))
    return out
B.NativeRows.forward = fwd
orig_round = E.Batch.round
rounds = []
def rnd(self, **kw):
    n0 = len(log); t = time.perf_counter(); out = orig_round(self, **kw); dt = time.perf_counter() - t
    rounds.append((dt, log[n0:])); return out
E.Batch.round = rnd
def run(strategy, prompt, max_new=128, seed=0):
    proposer = None if strategy == "ar" else make_proposer(strategy, target, draft, len(prompt) + max_new + 6, StrategyOptions())
    params = GenerationParams(max_new_tokens=max_new, gamma=4, eos_ids=tuple(tok.eos_ids),
                              sampling=SamplingParams(temperature=temp), seed=seed)
    rounds.clear()
    g = generate(target.model, prompt, params, proposer)
    return list(rounds), g
for s in ("ar", "auto"):
    run(s, next(iter(prompts.values())), 8)
for pid, prompt in prompts.items():
    for s in ("ar", "auto", "ar", "auto"):
        rs, g = run(s, prompt)
        rs = rs[1:]  # the prefill round
        plain = [(dt, f) for dt, f in rs if all(k == "T" for k, _, _ in f) and len(f) == 1 and f[0][1] == 1]
        tf = [f[0][2] for _, f in plain]; rest = [dt - f[0][2] for dt, f in plain]
        other = [(dt, f) for dt, f in rs if not (all(k == "T" for k, _, _ in f) and len(f) == 1 and f[0][1] == 1)]
        print(f"{pid} {s}: rounds {len(rs)} total {sum(dt for dt,_ in rs):.3f}s; 1-token target-only rounds {len(plain)}: "
              f"round {1000*statistics.median([d for d,_ in plain]) if plain else 0:.2f} ms, target fwd {1000*statistics.median(tf) if tf else 0:.2f}, rest {1000*statistics.median(rest) if rest else 0:.2f}; "
              f"other rounds {len(other)} total {sum(dt for dt,_ in other):.3f}s", flush=True)
        if s == "auto":
            summ = {}
            for dt, f in other:
                key = tuple((k, n) for k, n, _ in f)
                a = summ.setdefault(key, [0, 0.0]); a[0] += 1; a[1] += dt
                a.append([x for _, _, x in f])
            for key, v in sorted(summ.items(), key=lambda kv: -kv[1][1])[:8]:
                n, t, fs = v[0], v[1], v[2:]
                per = [1000 * statistics.mean(col) for col in zip(*fs)]
                print("   ", key, n, f"{1000*t/n:.1f} ms avg; forwards", " + ".join(f"{p:.1f}" for p in per), f"; rest {1000*t/n - sum(per):.1f}")
