"""Options shared by the commands, defined once: the models (target, draft, precisions, device), the strategy,
the strategy-specific knobs, and loading the models they name.

A strategy-specific flag given with a strategy that does not read it is refused (`--window applies to the
lookahead strategy only`), so that no flag is silently ignored.
"""

from __future__ import annotations

import argparse
import sys

from verispec.cli.common import fail, finite
from verispec.defaults import (AVX2_DRAFT_CONTEXT, DEFAULT_DEVICE, DEFAULT_DRAFT_CONTEXT, DEFAULT_DTYPE,
                               default_draft_dtype, default_draft_vocab, default_dtype, default_gamma, describe,
                               describe_target, draft_window)
from verispec.strategies import STRATEGIES, StrategyOptions, check_options, get

__all__ = [
    "DTYPE_CHOICES", "STRATEGY_FLAGS", "add_config_option", "add_gamma_argument", "add_model_options",
    "add_strategy_argument",
    "add_strategy_options", "announce", "draft_context_of", "draft_dtype_of", "draft_vocab_of", "find_drafters",
    "gamma_of", "load_draft", "load_models", "load_target", "option_dest", "resolve_dtype",
    "strategy_help", "strategy_options",
]

DTYPE_CHOICES = ["bfloat16", "float32", "int8", "int4", "w8a8", "w4a8", "w4a8-4bit", "w4a8-3bit"]

# flag -> (the StrategyOptions field it sets, the strategies that read that field)
STRATEGY_FLAGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "--ngram-max": ("ngram_max", ("ngram", "draft+ngram", "auto", "tree+ngram", "eagle+ngram")),
    "--ngram-min": ("ngram_min", ("ngram", "draft+ngram", "auto", "tree+ngram", "eagle+ngram")),
    "--layers": ("layerskip_layers", ("layerskip",)),
    "--draft-confidence": ("draft_confidence", ("draft", "adaptive", "draft+ngram", "auto", "eagle", "eagle+ngram")),
    "--draft-context": ("draft_context", ("draft", "adaptive", "draft+ngram", "auto", "tree", "tree+ngram")),
    "--window": ("lookahead_window", ("lookahead",)),
    "--lookahead-ngram": ("lookahead_ngram", ("lookahead",)),
    "--lookahead-candidates": ("lookahead_candidates", ("lookahead",)),
    "--drafter": ("drafter", ("eagle", "eagle+ngram", "medusa")),
    "--medusa-tree": ("medusa_tree", ("medusa",)),
    "--eagle-tree": ("eagle_tree", ("eagle", "eagle+ngram")),
}


def option_dest(flag: str) -> str:
    """The argparse name of a strategy flag: --draft-confidence -> draft_confidence."""
    return flag[2:].replace("-", "_")


def strategy_help() -> str:
    return "; ".join(f"{s.name} ({s.help})" for s in STRATEGIES.values())


def _strategy(name: str) -> str:
    try:
        return get(name).name
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_strategy_argument(p: argparse.ArgumentParser, default: str) -> None:
    """`--strategy NAME`, one of verispec.strategies.STRATEGIES (all listed in --help)."""
    p.add_argument("--strategy", type=_strategy, default=default, metavar="{" + ",".join(STRATEGIES) + "}",
                   help=f"drafting method: {strategy_help()} (default: %(default)s)")


def add_gamma_argument(p: argparse.ArgumentParser) -> None:
    """`--gamma N`, tokens drafted per round; None until `gamma_of` fills in the hardware default."""
    p.add_argument("--gamma", "--num-speculative-tokens", dest="gamma", type=int, default=None,
                   help="tokens drafted per round, the most a round drafts for auto and adaptive (default: 6 beside "
                        "a w4a8 target on the kernel's AVX-512 build; 8 for a bfloat16 or float32 target on a CPU, "
                        "whose verification of 9 tokens costs ~1.3x a step; else 4). --num-speculative-tokens is "
                        "vLLM's name for it")


def resolve_dtype(args: argparse.Namespace) -> bool:
    """Fill in --dtype when it was not given (the fastest exact precision for this machine, verispec.defaults);
    True when it was filled in."""
    if args.dtype is not None:
        return False
    from verispec.models.kernels import KernelError, available_isas, w4a8

    args.dtype = default_dtype(args.device, available_isas() if args.device == "cpu" else [])
    if args.dtype.startswith("w4a8"):
        try:
            w4a8()  # built once per machine (about 30 s), then found in the cache
        except KernelError as e:  # e.g. no C++ compiler: the default must still run
            print(f"verispec: the w4a8 kernel is not available here ({e}); running the target in {DEFAULT_DTYPE}",
                  file=sys.stderr)
            args.dtype = DEFAULT_DTYPE
    return True


def _kernel_isa_of(args: argparse.Namespace) -> str | None:
    """The w4a8 kernel build a w4a8 target runs on here (None: another precision, or no build runs)."""
    from verispec.models.kernels import KernelError, kernel_isa

    try:
        return kernel_isa() if (args.dtype or "").startswith("w4a8") else None
    except KernelError:
        return None


def announce(args: argparse.Namespace, strategy: str, needs_draft: bool, defaulted: bool) -> None:
    """One line on stderr saying what runs where the command line did not spell it out: the configuration the
    machine's defaults chose (`defaulted`), or the one a --config file (verispec tune) set."""
    if defaulted:
        reads_window = needs_draft and strategy in STRATEGY_FLAGS["--draft-context"][1]
        print(describe(args.dtype, draft_dtype_of(args) if needs_draft else None, strategy, gamma_of(args),
                       _kernel_isa_of(args), draft_vocab_of(args) if needs_draft else None,
                       draft_context_of(args) if reads_window else None), file=sys.stderr)
    elif getattr(args, "config", None):
        drafters = getattr(args, "drafter", None) if strategy in STRATEGY_FLAGS["--drafter"][1] else None
        parts = [describe_target(args.dtype, _kernel_isa_of(args)),
                 f"{draft_dtype_of(args)} draft" if needs_draft else "", strategy,
                 f"gamma {gamma_of(args)}" if strategy != "ar" else "",
                 f"drafter {', '.join(drafters)}" if drafters else ""]
        print(f"verispec: {', '.join(p for p in parts if p)}, from {args.config} (flags beside it win)",
              file=sys.stderr)


def draft_context_of(args: argparse.Namespace) -> int | None:
    """--draft-context, else the default for this target's kernel build (verispec.defaults); None: the whole prompt."""
    return draft_window(getattr(args, "draft_context", None), _kernel_isa_of(args))


def gamma_of(args: argparse.Namespace) -> int:
    """--gamma, else the default for this target precision, device and kernel build (verispec.defaults)."""
    return args.gamma if args.gamma is not None else default_gamma(args.dtype, args.device, _kernel_isa_of(args))


def add_model_options(p: argparse.ArgumentParser, default_target: str, default_draft: str | None = None,
                      dtypes: list[str] = DTYPE_CHOICES, device: bool = True) -> None:
    """--target and --dtype; with a default draft also --draft, --draft-dtype and --draft-vocab; --device."""
    p.add_argument("--target", default=default_target, help="HF directory, .gguf file or packaged name (default: %(default)s)")
    if default_draft is not None:
        p.add_argument("--draft", "--speculative-model", dest="draft", default=default_draft,
                       help="draft model, same forms (default: %(default)s); --speculative-model is vLLM's name for it")
    if "w4a8" in dtypes:
        p.add_argument("--dtype", choices=dtypes, default=None,
                       help="the target's precision (int8/int4: weight-only quantized; w8a8: int8 weights and "
                            "per-token int8 activations, AVX-512 VNNI only; w4a8: 4-bit weights (6 where the GGUF had "
                            "more) and int8 activations on verispec's CPU kernel, AVX-512 VNNI or AVX2 build); output "
                            "is lossless relative to the target as run (default: w4a8 on a CPU that runs the kernel, "
                            "else bfloat16)")
    else:
        p.add_argument("--dtype", choices=dtypes, default=DEFAULT_DTYPE,
                       help="the target's precision (default: %(default)s)")
    if default_draft is not None:
        p.add_argument("--draft-dtype", choices=DTYPE_CHOICES, default=None,
                       help="the draft's precision; it never changes the output distribution (default on the CPU: "
                            "int4 beside a bfloat16, int8, int4 or w8a8 target, w4a8-4bit beside a w4a8 one, else "
                            "the target's)")
        p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                       help="the draft proposes only ids < N (its LM head shrinks; ids are roughly in frequency "
                            "order); lossless, faster drafting; 0: the whole vocabulary (default: 65536 for a "
                            "w4a8 draft on a CPU, else the whole vocabulary)")
    if device:
        p.add_argument("--device", default=DEFAULT_DEVICE, help="cpu, cuda or cuda:N (default: %(default)s)")


def add_config_option(p: argparse.ArgumentParser) -> None:
    """`--config FILE`: the models, strategy and gamma `verispec tune` chose (flags given beside it win)."""
    p.add_argument("--config", default=None, metavar="FILE",
                   help="read the target, draft, precisions, strategy and gamma from a `verispec tune` config "
                        "(flags given on the command line win)")


def add_strategy_options(p: argparse.ArgumentParser) -> None:
    """The knobs of particular strategies; each is refused with a strategy that does not read it."""
    d = StrategyOptions()
    p.add_argument("--ngram-max", type=int, default=None,
                   help=f"ngram, draft+ngram, auto: longest suffix n-gram matched (default: {d.ngram_max})")
    p.add_argument("--ngram-min", type=int, default=None,
                   help="ngram, draft+ngram, auto: shortest suffix n-gram matched; draft+ngram and auto use the n-gram proposal "
                        "from this length on, else the draft model (default: 2 for ngram, 3 for draft+ngram and auto)")
    p.add_argument("--layers", type=int, default=None,
                   help="layerskip: draft with the target's first LAYERS blocks (default: the saved "
                        "`verispec calibrate-layerskip` choice for the target, else half its layers)")
    p.add_argument("--draft-confidence", type=finite, default=None,
                   help="draft, adaptive, draft+ngram, auto, eagle, eagle+ngram: stop drafting after a token the draft "
                        "(or the EAGLE drafter's chain) gave less than this probability (default: 0, 0.3 for adaptive, "
                        "0.5 for auto, 0.7 for eagle and eagle+ngram)")
    p.add_argument("--draft-context", type=int, default=None, metavar="N",
                   help="draft, adaptive, draft+ngram, auto: the draft model reads only the first 4 and the last N "
                        "tokens of a longer prompt, which bounds its own prefill; lossless; 0: the whole prompt "
                        f"(default: {DEFAULT_DRAFT_CONTEXT or 0}, {AVX2_DRAFT_CONTEXT} with the kernel's AVX2 and "
                        "AVX-VNNI builds)")
    p.add_argument("--window", type=int, default=None,
                   help=f"lookahead: Jacobi window width W (default: {d.lookahead_window})")
    p.add_argument("--lookahead-ngram", type=int, default=None,
                   help=f"lookahead: n-gram size N, window levels + 1 (default: {d.lookahead_ngram})")
    p.add_argument("--lookahead-candidates", type=int, default=None,
                   help=f"lookahead: pool n-grams kept per first token, G (default: {d.lookahead_candidates})")
    p.add_argument("--drafter", default=None, metavar="DIR", action="append",
                   help="eagle, medusa: a drafter directory `verispec train-drafter` wrote for this target (give one "
                        "of each kind to run both; each strategy takes the one of its kind)")
    p.add_argument("--medusa-tree", default=None, metavar="W1,W2,..|auto", type=_medusa_tree,
                   help="medusa: a token tree, each node at depth d getting W_d+1 children from head d (its top "
                        "choices), up to --gamma nodes; auto: widths planned every round from the measured "
                        "acceptance by head and rank and this machine's verification cost (default: a chain)")
    p.add_argument("--eagle-tree", default=None, metavar="K,D", type=_eagle_tree,
                   help="eagle: EAGLE-2's dynamic tree for greedy requests: D depths, the K likeliest nodes of each "
                        "expanded with their K likeliest tokens, the --gamma likeliest nodes verified (default: a "
                        "chain; sampled requests always draft a chain)")


def _widths(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"widths must be at least 1, got {text!r}")
    return widths


def _medusa_tree(text: str) -> tuple[int, ...] | str:
    return "auto" if text == "auto" else _widths(text)


def _eagle_tree(text: str) -> tuple[int, int]:
    widths = _widths(text)
    if len(widths) != 2:
        raise argparse.ArgumentTypeError(f"expected K,D (top-k and depth), got {text!r}")
    return widths[0], widths[1]


def _names(strategies: tuple[str, ...] | list[str]) -> str:
    names = list(strategies)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def find_drafters(args: argparse.Namespace, strategies: list[str] | None) -> None:
    """Without --drafter, where a strategy of the run reads one (None: the run's strategies are not chosen yet), the
    drafters `train-drafter` left at their default place for --target, said in one line."""
    from verispec.models.files import trained_drafters

    readers = STRATEGY_FLAGS["--drafter"][1]
    if getattr(args, "drafter", None) is not None or (strategies is not None and not set(strategies) & set(readers)):
        return
    found = trained_drafters(args.target)
    if found:
        args.drafter = found
        print(f"verispec: the drafter train-drafter made for {args.target}: {', '.join(found)}", file=sys.stderr)


def strategy_options(args: argparse.Namespace, strategies: list[str]) -> StrategyOptions:
    """The StrategyOptions the flags ask for, for a run of `strategies`; fail on a flag none of them reads or on
    a value out of range. Flags not given keep StrategyOptions' defaults; a drafter not given is looked for where
    `train-drafter` puts one (find_drafters)."""
    find_drafters(args, strategies)
    given = {flag: getattr(args, option_dest(flag)) for flag in STRATEGY_FLAGS}
    given = {flag: v for flag, v in given.items() if v is not None}
    for flag in given:
        readers = STRATEGY_FLAGS[flag][1]
        if not any(s in readers for s in strategies):
            kind = "strategy" if len(readers) == 1 else "strategies"
            chosen = ("the strategy is " if len(strategies) == 1 else "the strategies are ") + ", ".join(strategies)
            fail(f"{flag} applies to the {_names(readers)} {kind} only ({chosen})")
    options = StrategyOptions(**{STRATEGY_FLAGS[flag][0]: tuple(v) if isinstance(v, list) else v
                                 for flag, v in given.items()})
    if options.ngram_max < 1 or (options.ngram_min is not None and not 1 <= options.ngram_min <= options.ngram_max):
        fail(f"need 1 <= --ngram-min <= --ngram-max, got {options.ngram_min} and {options.ngram_max}")
    if options.layerskip_layers is not None and options.layerskip_layers < 1:
        fail(f"--layers must be at least 1, got {options.layerskip_layers}")
    if options.lookahead_window < 1 or options.lookahead_ngram < 2 or options.lookahead_candidates < 1:
        fail("need --window >= 1, --lookahead-ngram >= 2 and --lookahead-candidates >= 1")
    for name in strategies:
        try:
            check_options(name, options)
        except ValueError as e:
            fail(str(e))
    if options.draft_context is not None and options.draft_context < 0:
        fail(f"--draft-context must be >= 0 (0: the whole prompt), got {options.draft_context}")
    if options.draft_confidence is not None and not 0 <= options.draft_confidence <= 1:
        fail(f"--draft-confidence must be in [0, 1], got {options.draft_confidence}")
    return options


def draft_dtype_of(args: argparse.Namespace) -> str:
    """--draft-dtype, else the default beside this target precision and device (verispec.defaults)."""
    return args.draft_dtype or default_draft_dtype(args.dtype, args.device)


def load_models(args: argparse.Namespace, strategies: list[str], progress: bool):
    """Load the target, and the draft if any strategy needs one; check they form a pair."""
    try:
        need_draft = any(get(s).needs_draft for s in strategies)
    except ValueError as e:
        fail(str(e))
    target = load_target(args, progress)
    return target, load_draft(args, target, strategies, progress) if need_draft else None


def load_target(args: argparse.Namespace, progress: bool):
    """The target of --target, --dtype and --device."""
    from verispec.models.load import load

    if not (args.device == "cpu" or args.device.startswith("cuda")):
        fail(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    if args.draft_vocab is not None and args.draft_vocab < 0:  # refused before the target's long load
        fail(f"--draft-vocab must be >= 0 (0: the whole vocabulary), got {args.draft_vocab}")
    return load(args.target, dtype=args.dtype, device=args.device, progress=progress)


def load_draft(args: argparse.Namespace, target, strategies: list[str], progress: bool):
    """The draft of --draft, --draft-dtype and --draft-vocab beside `target`, checked to share its vocabulary
    unless every drafting strategy in `strategies` takes a tokenizer of its own."""
    from verispec.models.errors import ModelError
    from verispec.models.llama import LlamaModel
    from verispec.models.load import check_pair, load

    draft = load(args.draft, dtype=draft_dtype_of(args), device=args.device, progress=progress,
                 tokenizer_like=target.tokenizer)
    if not all(get(s).own_tokenizer for s in strategies if get(s).needs_draft):
        try:
            check_pair(target, draft)
        except ModelError as e:
            fail(f"{e} (--strategy cross drafts with a model of another tokenizer)")
    vocab = draft_vocab_of(args)
    if vocab and (args.draft_vocab or isinstance(draft.model, LlamaModel)):  # a default skips an adapter's draft
        from verispec.models.quant import truncate_head

        try:
            truncate_head(draft.model, vocab)
        except ValueError as e:
            fail(str(e))
    return draft


def draft_vocab_of(args: argparse.Namespace) -> int | None:
    """--draft-vocab (0: None, the whole vocabulary), else the default beside this draft precision and device."""
    if args.draft_vocab is not None:
        return args.draft_vocab or None
    return default_draft_vocab(draft_dtype_of(args), args.device)
