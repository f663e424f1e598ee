"""Which layer-skip depth ℓ is fastest for a model on this machine: measured through the engine, saved per model
(verispec.proposers.layerskip reads the saved choice when no ℓ is given)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verispec.engine import GenerationParams, generate
from verispec.models.llama import LlamaModel
from verispec.proposers.layerskip import LayerSkipProposer, default_candidates

def _run(model, prompts: list[list[int]], params, make_proposer) -> dict[str, float | None]:
    """Greedy generation of every prompt; decode tokens/s excludes the prefill (the same for every ℓ)."""
    tokens = drafted = accepted = rounds = 0
    seconds = 0.0
    for prompt in prompts:
        m = generate(model, prompt, params, make_proposer()).metrics
        tokens, rounds = tokens + m.new_tokens, rounds + m.rounds
        drafted, accepted = drafted + m.drafted, accepted + m.accepted
        seconds += m.seconds - m.prefill_seconds
    return {
        "alpha": accepted / drafted if drafted else None,
        "mean_accepted_length": tokens / rounds if rounds else None,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
    }


def calibrate(
    target: Any,
    prompts: list[list[int]],
    candidates: list[int] | None = None,
    *,
    gamma: int = 4,
    max_new_tokens: int = 64,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Measure greedy generation through the engine for each ℓ in `candidates` and pick the fastest.

    target: a LoadedModel (or anything with .model, a native LlamaModel, and .tokenizer with .eos_ids);
    prompts: token ids; candidates: depths to try (default `default_candidates`); log: optional callable(str)
    told each figure as it is measured.
    Returns {"best_layers", "gamma", "max_new_tokens", "num_layers", "prompts", "plain_tokens_per_s",
             "results": [{"layers", "alpha", "mean_accepted_length", "tokens_per_s", "speedup"}, ...]}.
    Timings are wall clock on this machine: run it on an otherwise idle machine.
    """
    model = target.model
    if not isinstance(model, LlamaModel):
        raise ValueError(f"layer-skip calibration needs the native Llama-family model, not {type(model).__name__}")
    if not prompts:
        raise ValueError("calibration needs at least one prompt")
    n = model.cfg.num_hidden_layers
    candidates = sorted(set(candidates or default_candidates(n)))
    eos = tuple(getattr(getattr(target, "tokenizer", None), "eos_ids", ()) or ())
    params = GenerationParams(max_new_tokens=max_new_tokens, gamma=gamma, eos_ids=eos)
    say = log or (lambda _msg: None)

    generate(model, prompts[0], GenerationParams(max_new_tokens=4, gamma=gamma))  # warm-up (allocations)
    plain = _run(model, prompts, params, lambda: None)
    say(f"plain: {plain['tokens_per_s']:.2f} tok/s")
    results = []
    for layers in candidates:
        r = _run(model, prompts, params, lambda: LayerSkipProposer(model, layers))
        r = {"layers": layers, **r, "speedup": r["tokens_per_s"] / plain["tokens_per_s"]}
        results.append(r)
        alpha = "-" if r["alpha"] is None else f"{r['alpha']:.3f}"
        say(f"layers {layers}: alpha {alpha}, mean accepted length {r['mean_accepted_length']:.2f}, "
            f"{r['tokens_per_s']:.2f} tok/s ({r['speedup']:.2f}x)")
    best = max(results, key=lambda r: r["tokens_per_s"])
    return {
        "best_layers": best["layers"],
        "gamma": gamma,
        "max_new_tokens": max_new_tokens,
        "num_layers": n,
        "prompts": len(prompts),
        "plain_tokens_per_s": plain["tokens_per_s"],
        "results": results,
    }


