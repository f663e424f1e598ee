"""Structured output: a grammar (a JSON schema, a regex or a Lark grammar) that the output must follow.

The grammar is compiled by llguidance (a well-kept Rust library) into a matcher over token ids. Under speculation
the round masks the target's logits at every verified position with the tokens the grammar allows *after the
drafts before that position* (a tree node's ancestors), exactly as penalties are applied: the output is then
distributed as the constrained target decoding alone, and is always valid. The same mask is applied to the
proposer's logits while it drafts (where the proposer takes a shaper), so drafts the grammar forbids are not
proposed; that only raises acceptance, since q is whatever the drafts were really drawn from.

A `Constraint` is one sequence's state: `allowed(path)` (the mask after the committed output plus `path`, with
the matcher rolled back afterwards) and `advance(tokens)` (commit the emitted tokens). The round needs nothing
else, so tests drive it with small hand-written automata as well.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch
from torch import Tensor

GrammarKind = Literal["json_schema", "json_object", "regex", "lark"]


class Constraint(Protocol):
    def allowed(self, path: list[int]) -> Tensor | None:
        """bool [V]: the tokens the grammar allows after the committed output and `path`; None where `path` itself
        breaks the grammar (that position can never be reached: an earlier draft has probability 0)."""

    def advance(self, tokens: list[int]) -> None:
        """The sequence's output grew by `tokens` (each one allowed, as the masks ensure)."""


def mask_logits(logits: Tensor, allowed: Tensor) -> Tensor:
    """logits [..., V] with the tokens `allowed` [V] does not hold at -inf. Raises where it holds none."""
    if not bool(allowed.any()):
        raise ValueError("the grammar allows no next token")
    return logits.masked_fill(~allowed.to(logits.device), float("-inf"))


# Whitespace between JSON tokens: a line break and an indent, bounded. Unbounded whitespace let a sampled answer
# pad forever where the schema wanted a key the model did not (3 of 50 answers cut at 200 tokens of spaces).
JSON_OPTIONS = {"whitespace_pattern": r"(\r?\n)?[ \t]{0,40}"}


@dataclass(frozen=True)
class GrammarSpec:
    """What a request asks the output to follow: kind and source (a JSON schema as JSON text, a regex, a Lark
    grammar; json_object: any JSON object)."""

    kind: GrammarKind
    source: str = ""

    def grammar(self) -> str:
        """llguidance's grammar text. Raises ValueError for malformed input."""
        from llguidance import LLMatcher

        if self.kind == "json_schema":
            try:
                schema = json.loads(self.source)
            except json.JSONDecodeError as e:
                raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
            return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        if self.kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.source)
        if self.kind == "lark":
            return LLMatcher.grammar_from_lark(self.source)
        raise ValueError(f"unknown grammar kind {self.kind!r}")


class GrammarCompiler:
    """A tokenizer's llguidance view, built once (about a second for a 150k-token vocabulary), and the matchers
    made from it. vocab_size: the model's logits rows (may exceed the tokenizer's; the extra ids are never
    allowed); eos_ids: the tokens that end a sequence, allowed once the grammar is complete."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> None:
        import llguidance

        if not eos_ids:
            raise ValueError("structured output needs a tokenizer with an end-of-sequence token")
        self.vocab_size = vocab_size
        try:  # byte-level BPE and other tokenizers llguidance reads from tokenizer.json itself
            self.tokenizer = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size,
                                                    eos_token=list(eos_ids))
        except ValueError:  # e.g. a word-level tokenizer: each token's text as its bytes
            self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Words(tokenizer, vocab_size, eos_ids)),
                                                    n_vocab=vocab_size, eos_token=list(eos_ids))

    def check(self, spec: GrammarSpec) -> str:
        """The compiled grammar; ValueError with llguidance's reason where it is invalid."""
        from llguidance import LLMatcher

        grammar = spec.grammar()
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if is_error:
            raise ValueError(f"invalid {spec.kind.replace('_', ' ')}: {messages[0] if messages else 'rejected'}")
        return grammar

    def constraint(self, spec: GrammarSpec) -> "Matcher":
        return Matcher(self, self.check(spec))


class Matcher:
    """One sequence's grammar state (an llguidance matcher): the Constraint the round uses."""

    def __init__(self, compiler: GrammarCompiler, grammar: str) -> None:
        from llguidance import LLMatcher

        self.vocab_size = compiler.vocab_size
        self.matcher = LLMatcher(compiler.tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise ValueError(f"invalid grammar: {self.matcher.get_error()}")

    def _mask(self) -> Tensor:
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        return torch.from_numpy(bits[: self.vocab_size].astype(bool))

    def allowed(self, path: list[int]) -> Tensor | None:
        n = self.matcher.try_consume_tokens(path) if path else 0
        try:
            return self._mask() if n == len(path) else None
        finally:
            if n:
                self.matcher.rollback(n)

    def advance(self, tokens: list[int]) -> None:
        if tokens and not self.matcher.consume_tokens(tokens):
            raise ValueError(f"the grammar rejected an emitted token: {self.matcher.get_error()}")


class _Words:
    """What llguidance's TokenizerWrapper reads from a tokenizer it cannot parse itself: each token's bytes."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> None:
        n = min(len(tokenizer), vocab_size)
        self.tokens = [tokenizer.token_text(i).encode() for i in range(n)]
        self.eos_token_id, self.bos_token_id = eos_ids[0], None
        self.special_token_ids = list(eos_ids)
        self._tok = tokenizer

    def __call__(self, text: str) -> list[int]:
        return self._tok.encode(text, special=False, bos=False)
