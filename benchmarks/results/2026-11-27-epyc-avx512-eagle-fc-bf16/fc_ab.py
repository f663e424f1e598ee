"""A/B: the EAGLE drafter's fc in float32 (as loaded before) against bf16 weights (as load_drafter gives now) (activations cast to bf16 and back),
interleaved per prompt, greedy, default w4a8 target. Prints decode tok/s, tau, c, and checks outputs."""
import sys, time, torch
from pathlib import Path
from torch import nn
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models import llama
from verispec.models.eagle import load_drafter
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.proposers.eagle import EagleProposer

from verispec.models.eagle import Bf16Linear
from verispec.models.files import read_safetensors

default_threads()
target = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
tok = target.tokenizer
cats = sys.argv[1] if len(sys.argv) > 1 else "code_completion,code_instruct,code_edit,math,qa"
prompts = [tok.chat(list(p.messages)) for p in load_prompts("suite", categories=cats.split(","), limit=int(sys.argv[2]) if len(sys.argv) > 2 else 1)]
d = str(Path("~/.cache/verispec/drafters/eagle-answers").expanduser())
A = load_drafter(d, target.model, quantize_kind="w4a8-4bit")  # fc as float32, as before this change
state = read_safetensors(Path(d) / "model.safetensors")
A.fc = nn.Linear(*reversed(state["fc.weight"].shape), bias=True)
with torch.no_grad():
    A.fc.weight.copy_(state["fc.weight"].float()); A.fc.bias.copy_(state["fc.bias"].float())
B = load_drafter(d, target.model, quantize_kind="w4a8-4bit")  # as loaded now: bf16 fc on a CPU with bf16
assert isinstance(B.fc, Bf16Linear)
max_len = max(len(p) for p in prompts) + 200
gamma = 2
def run(drafter, prompt, n=128):
    return generate(target.model, prompt, GenerationParams(max_new_tokens=n, gamma=gamma),
                    None if drafter is None else EagleProposer(drafter, max_len, target.model.vocab_size))
for dr in (None, A, B): run(dr, prompts[0], 8)
sums = {k: [0, 0.0, 0, 0.0, 0] for k in ("plain", "fp32", "bf16")}
for i, p in enumerate(prompts):
    order = [("plain", None), ("fp32", A), ("bf16", B)]
    order = order[i % 3:] + order[:i % 3]
    outs = {}
    for name, dr in order:
        g = run(dr, p); m = g.metrics
        s = sums[name]; s[0] += m.new_tokens; s[1] += m.seconds - m.prefill_seconds; s[2] += m.rounds
        s[3] += (m.c or 0) * m.rounds; outs[name] = g.token_ids
    for name in ("fp32", "bf16"):
        sums[name][4] += outs[name] != outs["plain"]
    print(i, {k: round(v[0] / v[1], 2) for k, v in sums.items()}, flush=True)
for k, (n, sec, r, cr, diff) in sums.items():
    print(f"{k}: {n / sec:.2f} tok/s decode, tau {n / r:.2f}, c {cr / r:.3f}, differ {diff}/{len(prompts)}")
