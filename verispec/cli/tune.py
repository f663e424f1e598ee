"""`verispec tune`: measure strategies × gammas × precisions on your prompts within a budget; write the fastest as
a config file for `--config` (verispec.tune)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from verispec.cli.common import comma_list, duration, fail, finite, int_list
from verispec.cli.options import (
    DTYPE_CHOICES, STRATEGY_FLAGS, add_model_options, add_strategy_options, draft_dtype_of, find_drafters, load_draft,
    load_target, option_dest, resolve_dtype, strategy_options,
)

DEFAULT_STRATEGIES = "draft,draft+ngram,ngram,auto,tree"
# tried besides where --drafter gives a drafter of the kind
DRAFTER_STRATEGIES = {"eagle": "eagle,eagle+ngram", "medusa": "medusa"}


def add_parser(sub, default_target: str, default_draft: str) -> None:
    from verispec.strategies import STRATEGIES

    p = sub.add_parser("tune", help="measure strategies and gammas on your prompts; write the fastest as a "
                                    "--config file for generate, bench, serve and audit")
    add_model_options(p, default_target, default_draft)
    p.add_argument("--strategies", default=None,
                   help=f"comma list of: {', '.join(STRATEGIES)} (plain decoding always runs; default: "
                        f"{DEFAULT_STRATEGIES}, and with --drafter also {DRAFTER_STRATEGIES['eagle']} for an EAGLE "
                        f"drafter, {DRAFTER_STRATEGIES['medusa']} for Medusa heads; without --drafter, those "
                        "train-drafter made for --target where it puts them by default)")
    p.add_argument("--gamma", default="2,4,6", help="comma list of gammas to try (default: %(default)s)")
    p.add_argument("--dtypes", default=None, help="comma list of target precisions to try (default: --dtype's)")
    p.add_argument("--draft-dtypes", default=None, help="comma list of draft precisions to try beside each target "
                   "precision (default: --draft-dtype, else each target precision's default draft)")
    add_strategy_options(p)
    p.add_argument("--prompts", default="suite", help="'suite' or a JSON Lines file, as for bench")
    p.add_argument("--categories", default=None, help="comma list of categories (default: all)")
    p.add_argument("--limit", type=int, default=1, help="prompts per category (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--temperature", type=finite, default=0.0, help="tune for this temperature (default: greedy)")
    p.add_argument("--budget", type=duration, default=duration("10m"),
                   help="stop starting new prompts after this long (30m, 1h, 90s; default: 10m); every candidate "
                        "runs on the same prompts")
    p.add_argument("--out", default="verispec-config.json", help="the config file to write (default: %(default)s)")
    p.set_defaults(run=run)


def _dtypes(text: str, flag: str) -> list[str]:
    values = comma_list(text, str, flag)
    bad = [d for d in values if d not in DTYPE_CHOICES]
    if bad:
        fail(f"{flag}: {bad[0]!r} is not a precision; choose from {', '.join(DTYPE_CHOICES)}")
    return values


def _default_strategies(drafters: list[str]) -> str:
    """DEFAULT_STRATEGIES, and the strategies that run the kinds of drafter given (a directory that is not one is
    left to the strategy's own check)."""
    from verispec.models.files import DRAFTER_CONFIG

    names = DEFAULT_STRATEGIES.split(",")
    for d in drafters:
        try:
            kind = json.loads((Path(d).expanduser() / DRAFTER_CONFIG).read_text()).get("kind")
        except (OSError, ValueError, AttributeError):
            kind = "eagle"  # its strategies then say what is wrong with it
        names += DRAFTER_STRATEGIES.get(kind, "").split(",")
    return ",".join(dict.fromkeys(n for n in names if n))


def _options_of(args: argparse.Namespace, strategy: str) -> dict:
    """The flags given that `strategy` reads, by option name, for the config: --drafter as absolute paths, so that
    the config works from any directory."""
    options = {}
    for flag, (_, readers) in STRATEGY_FLAGS.items():
        value = getattr(args, option_dest(flag))
        if value is not None and strategy in readers:
            options[option_dest(flag)] = value
    if "drafter" in options:
        options["drafter"] = [str(Path(d).expanduser().resolve()) for d in options["drafter"]]
    return options


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from tqdm import tqdm

    from verispec.bench.costs import verification_curve
    from verispec.bench.runner import VerispecBackend
    from verispec.bench.suite import load_prompts
    from verispec.models.kernels import cpu_flags
    from verispec.models.load import LoadedModel, default_threads
    from verispec.strategies import get
    from verispec.theory import interpolate_cost
    from verispec.tune import best, candidates, config_dict, measure, table

    find_drafters(args, args.strategies.split(",") if args.strategies else None)  # its strategies join the default list
    strategies = comma_list(args.strategies or _default_strategies(args.drafter or []), lambda s: get(s).name,
                            "--strategies")
    gammas = int_list(args.gamma, "--gamma")
    if args.max_new_tokens < 1:
        fail("--max-new-tokens must be at least 1")
    try:
        prompts = load_prompts(args.prompts, args.categories.split(",") if args.categories else None, args.limit)
    except ValueError as e:
        fail(str(e))
    if not prompts:
        fail("no prompts to tune on")
    resolve_dtype(args)
    options = strategy_options(args, strategies)
    dtypes = _dtypes(args.dtypes, "--dtypes") if args.dtypes else [args.dtype]
    needs = [s for s in strategies if get(s).needs_draft]
    precisions: list[tuple[str, str | None]] = []  # (target, draft) precisions; no draft where none runs
    for d in dtypes:
        drafts = (_dtypes(args.draft_dtypes, "--draft-dtypes") if args.draft_dtypes
                  else [draft_dtype_of(argparse.Namespace(**{**vars(args), "dtype": d}))])
        precisions += [(d, dd if needs else None) for dd in drafts]
    precisions = list(dict.fromkeys(precisions))
    default_threads()
    progress = sys.stderr.isatty()
    targets: dict[str, LoadedModel] = {}
    drafts_by: dict[str, LoadedModel] = {}
    for d, dd in precisions:  # each precision loaded once
        at = argparse.Namespace(**{**vars(args), "dtype": d, "draft_dtype": dd})
        if d not in targets:
            targets[d] = load_target(at, progress)
        if dd is not None and dd not in drafts_by:
            drafts_by[dd] = load_draft(at, targets[d], needs, progress)
    tok = targets[dtypes[0]].tokenizer
    encoded = [tok.chat(list(p.messages)) if tok.has_chat_template else tok.encode(p.messages[-1]["content"])
               for p in prompts]
    configs = [dataclasses.replace(c, config=dataclasses.replace(c.config, temperature=args.temperature))
               for c in candidates(strategies, gammas, precisions, lambda s: get(s).needs_draft)]
    print(f"tuning {len(configs)} candidates on up to {len(prompts)} prompts ({args.max_new_tokens} tokens, "
          f"T={args.temperature}) within {args.budget:.0f} s", file=sys.stderr)
    # the cost of verifying k tokens on top of the prompts' median length, per target precision, for the theory
    context = sorted(len(ids) for ids in encoded)[len(encoded) // 2]
    costs = {}
    for d, target in targets.items():
        curve = verification_curve(target.model, context=context, sizes=tuple(range(1, max(gammas) + 2)), reps=3)
        costs[d] = interpolate_cost([(row["tokens"], row["relative_to_1"]) for row in curve])
    backends = {}

    def backend(c):
        key = (c.dtype, c.draft_dtype)
        if key not in backends:
            draft = drafts_by[c.draft_dtype] if c.draft_dtype is not None else None
            backends[key] = VerispecBackend(targets[c.dtype], draft, tok.eos_ids, options)
        return backends[key]

    for c in tqdm(configs, desc="warm-up", disable=not progress, file=sys.stderr, leave=False):
        backend(c).run(c.config, encoded[0], 8, 0)
    with tqdm(total=len(encoded), desc="tune", unit="prompt", disable=not progress, file=sys.stderr) as bar:
        measured, done = measure(configs, encoded,
                                 lambda c, ids: backend(c).run(c.config, ids, args.max_new_tokens, 0),
                                 args.budget, on_prompt=lambda n: bar.update(1))
    chosen = best(measured)
    print(table(measured, lambda d: costs[d]))
    flags = sorted(f for f in cpu_flags() if f.startswith(("avx512_vnni", "avx512_bf16", "avx_vnni", "avx2", "amx")))
    models = {"target": args.target, "draft": args.draft}
    data = config_dict(chosen, models, measured, done, " ".join(flags), _options_of(args, chosen.strategy))
    try:
        Path(args.out).write_text(json.dumps(data, indent=2) + "\n")
    except OSError as e:
        fail(f"cannot write {args.out}: {e.strerror}")
    print(f"\n{chosen.label} ({chosen.precision}): {chosen.tokens_per_s:.2f} tok/s over {done} prompt(s), the "
          f"fastest measured; wrote {args.out} (use it with --config {args.out})")
    return 0
