"""verispec command line: `verispec generate PROMPT`, `serve`, `bench`, `audit`, `theory`, `calibrate-layerskip`,
`train-drafter`.

One module per command (generate.py, serve.py, bench.py, audit.py, theory.py, calibrate_layerskip.py,
train_drafter.py), each with
`add_parser(sub, ...)` and `run(args)`; the options several commands share (models, strategy and its knobs)
are defined once in options.py, the hardware-dependent defaults in verispec/defaults.py.
"""

from __future__ import annotations

import sys

from verispec.cli import audit, bench, calibrate_layerskip, generate, serve, theory, train_drafter
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
    calibrate_layerskip.add_parser(sub, DEFAULT_TARGET)
    serve.add_parser(sub, DEFAULT_TARGET, DEFAULT_DRAFT)
    theory.add_parser(sub)
    train_drafter.add_parser(sub, DEFAULT_TARGET)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ModelError as e:
        fail(str(e))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

