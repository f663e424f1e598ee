"""`verispec serve`: the OpenAI-compatible HTTP server, with generate's strategies and defaults."""

from __future__ import annotations

import argparse

from verispec.cli.common import fail, finite
from verispec.cli.options import (
    add_config_option, add_gamma_argument, add_model_options, add_strategy_argument, add_strategy_options,
    announce_defaults, gamma_of, load_models, resolve_dtype, strategy_options,
)
from verispec.defaults import DEFAULT_STRATEGY


def add_parser(sub, default_target: str, default_draft: str) -> None:
    srv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server: batched speculative decoding, streaming, metrics")
    add_model_options(srv, default_target, default_draft)
    add_strategy_argument(srv, DEFAULT_STRATEGY)
    add_gamma_argument(srv)
    add_config_option(srv)
    add_strategy_options(srv)
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
    srv.add_argument("--max-body-bytes", type=int, default=4 * 2**20, help="larger request bodies get a 413 before "
                     "they are read (default: %(default)s)")
    srv.add_argument("--max-prompt-chars", type=int, default=None, help="longer prompt text gets a 400 before it is "
                     "tokenized (default: 32 per --max-prompt-tokens)")
    srv.add_argument("--body-timeout", type=float, default=30.0, help="seconds a request body may take to arrive "
                     "before a 408 closes the connection (default: %(default)s)")
    srv.add_argument("--allow-special-tokens", action="store_true", help="let raw completion prompts spell control "
                     "tokens such as <|im_end|> (default: encoded as plain text; chat message text always is)")
    srv.add_argument("--draft-per-request", action="store_true", help="strategies with a draft model: run it "
                     "request by request instead of batched across requests (slower; for comparison)")
    srv.add_argument("--drift-window", type=int, default=200, help="drift watch: rounds per strategy its "
                     "acceptance and tokens per forward are measured over (default: %(default)s)")
    srv.add_argument("--drift-drop", type=finite, default=0.05, help="drift watch: warn when acceptance falls this "
                     "fraction below its baseline (a --config's, else the first window's; default: %(default)s)")
    srv.add_argument("--no-drift-fallback", action="store_true", help="keep speculating when the drift watch "
                     "measures that it no longer pays (default: decode plainly, probing now and then)")
    srv.set_defaults(drift_baseline=None)
    srv.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    srv.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Listen at once (/health answers 503), load the models in the background, then serve."""
    import logging
    import os
    from pathlib import Path

    import uvicorn

    from verispec.models.load import default_threads
    from verispec.models.packaged import PACKAGED
    from verispec.server import Models, ServerSettings, create_app
    from verispec.strategies import STRATEGIES

    defaulted = resolve_dtype(args)
    options = strategy_options(args, [args.strategy])
    if args.draft_per_request and not STRATEGIES[args.strategy].needs_draft:
        with_draft = [s.name for s in STRATEGIES.values() if s.needs_draft]
        fail(f"--draft-per-request applies to strategies with a draft model only ({', '.join(with_draft)}; "
             f"the strategy is {args.strategy})")
    gamma = gamma_of(args)
    name = args.served_model_name or (args.target if args.target in PACKAGED else Path(args.target).name)
    try:
        settings = ServerSettings(
            model_name=name, strategy=args.strategy, gamma=gamma,
            api_key=args.api_key or os.environ.get("VERISPEC_API_KEY") or None,
            max_concurrency=args.max_concurrency, max_prompt_tokens=args.max_prompt_tokens,
            max_new_tokens_limit=args.max_new_tokens_limit, speculate_max_batch=args.speculate_max_batch,
            batch_draft=not args.draft_per_request, options=options, max_body_bytes=args.max_body_bytes,
            max_prompt_chars=args.max_prompt_chars, body_timeout=args.body_timeout,
            allow_special_tokens=args.allow_special_tokens, drift_window=args.drift_window,
            drift_drop=args.drift_drop, drift_fallback=not args.no_drift_fallback,
            drift_baseline=args.drift_baseline or {},
        )
    except ValueError as e:
        fail(str(e))
    if not 0 < args.port < 65536:
        fail(f"--port must be in 1..65535, got {args.port}")
    default_threads()
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    failure: list[str | None] = []  # None: the message is already printed

    def load() -> Models:
        target, draft = load_models(args, [args.strategy], progress=False)
        if defaulted:
            announce_defaults(args, args.strategy, draft is not None)
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
