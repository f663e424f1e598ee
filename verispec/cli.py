"""verispec command line: `verispec generate PROMPT`, `verispec serve`, `bench`, `theory`, `calibrate-layerskip`."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import NoReturn

from verispec.models.errors import ModelError


__all__ = ["main", "build_parser", "fail"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(message)


def fail(message: str) -> NoReturn:
    print(f"verispec: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text}")
    return value


def _strategy_names() -> list[str]:
    from verispec.strategies import STRATEGIES

    return list(STRATEGIES)


def _strategy_help() -> str:
    from verispec.strategies import STRATEGIES

    return "; ".join(f"{s.name} ({s.help})" for s in STRATEGIES.values())


DTYPE_CHOICES = ["bfloat16", "float32", "int8", "int4", "w8a8", "w4a8", "w4a8-4bit"]


def _model_args(p: argparse.ArgumentParser, default_target: str, default_draft: str) -> None:
    p.add_argument("--target", default=default_target, help="HF directory, .gguf file or packaged name (default: %(default)s)")
    p.add_argument("--draft", default=default_draft, help="draft model, same forms (default: %(default)s)")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="bfloat16",
                   help="the target's precision (int8/int4: weight-only quantized; w8a8: int8 weights and per-token "
                        "int8 activations; w4a8: 4-bit weights (8 where the GGUF had more) and int8 activations on "
                        "verispec's AVX-512 VNNI kernel, fastest on a CPU); output is lossless relative to the "
                        "target as run (default: %(default)s)")
    p.add_argument("--draft-dtype", choices=DTYPE_CHOICES, default=None,
                   help="the draft's precision; it never changes the output distribution (default on the CPU: int4 "
                        "beside a bfloat16, int8, int4 or w8a8 target, else the target's)")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="the draft proposes only ids < N (its LM head shrinks; ids are roughly in frequency order); "
                        "lossless, faster drafting (default: the whole vocabulary)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: %(default)s)")
    p.add_argument("--ngram-max", type=int, default=3, help="longest suffix n-gram matched (ngram strategies; default: %(default)s)")
    p.add_argument("--ngram-min", type=int, default=None, help="shortest suffix n-gram matched; draft+ngram uses the n-gram proposal from this length on, else the draft model (default: 2 for ngram, 3 for draft+ngram)")
    p.add_argument("--layers", type=int, default=None,
                   help="layerskip: draft with the target's first LAYERS blocks (default: the saved "
                        "`verispec calibrate-layerskip` choice for the target, else half its layers)")
    p.add_argument("--draft-confidence", type=_finite, default=None,
                   help="draft/adaptive: stop drafting after a token the draft gave less than this probability "
                        "(default: 0 for draft, 0.3 for adaptive)")
    p.add_argument("--window", type=int, default=5, help="lookahead: Jacobi window width W (default: %(default)s)")
    p.add_argument("--lookahead-ngram", type=int, default=3, help="lookahead: n-gram size N, window levels + 1 (default: %(default)s)")
    p.add_argument("--lookahead-candidates", type=int, default=5, help="lookahead: pool n-grams kept per first token, G (default: %(default)s)")


def _options(args: argparse.Namespace):
    from verispec.strategies import StrategyOptions

    if args.ngram_max < 1 or (args.ngram_min is not None and not 1 <= args.ngram_min <= args.ngram_max):
        fail(f"need 1 <= --ngram-min <= --ngram-max, got {args.ngram_min} and {args.ngram_max}")
    if args.layers is not None and args.layers < 1:
        fail(f"--layers must be at least 1, got {args.layers}")
    if args.window < 1 or args.lookahead_ngram < 2 or args.lookahead_candidates < 1:
        fail("need --window >= 1, --lookahead-ngram >= 2 and --lookahead-candidates >= 1")
    if args.draft_confidence is not None and not 0 <= args.draft_confidence <= 1:
        fail(f"--draft-confidence must be in [0, 1], got {args.draft_confidence}")
    return StrategyOptions(
        draft_confidence=args.draft_confidence,
        ngram_max=args.ngram_max,
        ngram_min=args.ngram_min,
        layerskip_layers=args.layers,
        lookahead_window=args.window,
        lookahead_ngram=args.lookahead_ngram,
        lookahead_candidates=args.lookahead_candidates,
    )


def default_gamma(args: argparse.Namespace) -> int:
    """γ = 8 where verification is nearly free: a bfloat16 or float32 target on a CPU is bound by reading 3 GB of
    weights, so 9 tokens cost ~1.3x one (bench/issue4-epyc-bf16-gamma: 2.55x over plain against 2.33x with
    γ = 4, 10 code prompts). A quantized target's few-row matmuls are compute-bound (w4a8: 1.75x for 8 tokens),
    and 4 measured best there."""
    if args.gamma is not None:
        return args.gamma
    return 8 if args.device == "cpu" and args.dtype in ("bfloat16", "float32") else 4


def draft_dtype(args: argparse.Namespace) -> str:
    """On a CPU a quantized draft is faster at about the same acceptance (the draft's precision is free): 4-bit
    weights beside a bfloat16/int8/int4/w8a8 target, the fastest of int8, int4 and w8a8 drafts beside both bf16
    and w8a8 targets, and w4a8-4bit beside a w4a8 target (benchmarks/profile_round.py). Elsewhere, and beside a
    float32 target, the target's."""
    if args.draft_dtype:
        return args.draft_dtype
    if args.device != "cpu":
        return args.dtype
    if args.dtype.startswith("w4a8"):  # the kernel is built by now; it drafts ~7% faster than int4
        return "w4a8-4bit"
    return "int4" if args.dtype in ("bfloat16", "int8", "int4", "w8a8") else args.dtype


def _load_models(args: argparse.Namespace, strategies: list[str], progress: bool):
    """Load the target, and the draft if any strategy needs one; check they form a pair."""
    from verispec.models.load import check_pair, load
    from verispec.strategies import get

    try:
        need_draft = any(get(s).needs_draft for s in strategies)
    except ValueError as e:
        fail(str(e))
    if not (args.device == "cpu" or args.device.startswith("cuda")):
        fail(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    target = load(args.target, dtype=args.dtype, device=args.device, progress=progress)
    draft = None
    if need_draft:
        draft = load(args.draft, dtype=draft_dtype(args), device=args.device, progress=progress)
        check_pair(target, draft)
        if args.draft_vocab is not None:
            from verispec.models.quant import truncate_head

            if args.draft_vocab < 1:
                fail(f"--draft-vocab must be >= 1, got {args.draft_vocab}")
            try:
                truncate_head(draft.model, args.draft_vocab)
            except ValueError as e:
                fail(str(e))
    return target, draft


def build_parser() -> argparse.ArgumentParser:
    from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET

    parser = _Parser(prog="verispec", description="Lossless speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    gen = sub.add_parser("generate", help="generate text from a prompt, speculatively")
    gen.add_argument("prompt", help="the prompt text ('-' reads standard input)")
    _model_args(gen, DEFAULT_TARGET, DEFAULT_DRAFT)
    gen.add_argument("--strategy", default="draft+ngram", help=f"drafting method: {_strategy_help()} (default: %(default)s)")
    gen.add_argument("--gamma", type=int, default=None, help="tokens drafted per round (default: 8 for a bfloat16 or "
                     "float32 target on a CPU, whose verification of 8 tokens costs ~1.3x a step; else 4)")
    gen.add_argument("--temperature", type=_finite, default=0.0, help="0 = greedy (default: %(default)s)")
    gen.add_argument("--top-k", type=int, default=0, help="0 = off")
    gen.add_argument("--top-p", type=_finite, default=1.0, help="in (0, 1]; 1 = off")
    gen.add_argument("--seed", type=int, default=None, help="makes sampled runs reproducible")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--no-speculate", action="store_true", help="plain decoding with the target alone (= --strategy ar)")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    b = sub.add_parser("bench", help="measure strategies side by side (and peers) on a prompt suite; writes a report")
    _model_args(b, DEFAULT_TARGET, DEFAULT_DRAFT)
    b.add_argument("--strategies", default="ar,draft", help=f"comma list of: {', '.join(_strategy_names())} (ar is always run: it is the baseline; default: %(default)s)")
    b.add_argument("--gamma", default="2,4,6", help="comma list of gammas for the drafting strategies (default: %(default)s)")
    b.add_argument("--temperature", default="0", help="comma list of temperatures, 0 = greedy (default: %(default)s)")
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--prompts", default="suite", help="'suite' (the packaged prompt suite) or a JSON Lines file with 'prompt' (or 'messages') and optional 'category'")
    b.add_argument("--categories", default=None, help="comma list of categories to run (default: all)")
    b.add_argument("--limit", type=int, default=None, help="at most this many prompts per category")
    b.add_argument("--repeats", type=int, default=1, help="times each configuration runs on each prompt")
    b.add_argument("--peers", default="", help="comma list of peers to run beside ours: hf (transformers plain and assisted generation), llama.cpp (plain and prompt lookup; needs llama-cpp-python)")
    b.add_argument("--seed", type=int, default=0, help="base seed of the sampled runs")
    b.add_argument("--costs", action="store_true", help="also measure the target's verification-cost curve (1-16 tokens) and the memory-bandwidth limit")
    b.add_argument("--synthetic", type=_finite, default=None, metavar="ERROR_RATE",
                   help="synthetic acceptance, for speed runs with random weights (--target random:DIR): drafts "
                        "are the target's own greedy tokens, each wrong with this probability; greedy only")
    b.add_argument("--no-warmup", action="store_true", help="skip the warm-up pass (first calls are slower)")
    b.add_argument("--rerender", default=None, metavar="DIR",
                   help="rebuild DIR's report.md, report.json and plots from its recorded runs (after a Ctrl-C or an upgrade); runs nothing")
    b.add_argument("--out", default="bench-report", help="directory for report.json, report.md, runs.jsonl and plots (default: %(default)s)")
    cal = sub.add_parser("calibrate-layerskip", help="measure layerskip depths on a few prompts and save the fastest for the target")
    cal.add_argument("--target", default=DEFAULT_TARGET, help="HF directory, .gguf file or packaged name (default: %(default)s)")
    cal.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="the target's precision (default: %(default)s)")
    cal.add_argument("--candidates", default=None, help="comma list of depths to try (default: six between 1/8 and 3/4 of the layers)")
    cal.add_argument("--gamma", type=int, default=4, help="tokens drafted per round (default: %(default)s)")
    cal.add_argument("--max-new-tokens", type=int, default=64)
    cal.add_argument("--prompts", default="suite", help="'suite' or a JSON Lines prompt file, as in bench")
    cal.add_argument("--categories", default="code_completion,code_instruct,multi_turn", help="comma list of categories (default: %(default)s)")
    cal.add_argument("--limit", type=int, default=1, help="prompts per category (default: %(default)s)")
    cal.add_argument("--out", default=None, help="calibration JSON file (default: layerskip-calibration.json in the cache directory)")
    srv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server: batched speculative decoding, streaming, metrics")
    _model_args(srv, DEFAULT_TARGET, DEFAULT_DRAFT)
    srv.add_argument("--strategy", default="draft", choices=["draft", "ar", "ngram", "draft+ngram"],
                     help="drafting method; 'draft' batches the draft model across requests (default: %(default)s)")
    srv.add_argument("--gamma", type=int, default=4, help="tokens drafted per round (default: %(default)s)")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    srv.add_argument("--port", type=int, default=8000, help="(default: %(default)s)")
    srv.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1/* (default: "
                     "$VERISPEC_API_KEY if set, else no key)")
    srv.add_argument("--served-model-name", default=None, help="the model id clients send and /v1/models lists "
                     "(default: the --target name, without its directory)")
    srv.add_argument("--max-concurrency", type=int, default=8, help="requests decoded at once, one batch row each; "
                     "more wait in a queue (default: %(default)s)")
    srv.add_argument("--max-prompt-tokens", type=int, default=2048, help="longer prompts get a 400 (default: %(default)s)")
    srv.add_argument("--max-new-tokens-limit", type=int, default=512, help="largest max_tokens a request may ask "
                     "for; also the default when it asks for none (default: %(default)s)")
    srv.add_argument("--speculate-max-batch", type=int, default=8, help="rounds with more active requests than "
                     "this run without drafting, where it stops paying (default: %(default)s; 0 never drafts)")
    srv.add_argument("--draft-per-request", action="store_true", help="run the draft model request by request "
                     "instead of batched across requests (slower; for comparison)")
    srv.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    th = sub.add_parser("theory", help="expected tokens per round, predicted speedup and the optimal gamma")
    th.add_argument("--alpha", type=_finite, default=None, help="acceptance rate in [0, 1]")
    th.add_argument("--gamma", type=int, default=4, help="tokens drafted per round (default: %(default)s)")
    th.add_argument("--c", type=_finite, default=0.2, help="draft cost / target cost per forward (default: %(default)s)")
    th.add_argument("--report", default=None, help="a bench report.json (or its directory): the gamma its measured alpha and c call for, next to the gamma that measured best")
    return parser


def cmd_theory(args: argparse.Namespace) -> int:
    from verispec.theory import expected_tokens, optimal_gamma, predicted_speedup, table

    if args.report is not None:
        return _theory_of_report(args.report)
    try:
        if args.alpha is not None:
            print(f"alpha {args.alpha}, gamma {args.gamma}, c {args.c}: "
                  f"{expected_tokens(args.alpha, args.gamma):.3f} expected tokens per round, "
                  f"predicted speedup {predicted_speedup(args.alpha, args.gamma, args.c):.2f}x, "
                  f"optimal gamma {optimal_gamma(args.alpha, args.c)}")
        print(table([0.5, 0.7, 0.85, 0.95], [1, 2, 3, 4, 5, 6, 8], args.c))
    except ValueError as e:
        fail(str(e))
    return 0


def _theory_of_report(path_text: str) -> int:
    from pathlib import Path

    path = Path(path_text)
    path = path / "report.json" if path.is_dir() else path
    try:
        theory = json.loads(path.read_text())["theory"]
    except FileNotFoundError:
        fail(f"no bench report at {path}")
    except (json.JSONDecodeError, KeyError, TypeError):
        fail(f"{path} is not a verispec bench report")
    if not theory:
        print("the report has no drafting strategy with measured acceptance")
    for t in theory:
        with_cost = t.get("optimal_gamma_verify_cost")
        print(f"{t['strategy']}, T={t['temperature']}: measured per-token alpha {t['alpha']:.3f}, c {t['c']:.3f} -> "
              f"theory's optimal gamma {t['optimal_gamma']}"
              + (f" ({with_cost} with the measured verification cost)" if with_cost is not None else "")
              + f"; best measured gamma {t['best_measured_gamma']}")
        for g in t["per_gamma"]:
            print(f"  gamma {g['gamma']}: alpha {g['alpha']:.3f}, mean accepted length predicted "
                  f"{g['predicted_mean_accepted_length']:.2f} / measured {g['measured_mean_accepted_length']}, "
                  f"speedup predicted {g['predicted_speedup']:.2f}x / measured {g['measured_speedup']}x")
    return 0


def _params(args: argparse.Namespace):
    from verispec.engine import GenerationParams
    from verispec.sampling import SamplingParams

    if args.prompt == "-":
        args.prompt = sys.stdin.read()
    if not args.prompt.strip():
        fail("the prompt is empty")
    try:
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        return GenerationParams(
            max_new_tokens=args.max_new_tokens, gamma=default_gamma(args), sampling=sampling, seed=args.seed
        )
    except ValueError as e:
        fail(str(e))


def cmd_generate(args: argparse.Namespace) -> int:
    import dataclasses

    from verispec.cache import CacheFullError
    from verispec.engine import Generation, stream
    from verispec.models.load import default_threads
    from verispec.models.tokenizer import TextStream
    from verispec.strategies import make_proposer

    params = _params(args)
    strategy = "ar" if args.no_speculate else args.strategy
    options = _options(args)
    default_threads()
    progress = sys.stderr.isatty()
    target, draft = _load_models(args, [strategy], progress)
    tok = target.tokenizer
    prompt = tok.chat(args.prompt) if args.chat else tok.encode(args.prompt)
    params = dataclasses.replace(params, eos_ids=tok.eos_ids)
    proposer = make_proposer(strategy, target, draft, len(prompt) + params.max_new_tokens + params.gamma + 2, options)
    text = TextStream(tok, args.stop)
    result = Generation()
    try:
        for new in stream(target.model, prompt, params, proposer, result=result, stop_fn=text.stop_fn if args.stop else None):
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
        print(json.dumps({
            "text": text.text,
            "token_ids": result.token_ids,
            "finish_reason": result.finish_reason,
            "strategy": strategy,
            "metrics": metrics,
        }))
    else:
        print(tail, flush=True)
        summary = f"[{metrics.get('new_tokens')} tokens, {metrics.get('tokens_per_s')} tok/s"
        if proposer is not None:
            summary += f", alpha {metrics.get('alpha')}, mean accepted length {metrics.get('mean_accepted_length')}"
        print(summary + "]", file=sys.stderr)
    return 130 if result.finish_reason == "interrupted" else 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Listen at once (/health answers 503), load the models in the background, then serve."""
    import logging
    import os
    from pathlib import Path

    import uvicorn

    from verispec.models.load import default_threads
    from verispec.models.packaged import PACKAGED
    from verispec.server import Models, ServerSettings, create_app

    options = _options(args)
    name = args.served_model_name or (args.target if args.target in PACKAGED else Path(args.target).name)
    try:
        settings = ServerSettings(
            model_name=name, strategy=args.strategy, gamma=args.gamma,
            api_key=args.api_key or os.environ.get("VERISPEC_API_KEY") or None,
            max_concurrency=args.max_concurrency, max_prompt_tokens=args.max_prompt_tokens,
            max_new_tokens_limit=args.max_new_tokens_limit, speculate_max_batch=args.speculate_max_batch,
            batch_draft=not args.draft_per_request, options=options,
        )
    except ValueError as e:
        fail(str(e))
    if not 0 < args.port < 65536:
        fail(f"--port must be in 1..65535, got {args.port}")
    default_threads()
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    failure: list[str | None] = []  # None: the message is already printed

    def load() -> Models:
        target, draft = _load_models(args, [args.strategy], progress=False)
        return Models(target, draft)

    def on_load_failure(error: BaseException) -> None:
        failure.append(None if isinstance(error, SystemExit) else str(error))
        server.should_exit = True

    app = create_app(settings, load=load, on_load_failure=on_load_failure)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level))
    server.run()
    if failure:
        if failure[0] is None:
            raise SystemExit(2)
        fail(failure[0])
    return 0


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        fail(f"{flag} takes a comma list of integers, got {text!r}")
    if not values or min(values) < 1:
        fail(f"{flag} needs positive integers, got {text!r}")
    return values


def cmd_calibrate_layerskip(args: argparse.Namespace) -> int:
    from verispec.bench.suite import load_prompts
    from verispec.models.load import default_threads, load
    from verispec.proposers.layerskip import calibrate, model_id, save_calibration

    candidates = _int_list(args.candidates, "--candidates") if args.candidates else None
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "bench":
            from verispec.bench.command import cmd_bench

            return cmd_bench(args)
        if args.command == "theory":
            return cmd_theory(args)
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "calibrate-layerskip":
            return cmd_calibrate_layerskip(args)
    except ModelError as e:
        fail(str(e))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
