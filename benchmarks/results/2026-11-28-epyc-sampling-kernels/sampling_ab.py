"""A/B of sampling's compiled kernels (sample.cpp) against its torch code, in one process: the default pair, `auto`
γ ≤ 6 and plain decoding, sampled, each prompt run both ways in alternating order ($VERISPEC_SAMPLING is read per
call). Prints decode tok/s per prompt and the geometric means of kernel / torch.

    python sampling_ab.py [--limit 1] [--temperature 0.7] [--max-new-tokens 128] [--strategies auto,ar]
"""
import argparse
import os
import statistics
import sys

from verispec.bench.suite import load_prompts
from verispec.engine import GenerationParams, generate
from verispec.models.load import default_threads, load
from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.sampling import SamplingParams
from verispec.strategies import StrategyOptions, make_proposer

ap = argparse.ArgumentParser()
ap.add_argument("--limit", type=int, default=1)
ap.add_argument("--temperature", type=float, default=0.7)
ap.add_argument("--top-p", type=float, default=1.0)
ap.add_argument("--max-new-tokens", type=int, default=128)
ap.add_argument("--strategies", default="auto,ar")
args = ap.parse_args()
default_threads()
target, draft = load(DEFAULT_TARGET, dtype="w4a8"), load(DEFAULT_DRAFT, dtype="w4a8-4bit")
tok = target.tokenizer
prompts = [(p.category, tok.chat(list(p.messages))) for p in load_prompts("suite", limit=args.limit)]
sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p)


def run(strategy: str, prompt: list[int], n: int, seed: int, mode: str):
    os.environ["VERISPEC_SAMPLING"] = mode
    prop = None if strategy == "ar" else make_proposer(strategy, target, draft, len(prompt) + n + 8, StrategyOptions())
    params = GenerationParams(max_new_tokens=n, gamma=6, eos_ids=tuple(tok.eos_ids), sampling=sampling, seed=seed)
    return generate(target.model, prompt, params, prop).metrics


for s in args.strategies.split(","):
    for mode in ("torch", "kernel"):
        run(s, prompts[0][1], 8, 0, mode)
ratios = {s: [] for s in args.strategies.split(",")}
for i, (cat, prompt) in enumerate(prompts):
    for s in args.strategies.split(","):
        got = {}
        for mode in (("torch", "kernel") if i % 2 == 0 else ("kernel", "torch")):
            got[mode] = run(s, prompt, args.max_new_tokens, i, mode).decode_tokens_per_s
        ratios[s].append(got["kernel"] / got["torch"])
        print(f"{cat:20s} {s:5s} torch {got['torch']:6.2f}  kernel {got['kernel']:6.2f}  {ratios[s][-1]:.3f}x",
              file=sys.stderr, flush=True)
for s, r in ratios.items():
    print(f"{s}: kernel / torch decode tok/s, geometric mean over {len(r)} prompts: {statistics.geometric_mean(r):.3f}x "
          f"(min {min(r):.3f}, max {max(r):.3f})")
