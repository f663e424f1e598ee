"""Drafting strategies by name: what `--strategy` selects in `generate` and `bench`.

A strategy turns the loaded models into a fresh `Proposer` for one request (or None: plain decoding).
Adding a proposer means adding one entry here; the engine, verifier and bench stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from verispec.models.load import LoadedModel
from verispec.proposers.base import Proposer
from verispec.proposers.draft_model import DraftModelProposer


@dataclass(frozen=True)
class StrategyOptions:
    """Knobs some strategies read; each ignores the ones it has no use for."""

    ngram_max: int = 3
    ngram_min: int = 1


@dataclass(frozen=True)
class Strategy:
    name: str
    needs_draft: bool
    help: str
    # (target, draft or None, max sequence length, options) -> a proposer for one request, or None
    build: Callable[[LoadedModel, LoadedModel | None, int, StrategyOptions], Proposer | None]


def _draft(target: LoadedModel, draft: LoadedModel | None, max_len: int, options: StrategyOptions) -> Proposer:
    assert draft is not None
    return DraftModelProposer(draft.model, max_len, vocab_size=target.model.vocab_size)


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in [
        Strategy("ar", False, "plain autoregressive decoding with the target alone", lambda *a: None),
        Strategy("draft", True, "a separate, smaller draft model", _draft),
    ]
}


def get(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}") from None


def make_proposer(
    name: str, target: LoadedModel, draft: LoadedModel | None, max_len: int, options: StrategyOptions = StrategyOptions()
) -> Proposer | None:
    strategy = get(name)
    if strategy.needs_draft and draft is None:
        raise ValueError(f"strategy {name!r} needs a draft model")
    return strategy.build(target, draft, max_len, options)
