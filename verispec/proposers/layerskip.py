"""Self-speculation (Draft & Verify, LayerSkip): draft with the target's own first ℓ layers.

The draft model q is the target p cut short: its first ℓ blocks, then the target's final norm and LM head
(`model.forward(..., layers=ℓ)`). No second set of weights, no training, and no second KV cache: the proposer
drafts *in the target's own cache*.

Why sharing the cache is exact, with no catch-up and no separate prefill:
  * Block i's keys and values depend only on the outputs of blocks < i. So for any text, the first ℓ layers of
    the full model's KV cache are exactly the KV cache of the ℓ-layer draft model on the same text.
  * Engine invariant: between rounds the target cache holds every token of the sequence except `pending`, in
    all layers (the prompt prefill and every verification forward run all layers). Hence its layers < ℓ are
    a correct draft cache for the same text.
  * propose() feeds pending, d1, .., d(γ-1) one at a time with layers=ℓ at slots beyond cache.length,
    committing provisionally so each step sees the previous ones, then rolls back to the original length.
    Layers >= ℓ of those slots are left untouched (stale scratch).
  * The engine's verification forward then writes [pending, d1 .. dγ] at the same slots for *all* layers and
    commits pending + the accepted drafts. Every committed slot was therefore written by a full forward of the
    committed text, exactly as in plain decoding, and the invariant holds again for the next round.
Nothing the proposer writes can outlive its round, so it can change speed, never the output: verification is
the ordinary chain rule against p.

`calibrate` picks ℓ per model by measuring greedy tokens/s through the engine; the choice is saved as JSON
under the cache dir and used when no ℓ is given (else half the layers).

Expect little from a model never trained for early exit (LayerSkip trains for it; Draft & Verify skips middle
layers instead of cutting the top ones): on Qwen2.5-Coder-1.5B the first ℓ of 28 layers agree with the full
model's greedy token on ~0% of code tokens up to ℓ = 8, ~5% at 14, ~80% at 24, where a draft step already costs
~0.85 of a target step (the LM head over 152k tokens is paid at every depth).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from verispec.cache import KVCache
from verispec.models.llama import LlamaModel
from verispec.proposers.base import Proposal
from verispec.sampling import SamplingParams, argmax, logits_to_probs, sample


class LayerSkipProposer:
    """q = the target's first `layers` blocks + final norm + LM head, drafting in the target's KV cache.

    The engine must call bind_target_cache(cache) (it does, before reset) and keep its invariant: the cache
    holds the whole sequence except the pending token.
    """

    def __init__(self, model: LlamaModel, layers: int) -> None:
        if not isinstance(model, LlamaModel):
            raise ValueError(
                f"layer-skip self-speculation needs the native Llama-family model (it runs a layer range), "
                f"not {type(model).__name__}"
            )
        n = model.cfg.num_hidden_layers
        if not 1 <= layers <= n:
            raise ValueError(f"layer-skip layers must be in 1..{n} for this model, got {layers}")
        self.model, self.layers = model, layers
        self.vocab_size = model.vocab_size
        self.cache: KVCache | None = None
        self.pending: int | None = None
        self.forwards = 0
        self.seconds = 0.0

    def bind_target_cache(self, cache: KVCache) -> None:
        self.cache = cache

    def reset(self, prompt: list[int]) -> None:
        if self.cache is None:
            raise RuntimeError("LayerSkipProposer drafts in the target's cache: call bind_target_cache first")
        assert self.cache.length == len(prompt) - 1, "the target cache must hold the prompt but its last token"
        self.pending = prompt[-1]
        self.forwards, self.seconds = 0, 0.0

    def _draft_logits(self, token: int) -> torch.Tensor:
        """Feed one token through the first ℓ layers at slot cache.length; logits [V] of the next token."""
        t0 = time.perf_counter()
        x = torch.tensor([[token]], dtype=torch.long, device=self.model.device)
        logits = self.model.forward(x, self.cache, last_n=1, layers=self.layers)[0, -1]  # [V]
        self.seconds += time.perf_counter() - t0
        self.forwards += 1
        return logits

    def propose(self, gamma: int, sampling: SamplingParams, generator: torch.Generator) -> Proposal:
        cache = self.cache
        gamma = min(gamma, cache.max_len - cache.length - 1)  # the verification forward needs gamma + 1 slots
        if gamma <= 0:
            return Proposal(tokens=torch.empty(0, dtype=torch.long))
        base = cache.length
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        feed = self.pending
        try:
            for _ in range(gamma):
                logits = self._draft_logits(feed)
                cache.commit(1)  # provisional: the next draft step must see this one
                if sampling.greedy:
                    token = int(argmax(logits))
                else:
                    q = logits_to_probs(logits, sampling)  # [V]
                    token = int(sample(q, generator))
                    qs.append(q)
                tokens.append(token)
                feed = token
        finally:
            cache.rollback(cache.length - base)  # the engine's verification forward overwrites these slots
        return Proposal(tokens=torch.tensor(tokens, dtype=torch.long), q=torch.stack(qs) if qs else None)

    def observe(self, num_accepted: int, emitted: list[int]) -> None:
        # Nothing to undo or catch up: the verification forward rewrote every slot the target committed.
        self.pending = emitted[-1]


# ---- calibration: which ℓ is fastest for this model on this machine ------------------------------------------
def default_candidates(num_layers: int) -> list[int]:
    """A handful of depths between 1/8 and 3/4 of the model, e.g. 28 layers -> [4, 7, 10, 14, 18, 21]."""
    depths = {max(1, round(num_layers * f)) for f in (1 / 8, 1 / 4, 3 / 8, 1 / 2, 5 / 8, 3 / 4)}
    return sorted(d for d in depths if d < num_layers) or [1]


def _run(model, prompts: list[list[int]], params, make_proposer) -> dict[str, float | None]:
    """Greedy generation of every prompt; decode tokens/s excludes the prefill (the same for every ℓ)."""
    from verispec.engine import generate

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
    from verispec.engine import GenerationParams, generate

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


CALIBRATION_FILE = "layerskip-calibration.json"


def calibration_path() -> Path:
    from verispec.models.packaged import cache_dir

    return cache_dir() / CALIBRATION_FILE


def model_id(target: Any) -> str:
    """The key a calibration is saved under: the resolved directory of the loaded model."""
    return str(Path(target.path).expanduser().resolve())


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        warnings.warn(f"ignoring unreadable layer-skip calibration {path}: {e}", stacklevel=3)
        return {}
    return data if isinstance(data, dict) else {}


def save_calibration(path: Path | None, model_id: str, result: dict) -> Path:
    """Store `result` under `model_id` in the JSON file at `path` (None: `calibration_path()`), keeping the
    other models' entries. Returns the file written."""
    path = Path(path) if path is not None else calibration_path()
    data = _read(path)
    data[model_id] = result
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)  # atomic: a crash mid-write never leaves half a file
    return path


def load_calibration(path: Path | None, model_id: str) -> dict | None:
    """The saved calibration of `model_id`, or None when there is none (or the file is unreadable)."""
    entry = _read(Path(path) if path is not None else calibration_path()).get(model_id)
    return entry if isinstance(entry, dict) else None
