"""The prompts a bench runs: the packaged suite, or a user's JSON Lines file.

The packaged suite (data/suite.jsonl) follows Spec-Bench's categories because speculation pays off very
differently across tasks: copying-heavy ones (code editing, summarization, retrieval-augmented answers) let
a draft or n-gram lookup guess long runs, while open-ended ones (translation, questions) do not. Reporting
per category keeps one average from hiding that. Every entry is a chat conversation ending in a user turn, so
requests go through the model's chat template the way a user's would.

A user file has one JSON object per line: ``prompt`` (a string, sent as one user message) or ``messages``
(``[{"role": ..., "content": ...}, ...]``), and optionally ``category`` (default "custom") and ``id``
(default "<category>-<line number>"). Blank lines are skipped. The source string "suite" always means the
packaged suite; to load a file literally named ``suite``, pass ``./suite``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

CATEGORIES: tuple[str, ...] = (
    "multi_turn", "translation", "summarization", "qa", "math", "rag", "code_completion", "code_instruct", "code_edit",
)
ROLES: tuple[str, ...] = ("system", "user", "assistant")
DEFAULT_CATEGORY = "custom"
SUITE_NAME = "the packaged suite (verispec/bench/data/suite.jsonl)"


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark request: a chat conversation whose last message is the user's."""

    id: str
    category: str
    messages: tuple[dict[str, str], ...]


def load_prompts(
    source: str | os.PathLike[str] = "suite", categories: list[str] | None = None, limit: int | None = None
) -> list[BenchPrompt]:
    """Prompts in file order, optionally only `categories` and at most the first `limit` of each category.

    Raises ValueError, naming the file and line, for anything wrong with the input, so the CLI can print it
    as is.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    if isinstance(source, str) and source == "suite":
        name = SUITE_NAME
        text = resources.files("verispec.bench").joinpath("data", "suite.jsonl").read_text(encoding="utf-8")
    else:
        name, text = _read_user_file(Path(source))
    prompts = parse_prompts(text, name)
    if categories is not None:
        available = list(dict.fromkeys(p.category for p in prompts))
        wanted = list(dict.fromkeys(categories))
        if not wanted:
            raise ValueError(f"no categories given; available in {name}: {', '.join(available)}")
        unknown = [c for c in wanted if c not in available]
        if unknown:
            raise ValueError(
                f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))} "
                f"in {name}; available: {', '.join(available)}"
            )
        prompts = [p for p in prompts if p.category in wanted]
    if limit is not None:
        seen: Counter[str] = Counter()
        kept = []
        for p in prompts:
            seen[p.category] += 1
            if seen[p.category] <= limit:
                kept.append(p)
        prompts = kept
    return prompts


def _read_user_file(path: Path) -> tuple[str, str]:
    """(name for messages, text); a missing file, a directory or non-UTF-8 bytes become ValueErrors."""
    name = str(path)
    if not path.exists():
        raise ValueError(f"{name}: prompts file does not exist")
    if path.is_dir():
        raise ValueError(f"{name}: is a directory, not a JSON Lines prompts file")
    try:
        return name, path.read_text(encoding="utf-8-sig")  # -sig: tolerate a byte-order mark
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def parse_prompts(text: str, name: str = "<prompts>") -> list[BenchPrompt]:
    """Parse JSON Lines text; `name` is what error messages call the source."""
    prompts: list[BenchPrompt] = []
    first_line: dict[str, int] = {}
    # Split on "\n" only: str.splitlines() also splits on U+2028 and friends, which JSON strings may hold raw.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{name}, line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
        prompt = _prompt(obj, number, where)
        if prompt.id in first_line:
            raise ValueError(f"{where}: duplicate id {prompt.id!r} (first used on line {first_line[prompt.id]})")
        first_line[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{name}: no prompts (the file is empty)")
    return prompts


def _prompt(obj: Any, number: int, where: str) -> BenchPrompt:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    category = obj.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category.strip():
        raise ValueError(f"{where}: 'category' must be a non-empty string")
    pid = obj.get("id", f"{category}-{number}")
    if not isinstance(pid, str) or not pid.strip():
        raise ValueError(f"{where}: 'id' must be a non-empty string")
    if "prompt" in obj and "messages" in obj:
        raise ValueError(f"{where}: give either 'prompt' or 'messages', not both")
    if "prompt" in obj:
        text = obj["prompt"]
        if not isinstance(text, str):
            raise ValueError(f"{where}: 'prompt' must be a string, got {type(text).__name__}")
        if not text.strip():
            raise ValueError(f"{where}: empty prompt")
        messages: tuple[dict[str, str], ...] = ({"role": "user", "content": text},)
    elif "messages" in obj:
        messages = _messages(obj["messages"], where)
    else:
        raise ValueError(f"{where}: missing 'prompt' or 'messages'")
    return BenchPrompt(id=pid, category=category, messages=messages)


def _messages(raw: Any, where: str) -> tuple[dict[str, str], ...]:
    """Check a chat conversation: role/content objects, non-empty content, ending with the user's turn."""
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where}: 'messages' must be a non-empty list of {{\"role\", \"content\"}} objects")
    out = []
    for i, m in enumerate(raw):
        at = f"{where}: messages[{i}]"
        if not isinstance(m, dict):
            raise ValueError(f"{at} must be an object with 'role' and 'content', got {type(m).__name__}")
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise ValueError(f"{at} has unexpected keys {', '.join(map(repr, extra))}; only 'role' and 'content'")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ValueError(f"{at}: 'role' must be one of {', '.join(ROLES)}, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"{at}: 'content' must be a string, got {type(content).__name__}")
        if not content.strip():
            raise ValueError(f"{at}: empty content")
        out.append({"role": role, "content": content})
    if out[-1]["role"] != "user":
        raise ValueError(f"{where}: the last message must be the user's (the model answers it), got "
                         f"{out[-1]['role']!r}")
    return tuple(out)
