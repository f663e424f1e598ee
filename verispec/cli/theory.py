"""`verispec theory`: expected tokens per round, predicted speedup and the optimal gamma (verispec/theory.py)."""

from __future__ import annotations

import argparse
import gzip
import json

from verispec.cli.common import fail, finite


def add_parser(sub) -> None:
    th = sub.add_parser("theory", help="expected tokens per round, predicted speedup and the optimal gamma")
    th.add_argument("--alpha", type=finite, default=None, help="acceptance rate in [0, 1]")
    th.add_argument("--gamma", type=int, default=4, help="tokens drafted per round (default: %(default)s)")
    th.add_argument("--c", type=finite, default=0.2, help="draft cost / target cost per forward (default: %(default)s)")
    th.add_argument("--report", default=None, help="a bench report.json (or its directory): the gamma its measured alpha and c call for, next to the gamma that measured best")
    th.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
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

    from verispec.bench.report import read_recorded, recorded

    path = Path(path_text)
    path = (recorded(path / "report.json") or path / "report.json") if path.is_dir() else path
    try:
        theory = json.loads(read_recorded(path))["theory"]
    except FileNotFoundError:
        fail(f"no bench report at {path}")
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
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
