"""Drafting strategies by name: what `--strategy` selects in `generate`, `bench` and `serve`.

A strategy turns the loaded models into a `Proposer` (or None: plain decoding) that serves up to `rows`
sequences of up to `max_len` tokens at once: one row for `generate`, the server's batch for `serve`.
Adding a proposer means adding one entry here; the round, verifier, bench and server stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from verispec.defaults import default_verify_cost, draft_window
from verispec.models.base import CausalLM, weight_bytes_per_token
from verispec.models.kernels import kernel_isa
from verispec.models.hf import HFCausalLM
from verispec.models.llama import LlamaModel
from verispec.models.load import LoadedModel
from verispec.models.quant import W4A8Linear
from verispec.proposers.adaptive import AdaptiveGammaProposer
from verispec.proposers.base import PerRow, Proposer
from verispec.proposers.cross import CrossTokenizerProposer
from verispec.proposers.draft_model import DraftModelProposer
from verispec.proposers.eagle import DynamicTree, EagleProposer
from verispec.proposers.medusa import MedusaPlan, MedusaProposer
from verispec.proposers.layerskip import LayerSkipProposer, load_calibration, model_id
from verispec.proposers.lookahead import LookaheadProposer
from verispec.proposers.mix import DraftNgramProposer
from verispec.proposers.tree import TreeDraftProposer
from verispec.proposers.ngram import NgramProposer
from verispec.theory import VerifyCost, interpolate_cost


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
    # the draft model reads a prompt's first tokens and its last draft_context (proposers.draft_model.draft_context);
    # None: the default (verispec.defaults), 0: the whole prompt
    draft_context: int | None = None
    drafter: tuple[str, ...] = ()  # drafter directories (`verispec train-drafter`): eagle and medusa use their kind's
    # medusa: children per node at each depth (a token tree); () a chain; "auto": planned every round
    medusa_tree: tuple[int, ...] | str = ()
    eagle_tree: tuple[int, int] | None = None  # eagle: (top-k, depth) of EAGLE-2's dynamic tree for greedy rows


ADAPTIVE_CONFIDENCE = 0.3  # adaptive's default confidence stop
# auto's: a round's drafting stops after a token the draft gave less than half its probability. Against no stop, on
# 18 suite prompts (2 a category, 128 tokens, decode tok/s, benchmarks/profile_round.py, AMD EPYC): greedy prose
# +3-5% and code -2-0% (AVX-512 build, two runs), prose +3%, code 0% (AVX2 build); T = 0.7 prose +7%, code +4%
# (benchmarks/results/2026-11-28-epyc-auto-confidence). The length drafted depends on the draft alone: lossless.
AUTO_CONFIDENCE = 0.5
# eagle's and eagle+ngram's chains stop the same way, after a guess below 0.7. A stop at 0.5 with the γ cap the CLI
# gives (6 on the AVX-512 build) against γ = 2 without one, on a Zen 5 (benchmarks/results/2026-12-07-zen5-avx512-
# eagle-6x-data, decode tok/s): code and maths 1.74x against 1.55x plain decoding, all nine categories 1.36x against
# 1.32x. Then 0.7 against 0.5, all nine categories, five interleaved runs (benchmarks/results/2026-12-07-zen5-eagle-
# stop-0.7): +2.3% greedy and +1.6% at T = 0.7 with the AVX-512 build, +4.6%, +6.2% and +5.5% with the AVX2 one,
# where a verified row costs more.
EAGLE_CONFIDENCE = 0.7


@dataclass(frozen=True)
class Strategy:
    name: str
    needs_draft: bool
    help: str
    # (target, draft or None, Size, options) -> a proposer, or None
    build: Callable[[LoadedModel, LoadedModel | None, "Size", StrategyOptions], Proposer | None]
    own_tokenizer: bool = False  # its draft may have a tokenizer of its own (the pair's vocabularies are not checked)


@dataclass(frozen=True)
class Size:
    rows: int  # sequences served at once
    max_len: int  # tokens of the longest sequence (prompt + new tokens)
    max_gamma: int  # the longest proposal asked for


def _draft(target: LoadedModel, draft: LoadedModel | None, size: Size, options: StrategyOptions,
           confidence: float = 0.0) -> DraftModelProposer:
    assert draft is not None
    return DraftModelProposer(draft.model, size.max_len, vocab_size=target.model.vocab_size,
                              confidence=_confidence(options, confidence), rows=size.rows, max_gamma=size.max_gamma,
                              context=_draft_window(target, options))


def _confidence(options: StrategyOptions, default: float) -> float:
    """A chain's confidence stop: --draft-confidence, else the strategy's default."""
    return default if options.draft_confidence is None else options.draft_confidence


def _draft_window(target: LoadedModel, options: StrategyOptions) -> int | None:
    """The draft model's prompt window: --draft-context, else the default for the target's kernel build (0: the whole
    prompt, None)."""
    return draft_window(options.draft_context, kernel_isa() if _w4a8(target.model) else None)


def _adaptive(target: LoadedModel, draft: LoadedModel | None, size: Size, options: StrategyOptions) -> Proposer:
    return AdaptiveGammaProposer(_draft(target, draft, size, options, confidence=ADAPTIVE_CONFIDENCE))


def _native(target: LoadedModel, strategy: str) -> LlamaModel:
    if not isinstance(target.model, LlamaModel):
        raise ValueError(
            f"strategy {strategy!r} needs a native Llama-family target (llama/qwen2/mistral); "
            f"{target.name} runs through {type(target.model).__name__}"
        )
    return target.model


def _cross(target: LoadedModel, draft: LoadedModel | None, size: Size, options: StrategyOptions) -> Proposer:
    assert draft is not None
    # the draft's tokens per target token vary by tokenizer: room for twice as many, and a few drafted past the end
    return PerRow(lambda: CrossTokenizerProposer(draft.model, draft.tokenizer, target.tokenizer,
                                                 2 * size.max_len + 64))


def _layerskip(target: LoadedModel, draft: LoadedModel | None, size: Size, options: StrategyOptions) -> Proposer:
    model = _native(target, "layerskip")
    layers = options.layerskip_layers
    if layers is None:
        saved = load_calibration(None, model_id(target))
        layers = saved["best_layers"] if saved else max(1, model.cfg.num_hidden_layers // 2)
    return LayerSkipProposer(model, layers)


def _lookahead(target: LoadedModel, draft: LoadedModel | None, size: Size, options: StrategyOptions) -> Proposer:
    _native(target, "lookahead")  # the window needs positions and a tree mask in the target forward
    w, n, g = options.lookahead_window, options.lookahead_ngram, options.lookahead_candidates
    LookaheadProposer(w, n, g)  # check the options now, not at the first request
    return PerRow(lambda: LookaheadProposer(w, n, g))


def _ngram(target: LoadedModel, draft: LoadedModel | None, size: Size, options: StrategyOptions) -> Proposer:
    most, least = options.ngram_max, min(options.ngram_min or 2, options.ngram_max)
    NgramProposer(most, least)
    return PerRow(lambda: NgramProposer(most, least))


def _lookup_first(options: StrategyOptions, inner: Callable[[], Proposer]) -> DraftNgramProposer:
    """Prompt lookup where the suffix matches at least --ngram-min (default 3) tokens, else `inner`'s proposal;
    the lookup's options are checked before `inner` is built."""
    least = min(options.ngram_min or 3, options.ngram_max)
    NgramProposer(options.ngram_max, least)
    return DraftNgramProposer(inner(), options.ngram_max, min_match=least)


def _draft_ngram(target: LoadedModel, draft: LoadedModel | None, size: Size, options: StrategyOptions) -> Proposer:
    return _lookup_first(options, lambda: _draft(target, draft, size, options))


def _auto(target: LoadedModel, draft: LoadedModel | None, size: Size, options: StrategyOptions) -> Proposer:
    """draft+ngram whose draft-model rounds choose their length (0: a plain step) from live alpha and c and the
    target's verification-cost curve on this hardware, and end early after a token the draft is unsure of."""

    def adaptive() -> Proposer:
        c, cost = _prices(target, draft)
        return AdaptiveGammaProposer(_draft(target, draft, size, options, confidence=AUTO_CONFIDENCE),
                                     verify_cost=cost, pause=True, prior_c=c, measure_c=False)

    return _lookup_first(options, adaptive)


def drafter_dir(options: StrategyOptions, kind: str, strategy: str | None = None) -> tuple[str, dict]:
    """The --drafter directory holding a `kind` drafter (its config.json says which), and that config; errors
    name `strategy` (default: the kind)."""
    import json
    from pathlib import Path

    from verispec.models.files import DRAFTER_CONFIG

    make = f"make one with `verispec train-drafter --kind {kind}`"
    strategy = strategy or kind
    if not options.drafter:
        raise ValueError(f"strategy {strategy!r} needs --drafter DIR ({make})")
    configs, kinds = {}, {}
    for d in options.drafter:
        try:
            configs[d] = json.loads((Path(d).expanduser() / DRAFTER_CONFIG).read_text())
            kinds[d] = configs[d].get("kind")
        except (OSError, ValueError, AttributeError) as e:
            raise ValueError(f"--drafter {d} is not a drafter directory ({DRAFTER_CONFIG}: {e})") from None
    found = [d for d, k in kinds.items() if k == kind]
    if not found:
        raise ValueError(f"strategy {strategy!r}: no --drafter directory holds a {kind} drafter "
                         f"({', '.join(f'{d}: {k}' for d, k in kinds.items())}; {make})")
    return found[0], configs[found[0]]


def check_options(name: str, options: StrategyOptions) -> None:
    """ValueError (what to pass) where strategy `name` cannot run with these options: checked before a model loads
    (the CLI) or a request is queued (the server)."""
    if name in ("eagle", "eagle+ngram", "medusa"):
        directory, config = drafter_dir(options, "medusa" if name == "medusa" else "eagle", name)
        heads = config.get("heads", 0)
        if name == "medusa" and options.medusa_tree != "auto" and len(options.medusa_tree) > heads:
            raise ValueError(f"--medusa-tree gives {len(options.medusa_tree)} depths; the heads in {directory} "
                             f"guess {heads}")


def _eagle(target: LoadedModel, draft: LoadedModel | None, size: Size, options: StrategyOptions) -> Proposer:
    """The EAGLE drafter of --drafter over the target's own features; on the target's kernel where it runs one."""
    from verispec.models.eagle import load_drafter

    model = _native(target, "eagle")
    drafter = load_drafter(drafter_dir(options, "eagle")[0], model, quantize_kind="w4a8-4bit" if _w4a8(model) else None)
    tree = None if options.eagle_tree is None else DynamicTree(*options.eagle_tree)
    return EagleProposer(drafter, size.max_len, model.vocab_size, rows=size.rows, max_gamma=size.max_gamma, tree=tree,
                         confidence=_confidence(options, EAGLE_CONFIDENCE))


def _eagle_ngram(target: LoadedModel, draft: LoadedModel | None, size: Size, options: StrategyOptions) -> Proposer:
    """Prompt lookup when the suffix matches, else the EAGLE drafter: copying costs no drafter step at all, and
    the drafter catches up on the skipped rounds' features the next time it drafts."""
    return _lookup_first(options, lambda: _eagle(target, draft, size, options))


def _medusa(target: LoadedModel, draft: LoadedModel | None, size: Size, options: StrategyOptions) -> Proposer:
    """Medusa heads of --drafter on the target's own features; the shared head on the target's kernel where it
    runs one."""
    from verispec.models.medusa import load_heads

    model = _native(target, "medusa")
    heads = load_heads(drafter_dir(options, "medusa")[0], model, quantize_kind="w4a8-4bit" if _w4a8(model) else None)
    if options.medusa_tree == "auto":
        return MedusaProposer(heads, model.vocab_size, plan=MedusaPlan(verify_cost=verify_cost_of(model)))
    return MedusaProposer(heads, model.vocab_size, widths=tuple(options.medusa_tree))


def _prices(target: LoadedModel, draft: LoadedModel | None) -> tuple[float, VerifyCost]:
    """c and the verification-cost curve that price a round before anything is measured, not timed, so that a
    seeded run draws the same tokens every time (measured c, 0.3-0.46 with the packaged pair, was as noisy as the
    machine). On a CPU c is the bytes each forward streams (the draft's over the target's); on a GPU, where an
    eager forward is bound by its kernel launches, the blocks each runs (an H200, random weights of the packaged
    pair's shapes: 13.9 ms for the draft's 24 blocks, 15.7 ms for the target's 28, c 0.89 where the bytes say
    0.36). The curve is this kernel build's and device's."""
    assert draft is not None
    model = target.model
    if model.device.type != "cpu":
        c = _blocks(draft.model) / max(1, _blocks(model))
    else:
        c = weight_bytes_per_token(_module(draft.model)) / max(1, weight_bytes_per_token(_module(model)))
    return c, verify_cost_of(model)


def _blocks(model: object) -> int:
    """The decoder blocks a forward of this model runs."""
    if isinstance(model, HFCausalLM):
        return int(model.model.config.num_hidden_layers)
    assert isinstance(model, LlamaModel), type(model)
    return model.cfg.num_hidden_layers


def verify_cost_of(model: CausalLM) -> VerifyCost:
    """The verification-cost curve of this target's kernel build and device (verispec.defaults)."""
    isa = kernel_isa() if _w4a8(model) else None
    return interpolate_cost(default_verify_cost(model.device.type, kernel_isa=isa))


def _tree(target: LoadedModel, draft: LoadedModel | None, size: Size, options: StrategyOptions) -> TreeDraftProposer:
    """The draft model drafting a token tree, its shape planned per round from the row's acceptance by rank."""
    _native(target, "tree")  # the target verifies the tree under a tree mask
    assert draft is not None
    if not isinstance(draft.model, LlamaModel):
        raise ValueError(f"strategy 'tree' needs a native Llama-family draft; {draft.name} runs through "
                         f"{type(draft.model).__name__}")
    c, cost = _prices(target, draft)
    return TreeDraftProposer(draft.model, size.max_len, vocab_size=target.model.vocab_size, rows=size.rows,
                             max_gamma=size.max_gamma, c=c, verify_cost=cost, context=_draft_window(target, options))


def _tree_ngram(target: LoadedModel, draft: LoadedModel | None, size: Size, options: StrategyOptions) -> Proposer:
    """Prompt lookup when the suffix matches, else the draft model's planned tree: a copied run costs no draft
    forward, and the tree hedges the draft's unsure tokens where there is nothing to copy."""
    return _lookup_first(options, lambda: _tree(target, draft, size, options))


def _module(model: object) -> torch.nn.Module:
    """The torch module holding a model's weights (transformers' own, behind the adapter)."""
    return model.model if isinstance(model, HFCausalLM) else model  # type: ignore[return-value]


def _w4a8(model: object) -> bool:
    return isinstance(model, LlamaModel) and any(isinstance(m, W4A8Linear) for m in model.modules())


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
        Strategy("cross", True, "a draft model with a tokenizer of its own: its text, re-tokenized, drafts for the "
                 "target (universal assisted generation; exact as a deterministic proposal)", _cross,
                 own_tokenizer=True),
        Strategy("draft+ngram", True, "prompt lookup when the suffix matches, else the draft model", _draft_ngram),
        Strategy("auto", True, "prompt lookup when the suffix matches, else the draft model with its length chosen "
                 "per round (--gamma caps it; 0, a plain step, where drafting does not pay)", _auto),
        Strategy("tree", True, "the draft model drafting a token tree of up to --gamma nodes, its shape planned per "
                 "round from the measured acceptance of the draft's 1st, 2nd, .. choices and this CPU's "
                 "verification costs", _tree),
        Strategy("tree+ngram", True, "prompt lookup when the suffix matches, else the draft model's planned token "
                 "tree (as `tree`)", _tree_ngram),
        Strategy("eagle", False, "an EAGLE feature-level drafter trained for the target (--drafter DIR): one layer "
                 "over the target's own features, no draft model", _eagle),
        Strategy("eagle+ngram", False, "prompt lookup when the suffix matches, else the EAGLE drafter of --drafter "
                 "DIR", _eagle_ngram),
        Strategy("medusa", False, "Medusa heads trained for the target (--drafter DIR): a round's whole chain (up to "
                 "the heads' count) guessed at once from the target's last feature, no draft model", _medusa),
    ]
}


def get(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}") from None


def make_proposer(
    name: str, target: LoadedModel, draft: LoadedModel | None, max_len: int, options: StrategyOptions = StrategyOptions(),
    *, rows: int = 1, max_gamma: int = 16,
) -> Proposer | None:
    """A proposer for `rows` sequences of up to max_len tokens and proposals of up to max_gamma tokens."""
    strategy = get(name)
    if strategy.needs_draft and draft is None:
        raise ValueError(f"strategy {name!r} needs a draft model")
    return strategy.build(target, draft, Size(rows, max_len, max_gamma), options)
