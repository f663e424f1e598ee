"""verispec command line: `verispec generate PROMPT`, `serve`, `bench`, `audit`, `tune`, `theory`,
`calibrate-layerskip`, `train-drafter`.

One module per command (generate.py, serve.py, bench.py, audit.py, tune.py, theory.py, calibrate_layerskip.py,
train_drafter.py), each with
`add_parser(sub, ...)` and `run(args)`; the options several commands share (models, strategy and its knobs)
are defined once in options.py, the hardware-dependent defaults in verispec/defaults.py.
"""

from __future__ import annotations

import sys

from verispec.cli import audit, bench, calibrate_layerskip, generate, serve, theory, train_drafter, tune
from verispec.cli.common import Parser, fail
from verispec.models.errors import ModelError

__all__ = ["main", "build_parser", "fail"]


def build_parser() -> Parser:
    from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET

    parser = Parser(prog="verispec", description="Lossless speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    generate.add_parser(sub, DEFAULT_TARGET, DEFAULT_DRAFT)
    bench.add_parser(sub, DEFAULT_TARGET, DEFAULT_DRAFT)
    audit.add_parser(sub, DEFAULT_TARGET, DEFAULT_DRAFT)
    tune.add_parser(sub, DEFAULT_TARGET, DEFAULT_DRAFT)
    calibrate_layerskip.add_parser(sub, DEFAULT_TARGET)
    serve.add_parser(sub, DEFAULT_TARGET, DEFAULT_DRAFT)
    theory.add_parser(sub)
    train_drafter.add_parser(sub, DEFAULT_TARGET)
    parser.commands = sub.choices
    return parser


def with_config(parser: Parser, argv: list[str] | None, args):
    """Parse again with a `--config` file's values (verispec tune) as the command's defaults: flags given on the
    command line still win."""
    from verispec.tune import read_config

    try:
        values = read_config(args.config)
    except ValueError as e:
        fail(str(e))
    if args.command == "bench":  # bench runs lists: plain decoding and the tuned strategy at the tuned gamma
        strategy, gamma = values.pop("strategy", None), values.pop("gamma", None)
        if strategy is not None:
            values["strategies"] = f"ar,{strategy}" if strategy != "ar" else "ar"
        if gamma is not None:
            values["gamma"] = str(gamma)
    from verispec.cli.options import STRATEGY_FLAGS, option_dest

    # the tuned strategy's own flags (its drafter, say) unless the command line gives them (an appended --drafter
    # would otherwise join the config's)
    given = {option_dest(f) for f in STRATEGY_FLAGS if getattr(args, option_dest(f), None) is not None}
    command = parser.commands[args.command]
    command.set_defaults(**{k: v for k, v in values.items() if hasattr(args, k) and k not in given})
    final = parser.parse_args(argv)
    # and only where a strategy that reads them runs: a --strategy beside the config may name another, and a flag
    # that no strategy of the run reads is refused
    names = set(final.strategies.split(",") if args.command == "bench" else [getattr(final, "strategy", "")])
    for flag, (_, readers) in STRATEGY_FLAGS.items():
        dest = option_dest(flag)
        if dest in values and dest not in given and not names & set(readers):
            setattr(final, dest, None)
    return final


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "config", None):
        args = with_config(parser, argv, args)
    try:
        return args.run(args)
    except ModelError as e:
        fail(str(e))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

