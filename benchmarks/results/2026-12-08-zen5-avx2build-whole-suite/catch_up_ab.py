"""A/B: auto with the draft's catch-up capped at W pending tokens (a monkeypatch), interleaved per prompt."""
import statistics as st, sys, time
import torch
from verispec.bench.suite import load_prompts
from verispec.defaults import default_draft_dtype
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.sampling import SamplingParams
from verispec.strategies import StrategyOptions, make_proposer
from verispec.models.quant import truncate_head
import verispec.proposers.draft_model as DM

default_threads()
target = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
draft = load(DEFAULT_DRAFT, dtype=default_draft_dtype("w4a8", "cpu"), progress=False)
truncate_head(draft.model, 65536)
tok = target.tokenizer
limit = int(sys.argv[1]); temp = float(sys.argv[2]); caps = [None if c == "none" else int(c) for c in sys.argv[3].split(",")]
gamma = int(sys.argv[4]) if len(sys.argv) > 4 else 4
cats = sys.argv[5].split(",") if len(sys.argv) > 5 else None
prompts = [(p.id, tok.chat(list(p.messages))) for p in load_prompts("suite", categories=cats, limit=limit)]
CAP = [None]
orig = DM.DraftModelProposer.propose
def propose(self, rows, gammas, *a, **k):
    if CAP[0]:
        for r in rows:
            if len(self.pending[r]) > CAP[0]:
                self.pending[r] = self.pending[r][-CAP[0]:]
    return orig(self, rows, gammas, *a, **k)
DM.DraftModelProposer.propose = propose
configs = ["ar"] + [f"auto/{c}" for c in caps]
def run(cfg, prompt, seed, max_new=128):
    CAP[0] = None if cfg == "ar" else (None if cfg.split("/")[1] == "None" else int(cfg.split("/")[1]))
    proposer = None if cfg == "ar" else make_proposer("auto", target, draft, len(prompt) + max_new + gamma + 2, StrategyOptions())
    params = GenerationParams(max_new_tokens=max_new, gamma=gamma, eos_ids=tuple(tok.eos_ids),
                              sampling=SamplingParams(temperature=temp), seed=seed)
    g = generate(target.model, prompt, params, proposer)
    return g
for c in configs: run(c, prompts[0][1], 0, 8)
res = {c: [] for c in configs}
for i, (pid, prompt) in enumerate(prompts):
    order = configs[i % len(configs):] + configs[:i % len(configs)]
    outs = {}
    for c in order:
        g = run(c, prompt, i)
        m = g.metrics
        res[c].append((pid, m.decode_tokens_per_s, m.tokens_per_s, m.mean_accepted_length))
        outs[c] = g.token_ids
    same = all(outs[c] == outs["ar"] for c in configs) if temp == 0 else None
    print(pid, " ".join(f"{c}:{res[c][-1][1]:.1f}" for c in configs), "same" if same else ("" if same is None else "DIFFER"), flush=True)
print(f"\nT={temp} gamma<={gamma}, {len(prompts)} prompts; geomean over ar (decode / whole request), mean tau")
for c in configs:
    d = st.geometric_mean([x[1] / a[1] for x, a in zip(res[c], res["ar"])])
    w = st.geometric_mean([x[2] / a[2] for x, a in zip(res[c], res["ar"])])
    print(f"{c:10s} decode {d:.3f}x  whole {w:.3f}x  tau {st.mean(x[3] for x in res[c]):.2f}")
    for cat in sorted({p.split('-')[0] for p,_ in prompts}):
        idx = [j for j,(p,_) in enumerate(prompts) if p.startswith(cat)]
        print(f"    {cat:16s} {st.geometric_mean([res[c][j][1]/res['ar'][j][1] for j in idx]):.3f}x")
