"""`verispec train-drafter --kind eagle|medusa`: train a feature-level drafter for the target on this machine
(verispec.train_drafter)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from verispec.cli.common import duration, fail
from verispec.cli.options import add_model_options, resolve_dtype


def add_parser(sub, default_target: str) -> None:
    p = sub.add_parser("train-drafter", help="train an EAGLE drafter or Medusa heads for the target on this machine "
                       "(self-distillation)")
    p.add_argument("--kind", choices=["eagle", "medusa"], default="eagle",
                   help="eagle: one decoder layer over the target's own features; medusa: --heads small heads on the "
                        "target's last feature, all of a round's guesses at once (default: %(default)s)")
    add_model_options(p, default_target)
    p.add_argument("--out", default=None, help="drafter directory (default: drafters/<target>-<kind> in the cache "
                   "directory); an unfinished one resumes")
    p.add_argument("--features", default=None, metavar="DIR",
                   help="where the target's features are cached (default: OUT/features); point a second drafter of "
                        "the same target, corpus and --seq-len at the first one's to skip computing them again")
    p.add_argument("--heads", type=int, default=4, help="medusa: heads, the longest chain a round drafts "
                   "(default: %(default)s)")
    p.add_argument("--budget", type=duration, default=duration("30m"),
                   help="training time, e.g. 30m or 1h (the target's features are cached first; default: 30m)")
    p.add_argument("--tokens", type=int, default=120_000,
                   help="corpus tokens whose target features are cached, once (default: %(default)s)")
    p.add_argument("--corpus", default="stdlib",
                   help="comma list of: stdlib (the Python standard library's sources), suite (the packaged bench "
                        "prompts; then bench figures are no longer held out); or of the target's own answers, "
                        "generated here 8 at a time, their features recorded as they are generated: answers "
                        "(requests about the standard library's functions: write, complete, explain, rewrite), chat "
                        "(summarize, translate, answer from a passage, explain, word problems, follow-up turns, over "
                        "the standard library's docs); answers,chat alternates them, and resumes an answers run "
                        "(default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=256,
                   help="answers, chat: the longest answer generated for one request (default: %(default)s)")
    p.add_argument("--intermediate", type=int, default=2048,
                   help="the drafter layer's MLP width; narrower trains more steps in the budget (default: %(default)s)")
    p.add_argument("--head-vocab", type=int, default=32000,
                   help="rows of the target's LM head the drafter proposes from (default: %(default)s)")
    p.add_argument("--head-order", choices=["first", "frequent"], default=None,
                   help="eagle: which rows: the first ids (below --head-vocab), or the ids most frequent in the "
                        "training tokens, which cover as much code with half the rows (default: first; a resumed "
                        "drafter keeps its own)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default: %(default)s)")
    p.add_argument("--lr-schedule", choices=["cosine", "constant"], default="cosine",
                   help="cosine: the learning rate decays from --lr to a twentieth of it over what is left of "
                        "--budget (a resumed run decays over its own remainder); constant: --lr throughout "
                        "(default: %(default)s)")
    p.add_argument("--batch", type=int, default=4, help="sequences a step (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens a sequence (default: %(default)s)")
    p.add_argument("--init", choices=["last-block", "random"], default="random",
                   help="eagle: where the drafter's layer starts: the target's last block (its attention whole, the "
                        "--intermediate MLP channels that reach its output most), or small random weights "
                        "(default: %(default)s; a resumed drafter keeps its own weights)")
    p.add_argument("--depth", type=int, default=1,
                   help="eagle: draft steps trained from each position, step n reading the drafter's own step n-1 "
                        "(EAGLE-3's training-time test; 1: teacher forcing; each step costs about one more "
                        "forward; default: %(default)s)")
    p.add_argument("--feature-layers", default=None, metavar="K,K",
                   help="eagle: EAGLE-3's multi-layer features: the target's outputs after its first K blocks for each "
                        "K (e.g. 3,14 of 28), fused with its last block's by one linear map; features are cached per "
                        "set of layers (default: the last block's alone; a resumed drafter keeps its own)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from verispec.models.errors import ModelError
    from verispec.models.eagle import EagleConfig, EagleDrafter, load_drafter
    from verispec.models.llama import LlamaModel
    from verispec.models.medusa import MedusaConfig, MedusaHeads, load_heads
    from verispec.models.load import default_threads, load
    from verispec.models.files import DRAFTER_CONFIG, default_drafter_dir, drafter_config
    from verispec.train_drafter import (
        TrainSettings, answer_features, cache_features, chat_requests, chunks, code_requests, log_stderr,
        frequent_ids, stdlib_texts, suite_texts, target_block, target_head, train,
    )

    corpora = {"stdlib": stdlib_texts, "suite": suite_texts}
    generated = {"answers": lambda: ([{"role": "user", "content": r}] for r in code_requests()),
                 "chat": chat_requests}
    names = [c for c in args.corpus.split(",") if c]
    answers = bool(names) and all(c in generated for c in names)
    if not answers and (not names or any(c not in corpora for c in names)):
        fail(f"--corpus takes a comma list of {', '.join(corpora)}, or of {', '.join(generated)} (the target's "
             f"own answers; the two kinds do not mix); got {args.corpus!r}")
    for flag, value in (("--tokens", args.tokens), ("--batch", args.batch), ("--seq-len", args.seq_len),
                        ("--head-vocab", args.head_vocab), ("--intermediate", args.intermediate),
                        ("--heads", args.heads), ("--max-new-tokens", args.max_new_tokens), ("--depth", args.depth)):
        if value < 1:
            fail(f"{flag} must be at least 1, got {value}")
    if not 0 < args.lr < 1:
        fail(f"--lr must be in (0, 1), got {args.lr}")
    if args.depth > 1 and args.kind != "eagle":
        fail("--depth trains an EAGLE drafter's later draft steps; Medusa heads guess all theirs from one feature")
    try:
        layers = tuple(int(k) for k in args.feature_layers.split(",") if k) if args.feature_layers else ()
    except ValueError:
        fail(f"--feature-layers takes a comma list of block counts, e.g. 3,14; got {args.feature_layers!r}")
    if args.head_order not in (None, "first") and args.kind != "eagle":
        fail("--head-order chooses an EAGLE drafter's head rows; Medusa heads propose the first --head-vocab ids")
    if args.init != "random" and args.kind != "eagle":
        fail("--init chooses where an EAGLE drafter's layer starts; Medusa heads have no decoder layer")
    if layers and args.kind != "eagle":
        fail("--feature-layers chooses an EAGLE drafter's input features; Medusa heads read the last block's")
    if args.depth >= args.seq_len:
        fail(f"--depth {args.depth} needs sequences longer than that (--seq-len {args.seq_len})")
    from verispec.models.kernels import cpu_flags

    # bf16 matmuls where they are native: a GPU, or a CPU with AVX-512 BF16
    settings = TrainSettings(seq_len=args.seq_len, tokens=args.tokens, batch=args.batch, lr=args.lr,
                             budget_s=args.budget, bf16=args.device != "cpu" or "avx512_bf16" in cpu_flags(),
                             depth=args.depth, schedule=args.lr_schedule)
    resolve_dtype(args)
    default_threads()
    progress = sys.stderr.isatty()
    target = load(args.target, dtype=args.dtype, device=args.device, progress=progress)
    if not isinstance(target.model, LlamaModel):
        fail(f"a feature-level drafter needs a native Llama-family target; {target.name} runs through "
             f"{type(target.model).__name__}")
    model = target.model
    model.requires_grad_(False)
    out = Path(args.out).expanduser() if args.out else default_drafter_dir(target.name, args.kind)
    features = Path(args.features).expanduser() if args.features else out / "features"
    resume = (out / DRAFTER_CONFIG).is_file() and (out / "train-state.pt").is_file()
    if not resume and args.init == "last-block" and args.intermediate > model.cfg.intermediate_size:
        fail(f"--init last-block cuts the target's last block down to --intermediate channels; the drafter's MLP "
             f"({args.intermediate} channels) is wider than the target block's ({model.cfg.intermediate_size})")
    saved: dict = {}
    if (out / DRAFTER_CONFIG).is_file():  # never train over a drafter of another kind (known before the features)
        try:
            saved = drafter_config(out, args.kind, "Medusa heads" if args.kind == "medusa" else "an EAGLE one")
        except ModelError as e:
            fail(str(e))
    config: EagleConfig | None = None
    if args.kind == "eagle":  # its feature layers decide the cached features: these layers' outputs, then the last
        try:
            if resume:  # a resumed drafter reads the layers it was trained on
                config = EagleConfig(**saved)
                config.check_layers(model.cfg.num_hidden_layers)
            else:
                config = EagleConfig.for_target(model, target.name, intermediate_size=args.intermediate,
                                                head_vocab=args.head_vocab, feature_layers=layers,
                                                head_order=args.head_order or "first")
        except (TypeError, ValueError) as e:
            fail(f"{out}: {e}" if resume else f"--feature-layers: {e}")
        if resume and args.feature_layers is not None and layers != config.feature_layers:
            had = ",".join(map(str, config.feature_layers)) or "none (the last block alone)"
            fail(f"{out} reads feature layers {had}; --feature-layers {args.feature_layers} would need a new --out")
        if resume and args.head_order is not None and args.head_order != config.head_order:
            fail(f"{out} has a {config.head_order!r} head; --head-order {args.head_order} would need a new --out")
        model.feature_layers = config.feature_layers
    t0 = time.perf_counter()

    def texts():
        for name in names:
            yield from corpora[name]()

    try:
        if answers:
            streams = {n: (target.tokenizer.chat(m) for m in generated[n]()) for n in dict.fromkeys(names)}
            shards = answer_features(model, streams, features, settings, eos_ids=tuple(target.tokenizer.eos_ids),
                                     max_new_tokens=args.max_new_tokens, progress=progress)
        else:
            pieces = chunks(texts(), lambda s: target.tokenizer.encode(s, special=False), settings.seq_len,
                            settings.tokens)
            shards = cache_features(model, pieces, features, settings, progress)
    except ValueError as e:
        fail(str(e))
    features_s = time.perf_counter() - t0
    log_stderr(f"target features: {len(shards)} shards in {features} ({features_s / 60:.1f} min)")
    drafter: EagleDrafter | MedusaHeads
    try:
        if args.kind == "medusa":
            drafter = load_heads(out, model) if resume else MedusaHeads.fresh(
                MedusaConfig.for_target(model, target.name, heads=args.heads, head_vocab=args.head_vocab), model,
                target_head(model, target.path, min(args.head_vocab, model.vocab_size)))
        else:
            assert config is not None
            if resume:
                drafter = load_drafter(out, model, dtype=torch.float32)
            else:  # a "frequent" head: the ids the training shards use most (the held-out last one not counted)
                ids = (frequent_ids(shards[:-1] or shards, config.head_vocab, model.vocab_size)
                       if config.head_order == "frequent" else None)
                block = target_block(model, target.path) if args.init == "last-block" else None
                drafter = EagleDrafter.fresh(config, model, target_head(model, target.path, config.head_vocab, ids),
                                             head_ids=ids, block=block)
        result = train(drafter, shards, out, settings, log_stderr, progress)
    except (ModelError, ValueError) as e:
        fail(str(e))
    print(f"trained {result['steps']} steps in {result['seconds'] / 60:.1f} min (+{features_s / 60:.1f} min of "
          f"target features): the drafter's first guess is the target's argmax {result['validation_agreement']:.1%} "
          f"of the time on held-out text (before training: {result['initial_agreement']:.1%})"
          + ("" if "validation_agreement_step2" not in result else
             f", its next draft steps' {result['validation_agreement_step2']:.1%} and "
             f"{result['validation_agreement_step3']:.1%} (each after the earlier ones were right)")
          + f"; saved to {out}\n"
          f"use it: verispec generate --strategy {args.kind} --drafter {out} \"...\"")
    return 0
