"""`verispec serve`: the OpenAI-compatible HTTP server, with generate's strategies and defaults."""

from __future__ import annotations

import argparse

from verispec.cli.common import fail, finite
from verispec.cli.options import (
    add_config_option, add_gamma_argument, add_model_options, add_strategy_argument, add_strategy_options,
    announce, gamma_of, load_models, resolve_dtype, strategy_options,
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
    srv.add_argument("--prefix-cache-mb", type=int, default=256, help="keep recent prompts' keys and values, up to "
                     "this many MB: a prompt that begins like one of them (a conversation's next turn, a shared "
                     "system prompt) prefills only the rest (default: %(default)s; 0 keeps none)")
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
    ray = srv.add_argument_group("replicas on Ray Serve (--backend ray; pip install -e '.[ray]')")
    ray.add_argument("--backend", choices=["single", "ray"], default="single", help="single: one process serves; "
                     "ray: replicas of it behind one endpoint on Ray Serve (default: %(default)s)")
    ray.add_argument("--replicas", type=int, default=None, help="replicas, each one engine with its own batch rows "
                     "(default: 1)")
    ray.add_argument("--min-replicas", type=int, default=None, help="autoscale between this and --max-replicas on "
                     "the requests ongoing per replica")
    ray.add_argument("--max-replicas", type=int, default=None)
    ray.add_argument("--target-ongoing-requests", type=finite, default=None, help="autoscaling aims at this many "
                     "requests per replica (default: half of --max-concurrency)")
    ray.add_argument("--replica-cpus", type=finite, default=None, help="CPUs each replica reserves, also its torch "
                     "threads (default: the cluster's CPUs / replicas)")
    ray.add_argument("--replica-gpus", type=finite, default=None, help="GPUs each replica reserves (default: 1 with "
                     "--device cuda, else 0)")
    ray.add_argument("--ray-address", default=None, help="the Ray cluster to join, e.g. auto or HEAD:6379 (default: "
                     "start a local Ray instance)")
    srv.set_defaults(run=run)


_RAY_ONLY = ("replicas", "min_replicas", "max_replicas", "target_ongoing_requests", "replica_cpus", "replica_gpus",
             "ray_address")


def replica_models(args: argparse.Namespace):
    """The models of one Ray replica (module level, so that Ray can send it to the replica's process)."""
    from verispec.server import Models

    try:
        return Models(*load_models(args, [args.strategy], progress=False))
    except SystemExit:  # `fail` printed the one-line reason to the replica's log
        raise RuntimeError("loading the models failed; the reason is in the replica's log") from None


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
            prefix_cache_mb=args.prefix_cache_mb,
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
    if args.backend == "ray":
        return _run_ray(args, settings, defaulted)
    given = [f"--{n.replace('_', '-')}" for n in _RAY_ONLY if getattr(args, n) is not None]
    if given:
        fail(f"{given[0]} applies to --backend ray only")
    default_threads()
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    failure: list[str | None] = []  # None: the message is already printed

    def load() -> Models:
        target, draft = load_models(args, [args.strategy], progress=False)
        announce(args, args.strategy, draft is not None, defaulted)
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


def _run_ray(args: argparse.Namespace, settings, defaulted: bool) -> int:
    """Deploy the replicas on Ray Serve (local Ray unless --ray-address), then serve until Ctrl-C."""
    import functools
    import signal
    import sys
    import time

    from verispec.models.errors import ModelError
    from verispec.models.load import resolve
    from verispec.strategies import STRATEGIES

    try:
        from verispec.server import ray_serve
    except ImportError as e:
        fail(f"--backend ray needs Ray Serve ({e.name} is missing): pip install -e '.[ray]'")
    if args.replicas is not None and (args.min_replicas is not None or args.max_replicas is not None):
        fail("give --replicas, or --min-replicas and --max-replicas to autoscale, not both")
    options = ray_serve.RayOptions(
        replicas=args.replicas or 1, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
        target_ongoing_requests=args.target_ongoing_requests, replica_cpus=args.replica_cpus,
        replica_gpus=args.replica_gpus if args.replica_gpus is not None else float(args.device.startswith("cuda")),
        address=args.ray_address, host=args.host, port=args.port)
    needs_draft = STRATEGIES[args.strategy].needs_draft
    try:  # convert the model files here, once: replicas on this node then find them in the shared cache
        resolve(args.target, progress=True)
        if needs_draft:
            resolve(args.draft, progress=True)
    except ModelError as e:
        fail(str(e))
    announce(args, args.strategy, needs_draft, defaulted)
    n = f"{options.min_replicas}-{options.max_replicas}" if options.max_replicas else str(options.replicas)
    print(f"verispec: starting {n} replica(s) on Ray Serve (each loads the models)...", file=sys.stderr)
    try:
        ray_serve.deploy(functools.partial(replica_models, args), settings, options, args.log_level)
    except ValueError as e:
        ray_serve.shutdown()
        fail(str(e))
    except Exception as e:  # noqa: BLE001 - Ray's deployment failure carries the replica's traceback
        ray_serve.shutdown()
        fail(f"the replicas did not start: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}")
    print(f"verispec: serving {settings.model_name} on http://{args.host}:{args.port} with {n} replica(s) on Ray "
          "Serve (/health lists them); Ctrl-C stops", file=sys.stderr)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the replicas on a plain `kill` too
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        ray_serve.shutdown()
    return 0
