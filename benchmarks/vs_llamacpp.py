"""Ours against llama.cpp (and OpenVINO GenAI where the run has it), per prompt and then geometric means, from a
`verispec bench --peers llama.cpp[,openvino]` runs.jsonl.

    python benchmarks/vs_llamacpp.py benchmarks/results/<run>/runs.jsonl [CONFIG] > benchmarks/results/<run>/vs_llamacpp.md

Pairs each prompt's runs (same prompt, same temperature) and prints, per category group: our default
configuration (CONFIG's rows: `auto γ=N` by default, else `draft+ngram γ=4` in runs from before `auto` was the
default; llama.cpp's prompt lookup at the run's γ) over llama.cpp's plain decoding, whole-request and decode-only
(tokens after the first over the time after the first), over llama.cpp's prompt lookup, our plain decoding over
llama.cpp's (decode only: the step), and the median time to first token of both. With OpenVINO rows, a second
table: our default over its plain decoding, its speculative decoding with the draft and its prompt lookup (whole
request), its speculative over its plain decoding, and in how many greedy prompts its speculative output differs
from its plain output.
"""
import json, sys, math, collections
from pathlib import Path

from verispec.bench.report import read_recorded

path = sys.argv[1]
rows = [json.loads(l) for l in read_recorded(Path(path)).splitlines()]  # runs.jsonl, or .gz
def dec(r):
    return (r['new_tokens'] - 1) / (r['seconds'] - r['ttft_s']) if r['ttft_s'] is not None and r['new_tokens'] > 1 else None
by = collections.defaultdict(dict)
for r in rows:
    by[(r['prompt_id'], r['category'], r['temperature'])][r['config']] = r
configs = {r['config'] for r in rows}
first = lambda prefix: next((c for c in sorted(configs) if c.startswith(prefix)), None)  # the run's config of that name, at its γ
ours = sys.argv[2] if len(sys.argv) > 2 else first('auto γ=') or 'draft+ngram γ=4'
lookup = first('llama.cpp prompt_lookup')
print(f"ours default: the `{ours}` rows")
code = {"code_completion", "code_instruct", "code_edit"}
groups = [("code categories", lambda c: c in code), ("all categories", lambda c: True)] + [(c, (lambda cc: (lambda c: c == cc))(c)) for c in sorted({k[1] for k in by})]  # (name, category test) rows of each table
def gm(xs): return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float('nan')
for T in sorted({k[2] for k in by}):  # the temperatures the run has
    print(f"\n## T={T}")
    print("| prompts | ours default / llama.cpp plain, whole request | decode | ours default / llama.cpp prompt lookup (whole) | ours plain / llama.cpp plain (decode) | TTFT ours default / llama.cpp (median s) |")
    print("|---|---|---|---|---|---|")
    for name, sel in groups:
        w, d, lk, pl, t1, t2 = [], [], [], [], [], []
        for (pid, cat, t), cfg in by.items():
            if t != T or not sel(cat): continue
            o, l, lp, a = cfg.get(ours), cfg.get('llama.cpp ar'), cfg.get(lookup), cfg.get('ar')
            if o and l:
                w.append(o['tokens_per_s'] / l['tokens_per_s'])
                if dec(o) and dec(l): d.append(dec(o) / dec(l))
                t1.append(o['ttft_s']); t2.append(l['ttft_s'])
            if o and lp: lk.append(o['tokens_per_s'] / lp['tokens_per_s'])
            if a and l and dec(a) and dec(l): pl.append(dec(a) / dec(l))
        med = lambda xs: sorted(xs)[len(xs)//2] if xs else float('nan')
        print(f"| {name} ({len(w)}) | {gm(w):.2f}× | {gm(d):.2f}× | {gm(lk):.2f}× | {gm(pl):.2f}× | {med(t1):.2f} / {med(t2):.2f} |")
    ov = [c for c in configs if c.startswith('openvino ')]
    if not ov:
        continue
    spec, look = first('openvino speculative'), first('openvino prompt_lookup')
    print(f"\n| prompts | ours default / OpenVINO plain, whole request | / {spec or '–'} | / {look or '–'} | OpenVINO speculative / its plain | OpenVINO speculative output differs from its plain |")
    print("|---|---|---|---|---|---|")
    for name, sel in groups:
        p, sp, lo, own, differ, n = [], [], [], [], 0, 0
        for (pid, cat, t), cfg in by.items():
            if t != T or not sel(cat): continue
            o, a, s_, l_ = cfg.get(ours), cfg.get('openvino ar'), cfg.get(spec), cfg.get(look)
            if o and a: p.append(o['tokens_per_s'] / a['tokens_per_s'])
            if o and s_: sp.append(o['tokens_per_s'] / s_['tokens_per_s'])
            if o and l_: lo.append(o['tokens_per_s'] / l_['tokens_per_s'])
            if a and s_:
                own.append(s_['tokens_per_s'] / a['tokens_per_s'])
                n += 1
                differ += s_['token_ids'] != a['token_ids']
        print(f"| {name} ({len(p)}) | {gm(p):.2f}× | {gm(sp):.2f}× | {gm(lo):.2f}× | {gm(own):.2f}× | "
              + (f"{differ}/{n}" if T == 0 else "– (sampled)") + " |")
