"""The EAGLE drafter's feature half on bf16 weights (torch's linear, as until 2026-12-02) against the w4a8 kernel at
8 bits with each row sent as two (TwoRowInt8Linear), inside real rounds: greedy generate() of 64 tokens, gamma = 2,
on the suite's code prompts, alternated prompt by prompt (the order flipped each prompt); c as `verispec bench`
reports it (drafter seconds a forward over target seconds a round).

    python in_round_ab.py DRAFTER_DIR [PROMPTS_PER_CATEGORY]
"""
import statistics
import sys

from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.eagle import Bf16Linear, TwoRowInt8Linear, _float_linear, load_drafter
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_TARGET
from verispec.proposers.eagle import EagleProposer

default_threads()
loaded = load(DEFAULT_TARGET, dtype="w4a8", progress=False)
target, tok = loaded.model, loaded.tokenizer
drafter = load_drafter(sys.argv[1], target, quantize_kind="w4a8-4bit")
limit = int(sys.argv[2]) if len(sys.argv) > 2 else 3
prompts = [tok.chat(list(p.messages)) for p in load_prompts("suite", categories=["code_completion", "code_instruct"],
                                                            limit=limit)]
two = drafter.fc.feature_part
assert isinstance(two, TwoRowInt8Linear)
plain = load_drafter(sys.argv[1], target)  # float weights: its fc's feature half, in bf16
h = plain.eagle.hidden_size
parts = {"bf16": Bf16Linear(_float_linear(plain.fc.weight.detach().float()[:, h:])), "two rows": two}


def run(prompt):
    proposer = EagleProposer(drafter, len(prompt) + 80, target.vocab_size)
    return generate(target, prompt, GenerationParams(max_new_tokens=64, gamma=2, eos_ids=tuple(tok.eos_ids)), proposer)


outs = {name: [] for name in parts}
texts = {}
for name in parts:  # warm-up
    drafter.fc.feature_part = parts[name]
    run(prompts[0])
for i, prompt in enumerate(prompts):
    for name in list(parts)[:: 1 if i % 2 == 0 else -1]:
        drafter.fc.feature_part = parts[name]
        out = run(prompt)
        m = out.metrics
        outs[name].append(m)
        texts.setdefault(i, set()).add(tuple(out.token_ids))
        print(f"prompt {i} {name}: drafter {m.draft_seconds / m.draft_forwards * 1e3:.3f} ms a forward, target "
              f"{m.target_seconds / m.rounds * 1e3:.2f} ms a round, c {m.c:.4f}, accepted {m.accepted}/{m.drafted}",
              flush=True)
for name, ms in outs.items():
    print(f"{name}: c mean {statistics.mean(m.c for m in ms):.4f}, drafter ms a forward (mean) "
          f"{statistics.mean(m.draft_seconds / m.draft_forwards for m in ms) * 1e3:.3f}, accepted "
          f"{sum(m.accepted for m in ms)}/{sum(m.drafted for m in ms)}")
a, b = outs
ratios = [(y.draft_seconds / y.draft_forwards) / (x.draft_seconds / x.draft_forwards) for x, y in zip(outs[a], outs[b])]
print(f"{b} / {a} drafter time a forward, per prompt: {' '.join(f'{r:.3f}' for r in ratios)}; geomean "
      f"{statistics.geometric_mean(ratios):.3f}; outputs identical on {sum(len(s) == 1 for s in texts.values())}/{len(texts)}")
