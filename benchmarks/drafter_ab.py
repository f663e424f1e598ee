"""A/B of two EAGLE drafters beside plain decoding: greedy, the default w4a8 target, each prompt decoded by every
configuration in turn with a rotating start, at each gamma. Prints decode tok/s (prefill excluded) and its ratio to
plain decoding, tau (tokens a round), c, and how many outputs differ from plain decoding.

    python benchmarks/drafter_ab.py DIR_A DIR_B CATEGORIES LIMIT GAMMAS
    e.g. python benchmarks/drafter_ab.py ~/d1 ~/d3 code_completion,code_instruct,code_edit,math,qa 2 2,4,6~0.5

A gamma written G~C drafts up to G tokens, stopping after one the drafter gave less than C (`--draft-confidence`).
DIR_A "-" runs DIR_B alone (a sweep of its gammas). An optional sixth argument samples at that temperature (seed:
the prompt's index) instead of greedy; the outputs then differ from plain decoding's draws, so "differ" is not a check.

(The A/Bs of 2026-11-27-epyc-avx512-eagle-ttt and -eagle3-features ran this code, as ttt_ab.py and eagle3_ab.py.)
"""
import sys
from pathlib import Path
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.eagle import load_drafter
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.proposers.eagle import EagleProposer
from verispec.sampling import SamplingParams

default_threads()
target = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
tok = target.tokenizer
dirs = {k: d for k, d in (("A", sys.argv[1]), ("B", sys.argv[2])) if d != "-"}
cats, limit, gammas = sys.argv[3].split(","), int(sys.argv[4]), sys.argv[5].split(",")
prompts = [tok.chat(list(p.messages)) for p in load_prompts("suite", categories=cats, limit=limit)]
drafters = {k: load_drafter(str(Path(d).expanduser()), target.model, quantize_kind="w4a8-4bit") for k, d in dirs.items()}
max_len = max(len(p) for p in prompts) + 200
temperature = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0


def run(name, prompt, spec, n=128, seed=0):
    dr = drafters.get(name)
    gamma, _, sure = str(spec).partition("~")
    # the target returns the fused drafter's layers only when it drafts (plain and EAGLE-1 runs as they would alone)
    target.model.feature_layers = () if dr is None else dr.eagle.feature_layers
    params = GenerationParams(max_new_tokens=n, gamma=int(gamma), sampling=SamplingParams(temperature=temperature),
                              seed=seed)
    return generate(target.model, prompt, params,
                    None if dr is None else EagleProposer(dr, max_len, target.model.vocab_size,
                                                          confidence=float(sure or 0)))


for name in ("plain", *dirs):
    run(name, prompts[0], 2, 8)
configs = [("plain", "1")] + [(k, g) for g in gammas for k in dirs]
sums = {c: [0, 0.0, 0, 0.0, 0] for c in configs}
for i, p in enumerate(prompts):
    order = configs[i % len(configs):] + configs[:i % len(configs)]
    outs = {}
    for name, g in order:
        r = run(name, p, g, seed=i); m = r.metrics
        s = sums[(name, g)]; s[0] += m.new_tokens; s[1] += m.seconds - m.prefill_seconds; s[2] += m.rounds
        s[3] += (m.c or 0) * m.rounds; outs[(name, g)] = r.token_ids
    for c in configs[1:]:
        sums[c][4] += outs[c] != outs[("plain", "1")]
    print(i, {f"{k[0]}{k[1]}": round(v[0] / v[1], 2) for k, v in sums.items()}, flush=True)
plain = sums[("plain", "1")][0] / sums[("plain", "1")][1]
for (name, g), (n, sec, r, cr, diff) in sums.items():
    label = "plain" if name == "plain" else f"{name} ({dirs[name]}) gamma {g}"
    print(f"{label}: {n / sec:.2f} tok/s decode ({n / sec / plain:.3f}x plain), tau {n / r:.2f}, c {cr / r:.3f}, "
          f"differ {diff}/{len(prompts)}")
