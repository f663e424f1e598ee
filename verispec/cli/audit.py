"""`verispec audit`: is speculation lossless on *this* configuration? (verispec.audit)"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from verispec.cli.common import fail, finite
from verispec.cli.options import (
    add_config_option, add_gamma_argument, add_model_options, add_strategy_argument, add_strategy_options,
    announce, draft_dtype_of, gamma_of, load_models, resolve_dtype, strategy_options,
)
from verispec.defaults import DEFAULT_STRATEGY


def add_parser(sub, default_target: str, default_draft: str) -> None:
    p = sub.add_parser("audit", help="check that speculation is lossless on your models, precision, strategy and "
                       "sampling: greedy identity on every prompt and a sampled-law test (exit status 0 = pass)")
    add_model_options(p, default_target, default_draft)
    add_strategy_argument(p, DEFAULT_STRATEGY)
    add_gamma_argument(p)
    add_config_option(p)
    add_strategy_options(p)
    p.add_argument("--prompts", default="suite",
                   help="'suite' (the packaged prompts) or a JSON Lines file as `bench` reads (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="at most this many prompts per category")
    p.add_argument("--max-new-tokens", type=int, default=64, help="greedy tokens compared per prompt (default: 64)")
    p.add_argument("--samples", type=int, default=200,
                   help="sampled-law check: seeded samples per arm, with and without speculation, on the prompt "
                        "where speculation accepted the most drafts per token, from the point of its output where the "
                        "target is least sure (default: 200; 0 skips the check)")
    p.add_argument("--law-tokens", type=int, default=3, help="sampled-law check: the first k tokens (default: 3)")
    p.add_argument("--temperature", type=finite, default=0.7, help="sampled-law check (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=0, help="sampled-law check: 0 = off")
    p.add_argument("--top-p", type=finite, default=1.0, help="sampled-law check: in (0, 1]; 1 = off")
    p.add_argument("--seed", type=int, default=0, help="first seed of the samples (default: 0)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the full report as JSON ('-': to stdout)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from verispec.audit import AuditReport, greedy_identity, law_check, law_prompt
    from verispec.bench.suite import load_prompts
    from verispec.engine import GenerationParams
    from verispec.models.load import default_threads
    from verispec.sampling import SamplingParams
    from verispec.strategies import make_proposer

    if args.strategy == "ar":
        fail("--strategy ar does not speculate: there is nothing to audit")
    for flag, value, least in (("--max-new-tokens", args.max_new_tokens, 1), ("--samples", args.samples, 0),
                               ("--law-tokens", args.law_tokens, 1), ("--limit", args.limit or 1, 1)):
        if value < least:
            fail(f"{flag} must be at least {least}, got {value}")
    try:
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        prompts = load_prompts(args.prompts, limit=args.limit)
    except (ValueError, OSError) as e:
        fail(str(e))
    if args.samples and sampling.greedy:
        fail("the sampled-law check needs --temperature > 0 (greedy output is checked on every prompt anyway)")
    defaulted = resolve_dtype(args)
    gamma = gamma_of(args)
    options = strategy_options(args, [args.strategy])
    default_threads()
    progress = sys.stderr.isatty()
    target, draft = load_models(args, [args.strategy], progress)
    announce(args, args.strategy, draft is not None, defaulted)
    tok = target.tokenizer
    try:
        encoded = [(p.id, tok.chat(list(p.messages)) if tok.has_chat_template else tok.encode(p.messages[-1]["content"]))
                   for p in prompts]
    except ValueError as e:
        fail(str(e))

    def make(max_len: int, rows: int):
        return make_proposer(args.strategy, target, draft, max_len, options, rows=rows, max_gamma=gamma + 2)

    params = GenerationParams(max_new_tokens=args.max_new_tokens, gamma=gamma, eos_ids=tok.eos_ids)
    with tqdm(total=len(encoded), desc="greedy identity", unit="prompt", disable=not progress, file=sys.stderr) as bar:
        greedy = greedy_identity(target.model, make, encoded, params, progress=lambda: bar.update(1))
    law = None
    if args.samples:
        name, ids = law_prompt(target.model, encoded, greedy, sampling)
        with tqdm(total=2 * args.samples, desc=f"sampled law ({name})", unit="sample", disable=not progress,
                  file=sys.stderr) as bar:
            law = law_check(target.model, make, name, ids, sampling, tokens=args.law_tokens, samples=args.samples,
                            gamma=gamma, seed=args.seed, progress=lambda: bar.update(1))
    config = {"target": args.target, "draft": None if draft is None else args.draft, "dtype": args.dtype,
              "draft_dtype": None if draft is None else draft_dtype_of(args), "strategy": args.strategy, "gamma": gamma,
              "prompts": args.prompts, "max_new_tokens": args.max_new_tokens}
    report = AuditReport(config, greedy, law)
    if args.json == "-":
        print(json.dumps(report.to_dict(), indent=2))
    elif args.json:
        try:
            Path(args.json).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        except OSError as e:
            fail(f"cannot write {args.json}: {e}")
    for case in greedy:
        if not case.identical:
            words = [tok.decode([t]) if t is not None else "(ended)" for t in (case.plain_token, case.spec_token)]
            print(f"prompt {case.prompt}: differs at new token {case.position}: plain {words[0]!r}, speculative "
                  f"{words[1]!r}", file=sys.stderr)
    print(report.verdict, file=sys.stderr if args.json == "-" else sys.stdout)
    return 0 if report.passed else 1
