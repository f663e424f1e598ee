"""Two versions of the EAGLE drafter's input projection inside real rounds: greedy generate() of 64 tokens, γ = 2, on
the suite's code prompts, the two alternated prompt by prompt (the order flipped each prompt), c as `verispec bench`
reports it (drafter seconds a forward over target seconds a round).

    python in_round_ab.py DRAFTER_DIR [PROMPTS_PER_CATEGORY] [fc|bf16_mm]

fc (the default; in_round_ab.txt): fc whole (bf16 weights where the CPU has bf16, as until 2026-12-02) against split
(TokenTableFc). bf16_mm (in_round_bf16_mm_ab.txt; needs bf16_mm.diff applied, the kernel was not kept): the split fc's
bf16 feature half on torch's bf16 linear against the compiled kernel's bf16_mm.
"""
import statistics
import sys

from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.eagle import load_drafter
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.proposers.eagle import EagleProposer

default_threads()
loaded = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
target, tok = loaded.model, loaded.tokenizer
drafter = load_drafter(sys.argv[1], target, quantize_kind="w4a8-4bit")
limit = int(sys.argv[2]) if len(sys.argv) > 2 else 3
mode = sys.argv[3] if len(sys.argv) > 3 else "fc"
prompts = [tok.chat(list(p.messages)) for p in load_prompts("suite", categories=["code_completion", "code_instruct"],
                                                            limit=limit)]

if mode == "fc":
    from verispec.models.eagle import Bf16Linear
    from verispec.models.kernels import cpu_flags

    split = drafter.fc
    whole = load_drafter(sys.argv[1], target).fc
    if "avx512_bf16" in cpu_flags():
        whole = Bf16Linear(whole)
    fcs = {"whole": whole, "split": split}

    def use(name):
        drafter.fc = fcs[name]

    names, warm = ("whole", "split"), ("whole",)
elif mode == "bf16_mm":
    import verispec.models.kernels as kernels

    compiled = kernels.bf16_kernel

    def use(name):  # "torch": Bf16Linear falls back to torch's bf16 linear; "kernel": bf16_mm
        kernels.bf16_kernel = (lambda: None) if name == "torch" else compiled

    names, warm = ("torch", "kernel"), ("torch", "kernel")
else:
    raise SystemExit(f"mode: fc or bf16_mm, not {mode!r}")


def run(prompt):
    proposer = EagleProposer(drafter, len(prompt) + 80, target.vocab_size)
    params = GenerationParams(max_new_tokens=64, gamma=2, eos_ids=tuple(tok.eos_ids))
    return generate(target, prompt, params, proposer)


outs = {name: [] for name in names}
texts = {}
for name in warm:  # warm-up
    use(name)
    run(prompts[0])
for i, prompt in enumerate(prompts):
    for name in names[:: 1 if i % 2 == 0 else -1]:
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
a, b = names
ratio = statistics.geometric_mean([s.draft_seconds / s.draft_forwards / (w.draft_seconds / w.draft_forwards)
                                   for w, s in zip(outs[a], outs[b])])
print(f"{b} / {a}, drafter time a forward, geometric mean over prompts: {ratio:.3f}")
print(f"outputs identical between the two on {sum(len(v) == 1 for v in texts.values())} of {len(texts)} prompts")
