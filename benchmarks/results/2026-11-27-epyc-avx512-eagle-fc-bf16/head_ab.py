"""A/B: the EAGLE drafter's head at 32000 / 24000 / 16000 rows (fc bf16 in all), interleaved per prompt, greedy."""
import sys, torch
from pathlib import Path
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.eagle import load_drafter
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.proposers.eagle import EagleProposer
default_threads()
target = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
tok = target.tokenizer
prompts = [tok.chat(list(p.messages)) for p in load_prompts("suite", categories=sys.argv[1].split(","), limit=int(sys.argv[2]))]
dirs = {"32k": "~/.cache/verispec/drafters/eagle-answers", "24k": "/tmp/s33/e24", "16k": "/tmp/s33/e16"}
drafters = {k: load_drafter(Path(d).expanduser(), target.model, quantize_kind="w4a8-4bit") for k, d in dirs.items()}
max_len = max(len(p) for p in prompts) + 200
def run(dr, prompt, n=128):
    return generate(target.model, prompt, GenerationParams(max_new_tokens=n, gamma=2),
                    None if dr is None else EagleProposer(dr, max_len, target.model.vocab_size))
configs = [("plain", None)] + list(drafters.items())
for _, dr in configs: run(dr, prompts[0], 8)
sums = {k: [0, 0.0, 0, 0.0, 0, 0, 0] for k, _ in configs}
for i, p in enumerate(prompts):
    order = configs[i % len(configs):] + configs[:i % len(configs)]
    outs = {}
    for name, dr in order:
        g = run(dr, p); m = g.metrics
        s = sums[name]; s[0] += m.new_tokens; s[1] += m.seconds - m.prefill_seconds; s[2] += m.rounds
        s[3] += (m.c or 0) * m.rounds; s[5] += m.accepted; s[6] += m.drafted; outs[name] = g.token_ids
    for name in drafters:
        sums[name][4] += outs[name] != outs["plain"]
    print(i, {k: round(v[0] / v[1], 2) for k, v in sums.items()}, flush=True)
for k, (n, sec, r, cr, diff, acc, dr) in sums.items():
    print(f"{k}: {n / sec:.2f} tok/s decode, tau {n / r:.2f}, c {cr / r:.3f}, alpha {acc / max(dr, 1):.3f}, differ {diff}/{len(prompts)}")
