"""What every command shares: the parser that fails in one line, `fail`, and small argument types."""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import NoReturn

__all__ = ["Parser", "fail", "finite", "duration", "int_list", "comma_list"]


def fail(message: str) -> NoReturn:
    """Print one line, `verispec: error: MESSAGE`, on stderr and exit with code 2 (no traceback)."""
    print(f"verispec: error: {message}", file=sys.stderr)
    raise SystemExit(2)


class Parser(argparse.ArgumentParser):
    """argparse with verispec's bad-input contract: exit code 2 and one line."""

    def error(self, message: str) -> NoReturn:
        fail(message)


def finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text}")
    return value


def int_list(text: str, flag: str) -> list[int]:
    """'4,8' -> [4, 8]: positive integers, else fail naming the flag."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        fail(f"{flag} takes a comma list of integers, got {text!r}")
    if not values or min(values) < 1:
        fail(f"{flag} needs positive integers, got {text!r}")
    return values


def comma_list(text: str, kind, flag: str) -> list:
    """'a,b,a' -> [kind('a'), kind('b')]: a non-empty list without repeats, else fail naming the flag."""
    try:
        items = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"{flag}: expected a comma-separated list, got {text!r}")
    if not items:
        fail(f"{flag} is empty")
    return list(dict.fromkeys(items))


def duration(text: str) -> float:
    """'30m', '1h', '90s', '1h30m' or plain seconds -> seconds."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    else:
        parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
        if not parts or not any(parts.groups()):
            raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 1h, 90s)")
        h, m, s = (int(g) if g else 0 for g in parts.groups())
        seconds = 3600.0 * h + 60.0 * m + s
    if seconds <= 0:
        raise argparse.ArgumentTypeError("a duration must be positive")
    return seconds
