"""`verispec calibrate-layerskip`: measure layerskip depths on a few prompts and save the fastest for the target."""

from __future__ import annotations

import argparse
import sys

from verispec.cli.common import fail, int_list
from verispec.cli.options import add_model_options


def add_parser(sub, default_target: str) -> None:
    cal = sub.add_parser("calibrate-layerskip", help="measure layerskip depths on a few prompts and save the fastest for the target")
    add_model_options(cal, default_target, dtypes=["bfloat16", "float32"], device=False)
    cal.add_argument("--candidates", default=None, help="comma list of depths to try (default: six between 1/8 and 3/4 of the layers)")
    cal.add_argument("--gamma", type=int, default=4, help="tokens drafted per round (default: %(default)s)")
    cal.add_argument("--max-new-tokens", type=int, default=64)
    cal.add_argument("--prompts", default="suite", help="'suite' or a JSON Lines prompt file, as in bench")
    cal.add_argument("--categories", default="code_completion,code_instruct,multi_turn", help="comma list of categories (default: %(default)s)")
    cal.add_argument("--limit", type=int, default=1, help="prompts per category (default: %(default)s)")
    cal.add_argument("--out", default=None, help="calibration JSON file (default: layerskip-calibration.json in the cache directory)")
    cal.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from verispec.bench.suite import load_prompts
    from verispec.models.load import default_threads, load
    from verispec.calibrate import calibrate
    from verispec.proposers.layerskip import model_id, save_calibration

    candidates = int_list(args.candidates, "--candidates") if args.candidates else None
    if args.gamma < 1 or args.max_new_tokens < 1 or args.limit < 1:
        fail("--gamma, --max-new-tokens and --limit must be at least 1")
    categories = [c for c in args.categories.split(",") if c] if args.categories else None
    try:
        items = load_prompts(args.prompts, categories=categories, limit=args.limit)
    except (ValueError, OSError) as e:
        fail(str(e))
    default_threads()
    target = load(args.target, dtype=args.dtype, progress=sys.stderr.isatty())
    n = getattr(getattr(target.model, "cfg", None), "num_hidden_layers", None)
    if candidates and n is not None and max(candidates) >= n:
        fail(f"--candidates must be below the target's {n} layers")
    prompts = [target.tokenizer.chat(list(p.messages)) for p in items]
    print(f"calibrating layerskip on {len(prompts)} prompts, {args.max_new_tokens} new tokens each, gamma {args.gamma}",
          file=sys.stderr)
    try:
        result = calibrate(target, prompts, candidates, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                           log=lambda msg: print(msg, file=sys.stderr, flush=True))
    except ValueError as e:
        fail(str(e))
    path = save_calibration(args.out, model_id(target), result)
    best = next(r for r in result["results"] if r["layers"] == result["best_layers"])
    print(f"best: {result['best_layers']} of {result['num_layers']} layers, {best['speedup']:.2f}x plain decoding "
          f"({best['tokens_per_s']:.2f} vs {result['plain_tokens_per_s']:.2f} tok/s); saved to {path}")
    if best["speedup"] < 1:
        print("no depth beats plain decoding on this model: prefer another strategy", file=sys.stderr)
    return 0
