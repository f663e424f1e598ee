"""A/B of a sampled chain's verification in one compiled call (verify.verify_chain_compiled, sample.cpp's verify_row)
against the torch code it replaces (logits_to_probs over every position, then verify_chain), in one process: the
default pair, `auto` gamma <= 6, each prompt run both ways in alternating order. The two give the same draws, so
each pair of runs must emit the same tokens (checked): the ratio is speed alone. Prints decode tok/s per prompt, the
in-round verification ms a round, and the geometric mean of compiled / torch.

    python verify_ab.py [--limit 2] [--temperature 0.7] [--max-new-tokens 128]
"""
import argparse
import statistics
import sys

import verispec.verify as V
from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.sampling import SamplingParams
from verispec.strategies import StrategyOptions, make_proposer

ap = argparse.ArgumentParser()
ap.add_argument("--limit", type=int, default=2)
ap.add_argument("--temperature", type=float, default=0.7)
ap.add_argument("--max-new-tokens", type=int, default=128)
args = ap.parse_args()
default_threads()
target, draft = load(DEFAULT_TARGET, dtype="w4a8"), load(DEFAULT_DRAFT, dtype="w4a8-4bit")
tok = target.tokenizer
prompts = [(p.category, tok.chat(list(p.messages))) for p in load_prompts("suite", limit=args.limit)]
compiled = V.verify_chain_compiled


def run(prompt: list[int], n: int, seed: int, mode: str):
    V.verify_chain_compiled = compiled if mode == "compiled" else (lambda *a, **k: None)
    prop = make_proposer("auto", target, draft, len(prompt) + n + 8, StrategyOptions())
    params = GenerationParams(max_new_tokens=n, gamma=6, eos_ids=tuple(tok.eos_ids),
                              sampling=SamplingParams(temperature=args.temperature), seed=seed)
    return generate(target.model, prompt, params, prop)


for mode in ("torch", "compiled"):
    run(prompts[0][1], 8, 0, mode)
ratios, verify_ms = [], {"torch": [], "compiled": []}
for i, (cat, prompt) in enumerate(prompts):
    got = {}
    for mode in (("torch", "compiled") if i % 2 == 0 else ("compiled", "torch")):
        got[mode] = run(prompt, args.max_new_tokens, i, mode)
    assert got["torch"].token_ids == got["compiled"].token_ids, (cat, i)
    tps = {m: g.metrics.decode_tokens_per_s for m, g in got.items()}
    vms = {m: g.metrics.verify_seconds / g.metrics.rounds * 1e3 for m, g in got.items()}
    for m in vms:
        verify_ms[m].append(vms[m])
    ratios.append(tps["compiled"] / tps["torch"])
    print(f"{cat:20s} torch {tps['torch']:6.2f} ({vms['torch']:.2f} ms)  compiled {tps['compiled']:6.2f} "
          f"({vms['compiled']:.2f} ms)  {ratios[-1]:.3f}x  same tokens", file=sys.stderr, flush=True)
print(f"compiled / torch decode tok/s, geometric mean over {len(ratios)} prompts: {statistics.geometric_mean(ratios):.3f}x "
      f"(median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}); verification a round: "
      f"torch {statistics.median(verify_ms['torch']):.2f} ms, compiled {statistics.median(verify_ms['compiled']):.2f} ms "
      "(medians)")
