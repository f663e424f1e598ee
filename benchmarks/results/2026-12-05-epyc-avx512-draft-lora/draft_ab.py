"""A/B of two draft models under `auto` beside plain decoding, the default w4a8 target, interleaved per prompt."""
import sys, time
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.sampling import SamplingParams
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET, DEFAULT_DRAFT
from verispec.models.quant import truncate_head
from verispec.strategies import make_proposer

default_threads()
target = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
tok = target.tokenizer
drafts = {"A": DEFAULT_DRAFT, "B": sys.argv[1]}
cats, limit, temp = sys.argv[2].split(","), int(sys.argv[3]), float(sys.argv[4])
prompts = [(p.category, tok.chat(list(p.messages))) for p in load_prompts("suite", categories=cats, limit=limit)]
loaded = {}
for k, d in drafts.items():
    loaded[k] = load(d, dtype="w4a8-4bit", progress=False, tokenizer_like=tok)
    truncate_head(loaded[k].model, 65536)
max_len = max(len(p) for _, p in prompts) + 200


def run(name, prompt, n=128, seed=0):
    prop = None if name == "plain" else make_proposer("auto", target, loaded[name], max_len, max_gamma=6)
    return generate(target.model, prompt, GenerationParams(max_new_tokens=n, gamma=6, sampling=SamplingParams(temperature=temp), seed=seed, eos_ids=tuple(tok.eos_ids)), prop)


for name in ("plain", "A", "B"):
    run(name, prompts[0][1], 8)
configs = ["plain", "A", "B"]
sums = {c: [0, 0.0, 0, 0.0, 0] for c in configs}
bycat = {}
for i, (cat, p) in enumerate(prompts):
    order = configs[i % 3:] + configs[:i % 3]
    outs = {}
    for name in order:
        r = run(name, p, seed=i); m = r.metrics
        s = sums[name]; s[0] += m.new_tokens; s[1] += m.seconds - m.prefill_seconds; s[2] += m.rounds
        outs[name] = r.token_ids
        bycat.setdefault((cat, name), [0, 0.0, 0, 0, 0, 0.0, 0]); b = bycat[(cat, name)]
        b[0] += m.new_tokens; b[1] += m.seconds - m.prefill_seconds; b[2] += m.rounds; b[3] += m.drafted; b[4] += m.accepted; b[5] += m.seconds; b[6] += m.draft_forwards
    for c in ("A", "B"):
        sums[c][4] += outs[c] != outs["plain"]
    print(i, cat, {k: round(v[0] / v[1], 2) for k, v in sums.items()}, flush=True)
plain = sums["plain"][0] / sums["plain"][1]
for name, (n, sec, r, _, diff) in sums.items():
    print(f"{name} ({drafts.get(name, 'plain')}): {n / sec:.2f} tok/s decode ({n / sec / plain:.3f}x plain), tokens a round {n / r:.2f}, differ {diff}/{len(prompts)}")
for cat in cats:
    row = {name: bycat[(cat, name)] for name in configs if (cat, name) in bycat}
    pl = row["plain"][0] / row["plain"][1]
    plw = row["plain"][0] / row["plain"][5]
    print(f"{cat:16s}", " | ".join(f"{k} {v[0]/v[1]/pl:.3f}x decode, {v[0]/v[5]/plw:.3f}x whole, tok/round {v[0]/max(v[2],1):.2f}, alpha {v[4]/max(v[3],1):.3f}, drafted {v[3]}, draft fwd {v[6]}" for k, v in row.items() if k != "plain"))
tot = {k: [sum(bycat[(c, k)][j] for c in cats) for j in range(7)] for k in configs}
plw = tot["plain"][0] / tot["plain"][5]
for k in ("A", "B"):
    v = tot[k]; print(f"all {k}: whole {v[0]/v[5]/plw:.3f}x, alpha {v[4]/max(v[3],1):.3f}, drafted {v[3]}, accepted {v[4]}, draft fwd {v[6]}")
