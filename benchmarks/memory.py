"""Peak memory of the default configuration against the bytes of both models' weights as run.

    python benchmarks/memory.py [--max-new-tokens 128] [--prompt "..."]

Loads the default pair the way `verispec generate` does (quantized caches already written), generates once, and
prints the process's peak resident set (ru_maxrss) beside the weights' bytes (every parameter and buffer of both
models) and the KV caches'. The interpreter and torch themselves take a few hundred MB before any model is
loaded; that baseline is printed and also subtracted, so both readings are there.
"""

from __future__ import annotations

import argparse
import resource
import sys

import torch


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def model_bytes(model: torch.nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:  # a tied tensor counts once
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompt", default="Write a Python function that parses an ISO 8601 date without libraries.")
    args = ap.parse_args()
    from verispec.defaults import DEFAULT_STRATEGY, default_draft_dtype, default_dtype, default_gamma
    from verispec.engine import GenerationParams, generate
    from verispec.models.kernels import available_isas
    from verispec.models.load import default_threads, load
    from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
    from verispec.strategies import StrategyOptions, make_proposer

    default_threads()
    base = peak_bytes()
    dtype = default_dtype("cpu", available_isas())
    target = load(DEFAULT_TARGET, dtype=dtype, progress=False)
    draft = load(DEFAULT_DRAFT, dtype=default_draft_dtype(dtype), progress=False)
    loaded = peak_bytes()
    gamma = default_gamma(dtype)
    prompt = target.tokenizer.chat([{"role": "user", "content": args.prompt}])
    proposer = make_proposer(DEFAULT_STRATEGY, target, draft, len(prompt) + args.max_new_tokens + 16, StrategyOptions())
    out = generate(target.model, prompt, GenerationParams(max_new_tokens=args.max_new_tokens, gamma=gamma), proposer)
    peak = peak_bytes()
    weights = model_bytes(target.model) + model_bytes(draft.model)
    gib = 2**30
    print(f"default pair: {dtype} target, {default_draft_dtype(dtype)} draft, {DEFAULT_STRATEGY}; "
          f"{len(out.token_ids)} tokens generated", file=sys.stderr)
    print("| quantity | GiB |")
    print("|---|---|")
    print(f"| weights as run (target + draft, every parameter and buffer) | {weights / gib:.2f} |")
    print(f"| peak resident set before loading (interpreter, torch) | {base / gib:.2f} |")
    print(f"| peak resident set after loading | {loaded / gib:.2f} |")
    print(f"| peak resident set after generating | {peak / gib:.2f} |")
    print(f"| peak / weights | {peak / weights:.2f}x |")
    print(f"| (peak - baseline) / weights | {(peak - base) / weights:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
