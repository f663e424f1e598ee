"""Drafting strategies by name: what `--strategy` selects in `generate` and `bench`.

A strategy turns the loaded models into a fresh `Proposer` for one request (or None: plain decoding).
Adding a proposer means adding one entry here; the engine, verifier and bench stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from verispec.models.llama import LlamaModel
from verispec.models.load import LoadedModel
from verispec.proposers.adaptive import AdaptiveGammaProposer
from verispec.proposers.base import Proposer
from verispec.proposers.draft_model import DraftModelProposer
from verispec.proposers.layerskip import LayerSkipProposer, load_calibration, model_id
from verispec.proposers.lookahead import LookaheadProposer
from verispec.proposers.mix import DraftNgramProposer
from verispec.proposers.ngram import NgramProposer


@dataclass(frozen=True)
class StrategyOptions:
    """Knobs some strategies read; each ignores the ones it has no use for."""

    ngram_max: int = 3
    # None: 2 for ngram (a 1-token match is a weak guess, and verifying it costs a wider forward); 3 for draft+ngram,
    # whose fallback, the draft model, out-guesses a 2-token match on predictable text (benchmarks/profile_round.py)
    ngram_min: int | None = None
    layerskip_layers: int | None = None  # None: the saved calibration for the target, else half its layers
    lookahead_window: int = 5  # W: Jacobi window columns
    lookahead_ngram: int = 3  # N: n-gram size (window levels + 1)
    lookahead_candidates: int = 5  # G: pool continuations kept per first token
    draft_confidence: float | None = None  # stop drafting below this draft probability; None: the strategy's default


ADAPTIVE_CONFIDENCE = 0.3  # adaptive's default confidence stop


@dataclass(frozen=True)
class Strategy:
    name: str
    needs_draft: bool
    help: str
    # (target, draft or None, max sequence length, options) -> a proposer for one request, or None
    build: Callable[[LoadedModel, LoadedModel | None, int, StrategyOptions], Proposer | None]


def _draft(target: LoadedModel, draft: LoadedModel | None, max_len: int, options: StrategyOptions,
           confidence: float = 0.0) -> DraftModelProposer:
    assert draft is not None
    if options.draft_confidence is not None:
        confidence = options.draft_confidence
    return DraftModelProposer(draft.model, max_len, vocab_size=target.model.vocab_size, confidence=confidence)


def _adaptive(target: LoadedModel, draft: LoadedModel | None, max_len: int, options: StrategyOptions) -> Proposer:
    return AdaptiveGammaProposer(_draft(target, draft, max_len, options, confidence=ADAPTIVE_CONFIDENCE))


def _native(target: LoadedModel, strategy: str) -> LlamaModel:
    if not isinstance(target.model, LlamaModel):
        raise ValueError(
            f"strategy {strategy!r} needs a native Llama-family target (llama/qwen2/mistral); "
            f"{target.name} runs through {type(target.model).__name__}"
        )
    return target.model


def _layerskip(target: LoadedModel, draft: LoadedModel | None, max_len: int, options: StrategyOptions) -> Proposer:
    model = _native(target, "layerskip")
    layers = options.layerskip_layers
    if layers is None:
        saved = load_calibration(None, model_id(target))
        layers = saved["best_layers"] if saved else max(1, model.cfg.num_hidden_layers // 2)
    return LayerSkipProposer(model, layers)


def _lookahead(target: LoadedModel, draft: LoadedModel | None, max_len: int, options: StrategyOptions) -> Proposer:
    _native(target, "lookahead")  # the window needs positions and a tree mask in the target forward
    return LookaheadProposer(options.lookahead_window, options.lookahead_ngram, options.lookahead_candidates)


def _ngram(target: LoadedModel, draft: LoadedModel | None, max_len: int, options: StrategyOptions) -> Proposer:
    return NgramProposer(options.ngram_max, min(options.ngram_min or 2, options.ngram_max))


def _draft_ngram(target: LoadedModel, draft: LoadedModel | None, max_len: int, options: StrategyOptions) -> Proposer:
    least = min(options.ngram_min or 3, options.ngram_max)
    ngram = NgramProposer(options.ngram_max, least)
    return DraftNgramProposer(_draft(target, draft, max_len, options), ngram, min_match=least)


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in [
        Strategy("ar", False, "plain autoregressive decoding with the target alone", lambda *a: None),
        Strategy("draft", True, "a separate, smaller draft model", _draft),
        Strategy("adaptive", True, "the draft model, gamma chosen per round from live alpha and c (--gamma caps it), "
                 "stopping where the draft is unsure", _adaptive),
        Strategy("layerskip", False, "self-speculation: the target's first layers draft (no draft model)", _layerskip),
        Strategy("lookahead", False, "lookahead decoding: Jacobi window + n-gram pool (no draft model)", _lookahead),
        Strategy("ngram", False, "prompt lookup: copy what followed the last match of the suffix (no model)", _ngram),
        Strategy("draft+ngram", True, "prompt lookup when the suffix matches, else the draft model", _draft_ngram),
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
