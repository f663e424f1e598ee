"""`verispec bench`: parse the lists, load models and peers, run interleaved, write the report (verispec/bench/)."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from verispec.bench.runner import (
    LLAMA_CPP_HINT, OPENVINO_HINT, Config, HFBackend, LlamaCppBackend, OpenVinoBackend, Run, VerispecBackend, run_bench,
)
from verispec.cli.common import comma_list, fail, finite
from verispec.cli.options import (
    add_config_option, add_model_options, add_strategy_options, draft_dtype_of, draft_vocab_of, load_models,
    resolve_dtype, strategy_options,
)

PEERS = ("hf", "llama.cpp", "openvino")


def add_parser(sub, default_target: str, default_draft: str) -> None:
    from verispec.strategies import STRATEGIES

    b = sub.add_parser("bench", help="measure strategies side by side (and peers) on a prompt suite; writes a report")
    add_model_options(b, default_target, default_draft)
    b.add_argument("--strategies", default="ar,draft", help=f"comma list of: {', '.join(STRATEGIES)} (ar is always run: it is the baseline; default: %(default)s)")
    b.add_argument("--gamma", default="2,4,6",
                   help="comma list of gammas for the drafting strategies; STRATEGY:N gives one strategy its own (e.g. "
                        "4,eagle:2: eagle at 2, the others at 4); a strategy not named takes the bare numbers "
                        "(default: %(default)s)")
    add_strategy_options(b)
    add_config_option(b)
    b.add_argument("--temperature", default="0", help="comma list of temperatures, 0 = greedy (default: %(default)s)")
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--prompts", default="suite", help="'suite' (the packaged prompt suite) or a JSON Lines file with 'prompt' (or 'messages') and optional 'category'")
    b.add_argument("--categories", default=None, help="comma list of categories to run (default: all)")
    b.add_argument("--limit", type=int, default=None, help="at most this many prompts per category")
    b.add_argument("--repeats", type=int, default=1, help="times each configuration runs on each prompt")
    b.add_argument("--peers", default="", help="comma list of peers to run beside ours: hf (transformers plain and assisted generation), llama.cpp (plain, prompt lookup, and draft-model speculation beside a drafting strategy; needs llama-cpp-python), openvino (OpenVINO GenAI plain, speculative with the draft, and prompt lookup; needs the [openvino] extra and the pair exported by benchmarks/openvino_export.sh)")
    b.add_argument("--peer-gamma", default=None, metavar="GAMMAS",
                   help="comma list of gammas for the peers' speculation; PEER:N gives one peer its own (e.g. "
                        "2,openvino:4: llama.cpp at 2, OpenVINO at 4); a peer not named takes the bare numbers, or "
                        "--gamma's if there are none (default: --gamma's)")
    b.add_argument("--peer-strategies", default=None, metavar="NAMES",
                   help=f"comma list of the peers' configurations to run, of: {', '.join(PEER_STRATEGIES)} "
                        "(default: all that apply: plain, prompt lookup, and speculation with the draft beside a "
                        "drafting strategy)")
    b.add_argument("--openvino-dir", default=None, metavar="DIR",
                   help="where the openvino peer finds the exported pair, as NAME-int4 directories named after --target and --draft (default: the verispec cache's openvino/)")
    b.add_argument("--seed", type=int, default=0, help="base seed of the sampled runs")
    b.add_argument("--costs", action="store_true", help="also measure the target's verification-cost curve (1-16 tokens) and the memory-bandwidth limit")
    b.add_argument("--synthetic", type=finite, default=None, metavar="ERROR_RATE",
                   help="synthetic acceptance, for speed runs with random weights (--target random:DIR): drafts "
                        "are the target's own greedy tokens, each wrong with this probability; greedy only")
    b.add_argument("--no-warmup", action="store_true", help="skip the warm-up pass (first calls are slower)")
    b.add_argument("--rerender", default=None, metavar="DIR",
                   help="rebuild DIR's report.md, report.json and plots from its recorded runs (after a Ctrl-C or an upgrade); runs nothing")
    b.add_argument("--out", default="bench-report", help="directory for report.json, report.md, runs.jsonl and plots (default: %(default)s)")
    b.set_defaults(run=run)


# the peers' configurations: plain (all), assisted generation (hf), prompt lookup (all), draft-model speculation
# (llama.cpp), speculative decoding with the draft (openvino)
PEER_STRATEGIES = ("ar", "assisted", "prompt_lookup", "draft", "speculative")


def build_configs(strategies: list[str], gammas: list[int] | dict[str, list[int]], temperatures: list[float],
                  peers: list[str], peer_gammas: list[int] | dict[str, list[int]] | None = None,
                  peer_strategies: list[str] | None = None) -> list[Config]:
    """Ours first (ar, then each drafting strategy at each of its gammas: one list for all, or a list per strategy),
    then the peers', for every temperature.
    transformers runs assisted generation when a strategy of ours uses the draft model, and its prompt lookup
    when one uses n-grams; llama.cpp runs its prompt lookup, and its draft-model speculation when a strategy of ours
    uses the draft; OpenVINO GenAI runs its speculative decoding with the draft when a strategy of ours uses one,
    and its prompt lookup. The peers speculate at `peer_gammas` (one list for all, or a list per peer; default:
    `gammas`, or every gamma of ours where those are per strategy) and run only `peer_strategies` of theirs where
    given (PEER_STRATEGIES' names): a whole-suite run can then leave out the slow configurations."""
    from verispec.strategies import get

    drafting, ngrams = any(get(s).needs_draft for s in strategies), any("ngram" in s for s in strategies)
    ours = gammas if isinstance(gammas, dict) else dict.fromkeys(strategies, gammas)
    gammas = sorted({g for gs in ours.values() for g in gs}) if isinstance(gammas, dict) else gammas
    pg = peer_gammas if isinstance(peer_gammas, dict) else dict.fromkeys(PEERS, gammas if peer_gammas is None
                                                                          else peer_gammas)
    wanted = set(PEER_STRATEGIES if peer_strategies is None else peer_strategies)
    offered = {  # peer: its configurations beside these strategies of ours, before the filters
        "hf": ["ar"] + (["assisted"] if drafting else []) + (["prompt_lookup"] if ngrams else []),
        "llama.cpp": ["ar", "prompt_lookup"] + (["draft"] if drafting else []),
        "openvino": ["ar"] + (["speculative"] if drafting else []) + ["prompt_lookup"],
    }
    configs: list[Config] = []
    for t in temperatures:
        configs.append(Config("verispec", "ar", 0, t))
        configs += [Config("verispec", s, g, t) for s in strategies if s != "ar" for g in ours[s]]
        for peer in PEERS:
            if peer in peers:
                configs += [Config(peer, s, g, t) for s in offered[peer] if s in wanted
                            for g in ([0] if s == "ar" else pg.get(peer, gammas))]
    return configs


def _gamma_items(text: str, option: str, names: list[str], kind: str, choices: str, example: str
                 ) -> tuple[list[int], dict[str, list[int]]]:
    """A gamma list's bare 'N' items and its 'NAME:N' ones by name (a NAME among `names`). Fails in one line."""
    bare: list[int] = []
    named: dict[str, list[int]] = {}
    for item in comma_list(text, str, option):
        name, colon, number = item.strip().rpartition(":")
        if colon and name not in names:
            fail(f"{option} names {name!r}, which is not among {choices} ({', '.join(names) or 'none'})")
        try:
            g = int(number)
        except ValueError:
            fail(f"{option}: {item!r} is not a gamma (N, or {kind}:N such as {example})")
        (named.setdefault(name, []) if colon else bare).append(g)
    return bare, named


def parse_gammas(text: str, strategies: list[str]) -> tuple[dict[str, list[int]], list[int]]:
    """--gamma's value as each drafting strategy's gammas: 'N' items apply to every strategy, 'STRATEGY:N' to that one
    (the strategy named whole: draft+ngram:4); a strategy not named takes the bare items. Also returns what the peers
    speculate at by default: the bare items, or every gamma named if there are none. Fails in one line."""
    bare, named = _gamma_items(text, "--gamma", strategies, "STRATEGY", "--strategies", "eagle:2")
    drafting = [s for s in strategies if s != "ar"]
    if missing := [s for s in drafting if not named.get(s) and not bare]:
        fail(f"--gamma gives no gamma for {', '.join(missing)}: add a bare N or STRATEGY:N")
    return {s: named.get(s) or bare for s in drafting}, bare or sorted({g for gs in named.values() for g in gs})


def parse_peer_gammas(text: str, peers: list[str], gammas: list[int]) -> dict[str, list[int]]:
    """--peer-gamma's value as each chosen peer's gammas: 'N' items apply to every peer, 'PEER:N' to that one; a
    peer not named takes the bare items, or `gammas` (--gamma's) if there are none. Fails in one line."""
    bare, named = _gamma_items(text, "--peer-gamma", peers, "PEER", "--peers", "openvino:4")
    return {p: named.get(p) or bare or gammas for p in peers}


def openvino_dir(spec: str, root: str | None) -> Path:
    """Where the openvino peer expects model `spec` as optimum-intel exports it: ROOT/NAME-int4, NAME the packaged
    name (or the file or directory's own name), ROOT --openvino-dir or the verispec cache's openvino/."""
    from verispec.models.files import cache_dir

    name = Path(spec).name.removesuffix(".gguf")
    return (Path(root).expanduser() if root else cache_dir() / "openvino") / f"{name}-int4"


def _gguf_path(spec: str) -> Path | None:
    """The GGUF file behind a model spec, for llama.cpp (None for a Hugging Face directory)."""
    from verispec.models.packaged import PACKAGED, assemble

    if spec in PACKAGED:
        return assemble(PACKAGED[spec], progress=False)
    path = Path(spec).expanduser()
    return path if path.is_file() and path.suffix == ".gguf" else None


def _machine() -> dict[str, Any]:
    from verispec.models.kernels import cpu_model

    out = {"cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)), "torch": torch.__version__,
           "torch_threads": torch.get_num_threads(), "python": platform.python_version()}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def measure_costs(model, progress: bool, context: int = 512, reps: int = 5) -> dict[str, Any]:
    from verispec.bench.costs import bandwidth_limit, decoding_step, verification_curve

    if progress:
        print("measuring the verification-cost curve and the bandwidth limit...", file=sys.stderr)
    curve = verification_curve(model, context=context, reps=reps)
    return {"context": context, "reps": reps, "verification_curve": curve,
            "bandwidth": bandwidth_limit(model, step=decoding_step(model, context=context), reps=reps)}


def _references(target, prompts: list[list[int]], max_new_tokens: int, progress: bool) -> dict[tuple[int, ...], list[int]]:
    """The target's greedy continuation of each prompt, before any timing: what synthetic drafts copy."""
    from verispec.engine import GenerationParams, generate

    if progress:
        print(f"synthetic acceptance: computing the target's greedy output for {len(prompts)} prompts...",
              file=sys.stderr)
    params = GenerationParams(max_new_tokens=max_new_tokens, eos_ids=tuple(target.tokenizer.eos_ids))
    return {tuple(p): generate(target.model, p, params).token_ids for p in prompts}


def rerender(out: Path) -> dict[str, Path]:
    """Rebuild a report from the runs recorded in `out` (runs.jsonl, else report.json; either may be gzipped), with
    today's report code.

    A peer's rounds count only for its plain decoding: its streamer's chunks are not verification rounds
    (older reports recorded them anyway)."""
    from verispec.bench.report import read_recorded, recorded, write_report
    from verispec.bench.runner import run_from_dict

    report_path, log_path = recorded(out / "report.json"), recorded(out / "runs.jsonl")
    report = json.loads(read_recorded(report_path)) if report_path else {}
    if log_path and log_path.stat().st_size:
        dicts = [json.loads(line) for line in read_recorded(log_path).splitlines() if line.strip()]
    else:
        dicts = report.get("runs", [])
    if not dicts:
        raise ValueError(f"{out} holds no recorded runs (runs.jsonl or report.json)")
    runs = [run_from_dict(d) for d in dicts]
    for r in runs:
        if r.config.system != "verispec" and not r.config.plain:
            r.rounds = None
    configs: list[Config] = []
    for r in runs:  # the order they were first run in: build_configs' order
        if r.config not in configs:
            configs.append(r.config)
    meta = dict(report.get("meta", {}))
    meta["rerendered"] = time.strftime("%Y-%m-%d %H:%M:%S %Z") + f" from {len(runs)} recorded runs"
    extra = {k: v for k, v in report.items() if k not in ("meta", "summary", "theory", "runs")}
    return write_report(out, runs, configs, meta, extra)


def run(args: argparse.Namespace) -> int:
    from verispec.bench.report import write_report

    if args.rerender is not None:
        try:
            paths = rerender(Path(args.rerender))
        except (OSError, ValueError, KeyError, TypeError) as e:
            fail(f"cannot re-render {args.rerender}: {e}")
        print(paths["md"].read_text())
        print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
        return 0
    from verispec.bench.suite import load_prompts
    from verispec.models.load import default_threads
    from verispec.strategies import get

    strategies = comma_list(args.strategies, str, "--strategies")
    for s in strategies:
        try:
            get(s)
        except ValueError as e:
            fail(str(e))
    per_strategy, gammas = parse_gammas(args.gamma, strategies)
    temperatures = comma_list(args.temperature, float, "--temperature")
    peers = comma_list(args.peers, str, "--peers") if args.peers.strip() else []
    peer_gammas = parse_peer_gammas(args.peer_gamma, peers, gammas) if args.peer_gamma is not None else None
    peer_strategies = (comma_list(args.peer_strategies, str, "--peer-strategies")
                       if args.peer_strategies is not None else None)
    if any(g < 1 for gs in [gammas, *per_strategy.values(), *(peer_gammas or {}).values()] for g in gs):
        fail("--gamma and --peer-gamma values must be >= 1")
    for s in peer_strategies or []:
        if s not in PEER_STRATEGIES:
            fail(f"unknown peer configuration {s!r} in --peer-strategies; choose from {', '.join(PEER_STRATEGIES)}")
    if (peer_gammas is not None or peer_strategies is not None) and not peers:
        fail("--peer-gamma and --peer-strategies choose the peers' runs: give --peers too")
    if any(not math.isfinite(t) or not 0 <= t <= 2 for t in temperatures):
        fail("--temperature values must be finite and in [0, 2]")
    for p in peers:
        if p not in PEERS:
            fail(f"unknown peer {p!r}; choose from {', '.join(PEERS)}")
    if args.repeats < 1 or args.max_new_tokens < 1 or (args.limit is not None and args.limit < 1):
        fail("--repeats, --max-new-tokens and --limit must be >= 1")
    resolve_dtype(args)
    options = strategy_options(args, strategies)
    if args.synthetic is not None:
        if not 0 <= args.synthetic <= 1:
            fail(f"--synthetic takes an error rate in [0, 1], got {args.synthetic}")
        if temperatures != [0.0]:
            fail("--synthetic is for greedy only: use --temperature 0")
        if peers:
            fail("--synthetic applies to our strategies only: drop --peers")
    categories = comma_list(args.categories, str, "--categories") if args.categories else None
    try:
        prompts = load_prompts(args.prompts, categories=categories, limit=args.limit)
    except (ValueError, OSError) as e:
        fail(str(e))
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"cannot create the output directory {out}: {e.strerror}")

    default_threads()
    progress = sys.stderr.isatty()
    target, draft = load_models(args, strategies, progress)
    tok = target.tokenizer
    encode = lambda p: tok.chat(list(p.messages))  # noqa: E731
    synthetic = None
    if args.synthetic is not None:
        synthetic = (args.synthetic, _references(target, [encode(p) for p in prompts], args.max_new_tokens, progress))
    backends: dict[str, Any] = {"verispec": VerispecBackend(target, draft, tok.eos_ids, options, synthetic=synthetic)}
    if "hf" in peers:
        backends["hf"] = HFBackend(target.path, None if draft is None else draft.path, tok.eos_ids, tok.hf.pad_token_id,
                                   torch.float32 if args.dtype == "float32" else torch.bfloat16,  # its nearest to int8/int4: bf16
                                   ngram_max=options.ngram_max)
    if "llama.cpp" in peers:
        gguf = _gguf_path(args.target)
        if not LlamaCppBackend.available():
            print(LLAMA_CPP_HINT, file=sys.stderr)
            peers.remove("llama.cpp")
        elif gguf is None:
            print("llama.cpp peer skipped: the target is not a GGUF file or a packaged model", file=sys.stderr)
            peers.remove("llama.cpp")
        else:
            draft_gguf = _gguf_path(args.draft) if draft is not None else None
            if draft is not None and draft_gguf is None:
                print("llama.cpp draft-model speculation skipped: the draft is not a GGUF file or a packaged model",
                      file=sys.stderr)
            backends["llama.cpp"] = LlamaCppBackend(gguf, tok.eos_ids, threads=torch.get_num_threads(),
                                                    draft_path=draft_gguf)
    if "openvino" in peers:
        ov_target = openvino_dir(args.target, args.openvino_dir)
        ov_draft = openvino_dir(args.draft, args.openvino_dir) if draft is not None else None
        missing = [d for d in (ov_target, ov_draft) if d is not None and not (d / "openvino_model.xml").is_file()]
        if not OpenVinoBackend.available():
            print(OPENVINO_HINT, file=sys.stderr)
            peers.remove("openvino")
        elif missing:
            print(f"openvino peer skipped: no exported model in {', '.join(map(str, missing))} (make them once with "
                  "benchmarks/openvino_export.sh)", file=sys.stderr)
            peers.remove("openvino")
        else:
            backends["openvino"] = OpenVinoBackend(ov_target, ov_draft, tok.eos_ids, threads=torch.get_num_threads(),
                                                   ngram_max=options.ngram_max)
    configs = build_configs(strategies, per_strategy, temperatures, peers,
                            gammas if peer_gammas is None else peer_gammas, peer_strategies)
    if "llama.cpp" in backends and backends["llama.cpp"].draft_path is None:
        configs = [c for c in configs if (c.system, c.strategy) != ("llama.cpp", "draft")]

    vocab = draft_vocab_of(args)
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": "verispec " + " ".join(sys.argv[1:]) if sys.argv and "verispec" in sys.argv[0] else "verispec bench",
        "target": f"{args.target} ({args.dtype})",
        "draft": None if draft is None else f"{args.draft} ({draft_dtype_of(args)}{f', ids < {vocab}' if vocab else ''})",
        "device": args.device,
        "prompts": f"{args.prompts}: {len(prompts)} prompts in {len({p.category for p in prompts})} categories",
        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
        "machine": _machine(), "order": "interleaved per prompt, rotating start; warm-up excluded",
    }
    runs_log = out / "runs.jsonl"
    runs_log.write_text("")

    def log(run: Run) -> None:  # every run is on disk as soon as it is measured
        with runs_log.open("a") as f:
            f.write(json.dumps(run.to_dict(), ensure_ascii=False) + "\n")

    print(f"bench: {len(configs)} configurations x {len(prompts)} prompts x {args.repeats} repeats "
          f"= {len(configs) * len(prompts) * args.repeats} runs", file=sys.stderr)
    if synthetic is not None:
        meta["synthetic"] = (f"draft tokens replaced by the target's own greedy tokens, each wrong with probability "
                             f"{args.synthetic} (the drafts' cost is still paid)")
    result = run_bench(prompts, encode, configs, backends,
                       max_new_tokens=args.max_new_tokens, repeats=args.repeats, seed=args.seed,
                       warmup=not args.no_warmup, progress=progress, on_run=log)
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    if result.interrupted:
        meta["interrupted"] = f"stopped by Ctrl-C after {len(result.runs)} runs"
    if result.errors:
        meta["errors"] = result.errors
    extra = {}
    if args.costs and not result.interrupted:
        extra["costs"] = measure_costs(target.model, progress)
    paths = write_report(out, result.runs, configs, meta, extra)
    print(paths["md"].read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return 130 if result.interrupted else 0
