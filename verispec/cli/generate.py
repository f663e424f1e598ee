"""`verispec generate PROMPT`: one request, streamed to the terminal (or one JSON object with --json)."""

from __future__ import annotations

import argparse
import json
import sys

from verispec.cli.common import fail, finite
from verispec.cli.options import (
    add_config_option, add_gamma_argument, add_model_options, add_strategy_argument, add_strategy_options,
    announce, gamma_of, load_models, resolve_dtype, strategy_options,
)
from verispec.defaults import DEFAULT_STRATEGY

def add_parser(sub, default_target: str, default_draft: str) -> None:
    gen = sub.add_parser("generate", help="generate text from a prompt, speculatively")
    gen.add_argument("prompt", help="the prompt text ('-' reads standard input)")
    add_model_options(gen, default_target, default_draft)
    add_strategy_argument(gen, DEFAULT_STRATEGY)
    add_gamma_argument(gen)
    add_strategy_options(gen)
    add_config_option(gen)
    gen.add_argument("--temperature", type=finite, default=0.0, help="0 = greedy (default: %(default)s)")
    gen.add_argument("--top-k", type=int, default=0, help="0 = off")
    gen.add_argument("--top-p", type=finite, default=1.0, help="in (0, 1]; 1 = off")
    gen.add_argument("--seed", type=int, default=None, help="makes sampled runs reproducible")
    gen.add_argument("--repetition-penalty", type=finite, default=1.0,
                     help="> 1 discourages tokens of the prompt and the output (1 = off)")
    gen.add_argument("--frequency-penalty", type=finite, default=0.0, help="subtracted per earlier occurrence")
    gen.add_argument("--presence-penalty", type=finite, default=0.0, help="subtracted once a token has occurred")
    gen.add_argument("--logit-bias", action="append", default=[], metavar="ID=BIAS",
                     help="add BIAS to token ID's logit (repeatable; -100 in effect bans it)")
    fmt = gen.add_mutually_exclusive_group()
    fmt.add_argument("--json-schema", metavar="SCHEMA",
                     help="the output is JSON following this schema (a file, or the schema's JSON text)")
    fmt.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    fmt.add_argument("--regex", help="the output matches this regular expression")
    gen.add_argument("--logprobs", type=int, default=None, metavar="K",
                     help="with --json: each token's log-probability and its K most likely alternatives")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--no-speculate", action="store_true", help="plain decoding with the target alone (= --strategy ar)")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    gen.set_defaults(run=run)


def _params(args: argparse.Namespace):
    from verispec.engine import GenerationParams
    from verispec.sampling import Penalties, SamplingParams

    if args.prompt == "-":
        args.prompt = sys.stdin.read()
    if not args.prompt.strip():
        fail("the prompt is empty")
    gamma = gamma_of(args)
    try:
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        penalties = Penalties(repetition=args.repetition_penalty, frequency=args.frequency_penalty,
                              presence=args.presence_penalty, logit_bias=tuple(_bias(b) for b in args.logit_bias))
        return GenerationParams(max_new_tokens=args.max_new_tokens, gamma=gamma, sampling=sampling, seed=args.seed,
                                penalties=penalties, logprobs=args.logprobs)
    except ValueError as e:
        fail(str(e))


def _constraint(args: argparse.Namespace, target):
    """The grammar state for --json-schema / --json-object / --regex (None without them)."""
    from pathlib import Path

    from verispec.grammar import GrammarCompiler, GrammarSpec

    if args.json_schema is not None:
        source = args.json_schema
        if not source.lstrip().startswith("{"):
            try:
                source = Path(source).read_text()
            except OSError as e:
                fail(f"--json-schema: cannot read {args.json_schema}: {e.strerror}")
        spec = GrammarSpec("json_schema", source)
    elif args.json_object:
        spec = GrammarSpec("json_object")
    elif args.regex is not None:
        spec = GrammarSpec("regex", args.regex)
    else:
        return None
    tok = target.tokenizer
    try:
        return GrammarCompiler(tok, target.model.vocab_size, tok.eos_ids).constraint(spec)
    except ValueError as e:
        fail(f"--{spec.kind.replace('_', '-')}: {e}")


def _bias(text: str) -> tuple[int, float]:
    token, sep, bias = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return int(token), float(bias)
    except ValueError:
        raise ValueError(f"--logit-bias takes ID=BIAS (e.g. 151643=-100), got {text!r}") from None


def _proposer(strategy: str, target, draft, max_len: int, options):
    """The one place the command line builds a proposer."""
    from verispec.strategies import make_proposer

    return make_proposer(strategy, target, draft, max_len, options)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from verispec.cache import CacheFullError
    from verispec.engine import Generation, stream
    from verispec.models.load import default_threads
    from verispec.models.tokenizer import TextStream

    defaulted = resolve_dtype(args)
    params = _params(args)
    strategy = "ar" if args.no_speculate else args.strategy
    options = strategy_options(args, [strategy])
    default_threads()
    progress = sys.stderr.isatty()
    target, draft = load_models(args, [strategy], progress)
    announce(args, strategy, draft is not None, defaulted)
    tok = target.tokenizer
    too_big = [t for t, _ in params.penalties.logit_bias if t >= len(tok)]
    if too_big:
        fail(f"--logit-bias: token id {too_big[0]} is outside the vocabulary [0, {len(tok)})")
    constraint = _constraint(args, target)
    prompt = tok.chat(args.prompt) if args.chat else tok.encode(args.prompt)
    params = dataclasses.replace(params, eos_ids=tok.eos_ids)
    proposer = _proposer(strategy, target, draft, len(prompt) + params.max_new_tokens + params.gamma + 2, options)
    text = TextStream(tok, args.stop)
    result = Generation()
    try:
        for new in stream(target.model, prompt, params, proposer, result=result,
                          stop_fn=text.stop_fn if args.stop else None, constraint=constraint):
            delta = text.push(new)
            if not args.json:
                print(delta, end="", flush=True)
    except KeyboardInterrupt:
        result.finish_reason = "interrupted"
        if result.metrics is not None:
            result.metrics.finish()
    except (ValueError, CacheFullError) as e:  # e.g. prompt + max new tokens beyond the model's context
        if not args.json:
            print(text.flush(), flush=True)  # keep what was already generated on screen
        fail(str(e))
    tail = text.flush()
    metrics = result.metrics.to_dict() if result.metrics else {}
    if args.json:
        out = {"text": text.text, "token_ids": result.token_ids, "finish_reason": result.finish_reason,
               "strategy": strategy, "metrics": metrics}
        if params.logprobs is not None:
            out["logprobs"] = [{"token": tok.token_text(lp.token), "id": lp.token, "logprob": lp.logprob,
                                "top": [{"token": tok.token_text(t), "id": t, "logprob": v} for t, v in lp.top]}
                               for lp in result.logprobs]
        print(json.dumps(out))
    else:
        print(tail, flush=True)
        summary = f"[{metrics.get('new_tokens')} tokens, {metrics.get('tokens_per_s')} tok/s"
        if proposer is not None:
            summary += f", alpha {metrics.get('alpha')}, mean accepted length {metrics.get('mean_accepted_length')}"
        print(summary + "]", file=sys.stderr)
    return 130 if result.finish_reason == "interrupted" else 0
