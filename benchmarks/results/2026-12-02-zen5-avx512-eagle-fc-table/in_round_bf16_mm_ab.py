"""The EAGLE drafter's input projection split (TokenTableFc) with its bf16 feature half on torch's bf16 linear against
the compiled kernel's bf16_mm, inside real rounds: greedy generate() of 64 tokens, γ = 2, on the suite's code
prompts, the two alternated prompt by prompt (the order flipped each prompt), c as `verispec bench` reports it
(drafter seconds a forward over target seconds a round).

    python in_round_bf16_mm_ab.py DRAFTER_DIR [PROMPTS_PER_CATEGORY]
"""
import statistics
import sys

from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
import verispec.models.kernels as kernels
from verispec.models.eagle import load_drafter
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.proposers.eagle import EagleProposer

default_threads()
loaded = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
target, tok = loaded.model, loaded.tokenizer
drafter = load_drafter(sys.argv[1], target, quantize_kind="w4a8-4bit")
compiled = kernels.bf16_kernel


def use(name):  # "torch": Bf16Linear falls back to torch's bf16 linear; "kernel": bf16_mm
    kernels.bf16_kernel = (lambda: None) if name == "torch" else compiled


limit = int(sys.argv[2]) if len(sys.argv) > 2 else 3
prompts = [tok.chat(list(p.messages)) for p in load_prompts("suite", categories=["code_completion", "code_instruct"],
                                                            limit=limit)]


def run(prompt):
    proposer = EagleProposer(drafter, len(prompt) + 80, target.vocab_size)
    params = GenerationParams(max_new_tokens=64, gamma=2, eos_ids=tuple(tok.eos_ids))
    return generate(target, prompt, params, proposer)


outs = {"torch": [], "kernel": []}
texts = {}
use("torch")
run(prompts[0])  # warm-up
use("kernel")
run(prompts[0])
for i, prompt in enumerate(prompts):
    for name in ["torch", "kernel"][:: 1 if i % 2 == 0 else -1]:
        use(name)
        out = run(prompt)
        m = out.metrics
        outs[name].append(m)
        texts.setdefault(i, set()).add(tuple(out.token_ids))
        print(f"prompt {i} {name}: drafter {m.draft_seconds / m.draft_forwards * 1e3:.3f} ms a forward, target "
              f"{m.target_seconds / m.rounds * 1e3:.2f} ms a round, c {m.c:.4f}, accepted {m.accepted}/{m.drafted}")
for name, ms in outs.items():
    print(f"{name}: c mean {statistics.mean(m.c for m in ms):.4f}, drafter ms a forward (mean) "
          f"{statistics.mean(m.draft_seconds / m.draft_forwards for m in ms) * 1e3:.3f}")
ratio = statistics.geometric_mean([s.draft_seconds / s.draft_forwards / (w.draft_seconds / w.draft_forwards)
                                   for w, s in zip(outs["torch"], outs["kernel"])])
print(f"kernel / torch, drafter time a forward, geometric mean over prompts: {ratio:.3f}")
print(f"outputs identical between the two on {sum(len(v) == 1 for v in texts.values())} of {len(texts)} prompts")
