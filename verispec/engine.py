"""The one loop: propose, verify in one target forward, commit, emit.

    while not done:
        draft  = proposer.propose(gamma)                      # tokens + proposal probs q
        logits = target.forward([pending] + draft, cache)     # ONE forward over all drafted positions
        result = verify(draft, p=probs(logits), q)            # pure function
        cache.commit(1 + accepted); proposer.observe(result)  # the rest of the slots are scratch
        emit(result.tokens)

Plain decoding is the same loop with no proposer (gamma = 0), so every speedup is measured against the
same code. Invariant: the target cache holds the whole sequence except `pending`, its last token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from verispec.metrics import RequestMetrics
from verispec.models.base import CausalLM
from verispec.proposers.base import Proposer
from verispec.sampling import SamplingParams, argmax, logits_to_probs, make_generator
from verispec.verify import Verified, verify_chain, verify_greedy

Verifier = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], Verified]
# Given all new token ids so far, return how many to keep if a stop sequence occurred, else None.
StopFn = Callable[[list[int]], "int | None"]


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 128
    gamma: int = 4
    sampling: SamplingParams = SamplingParams()
    seed: int | None = None
    eos_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {self.gamma}")


@dataclass
class Generation:
    """Filled in while `stream` runs; complete once it is exhausted."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "length" | "eos" | "stop"
    metrics: RequestMetrics | None = None


def _timed(fn: Callable[[], torch.Tensor], device: torch.device) -> tuple[torch.Tensor, float]:
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - t0


def _extra_layout(g: int, proposal, device: torch.device) -> dict[str, torch.Tensor]:
    """Positions and mask for one forward over [pending] + chain (causal) + the proposal's extra tokens."""
    e = proposal.extra.numel()
    positions = torch.cat([torch.arange(g + 1), proposal.extra_positions.to(torch.long).cpu()])
    mask = torch.zeros(g + 1 + e, g + 1 + e, dtype=torch.bool)
    mask[: g + 1, : g + 1] = torch.ones(g + 1, g + 1, dtype=torch.bool).tril()
    mask[g + 1 :] = proposal.extra_mask.to(torch.bool).cpu()
    return {"positions": positions.to(device), "tree_mask": mask.to(device)}


def stream(
    target: CausalLM,
    prompt: list[int],
    params: GenerationParams,
    proposer: Proposer | None = None,
    *,
    result: Generation | None = None,
    stop_fn: StopFn | None = None,
    verifier: Verifier = verify_chain,
) -> Iterator[list[int]]:
    """Yield the new tokens of each round; `result` receives ids, finish reason and metrics."""
    if not prompt:
        raise ValueError("the prompt is empty")
    result = result if result is not None else Generation()
    metrics = result.metrics = RequestMetrics(gamma=params.gamma if proposer else 0, prompt_tokens=len(prompt))
    sampling, device = params.sampling, target.device
    generator = make_generator(params.seed, device)
    cache = target.new_cache(len(prompt) + params.max_new_tokens + params.gamma + 2)
    if len(prompt) + params.max_new_tokens > cache.max_len:
        raise ValueError(f"prompt ({len(prompt)}) + max new tokens exceeds the model's context ({cache.max_len})")

    def forward(tokens: list[int], last_n: int | None = None, **tree) -> torch.Tensor:
        x = torch.tensor([tokens], dtype=torch.long, device=device)
        return target.forward(x, cache, last_n=last_n, **tree)[0]  # [T, V]

    if len(prompt) > 1:
        _, metrics.prefill_seconds = _timed(lambda: forward(prompt[:-1], last_n=1), device)
        cache.commit(len(prompt) - 1)
    pending = prompt[-1]
    if proposer is not None:
        if hasattr(proposer, "bind_target_cache"):
            proposer.bind_target_cache(cache)
        t_reset = time.perf_counter()
        proposer.reset(prompt)  # a draft model prefills here
        metrics.proposer_prefill_seconds = time.perf_counter() - t_reset

    out = result.token_ids
    while True:
        remaining = params.max_new_tokens - len(out)
        gamma = min(params.gamma, remaining - 1) if proposer is not None else 0  # drafting past the end is waste
        if gamma > 0:
            proposal = proposer.propose(gamma, sampling, generator)
            draft = proposal.tokens.to(device)
        else:
            proposal, draft = None, torch.empty(0, dtype=torch.long, device=device)
        g = draft.numel()
        chain = [pending] + draft.tolist()
        if proposal is not None and proposal.extra is not None and proposal.extra.numel():
            tree = _extra_layout(g, proposal, device)
            logits, seconds = _timed(lambda: forward(chain + proposal.extra.tolist(), **tree), device)
            logits, extra_logits = logits[: g + 1], logits[g + 1 :]
        else:
            logits, seconds = _timed(lambda: forward(chain), device)  # [g + 1, V]
            extra_logits = None
        metrics.target_seconds += seconds
        t_verify = time.perf_counter()
        if sampling.greedy:
            verified = verify_greedy(draft[None], argmax(logits)[None])
        else:
            p = logits_to_probs(logits, sampling)  # [g + 1, V]
            if proposal is not None and proposal.q is not None:
                q = proposal.q.to(device)
            else:  # deterministic proposal: one-hot q
                q = torch.zeros(g, p.shape[-1], device=device).scatter_(-1, draft[:, None], 1.0)
            verified = verifier(draft[None], p[None], q[None], generator)
        n = int(verified.num_accepted[0])  # (a device sync: the verify time below includes its kernels)
        metrics.verify_seconds += time.perf_counter() - t_verify
        emitted = verified.tokens[0, : n + 1].tolist()
        cache.commit(n + 1)  # pending + the accepted drafts; the recovered/bonus token is the new pending
        pending = emitted[-1]
        if extra_logits is not None:
            proposer.observe(n, emitted, extra_logits=extra_logits)
        elif proposer is not None:
            proposer.observe(n, emitted)

        # Stop conditions, applied to what this round emitted.
        keep, reason = len(emitted), None
        for i, tok in enumerate(emitted):
            if tok in params.eos_ids:
                keep, reason = i, "eos"
                break
        if reason is None and len(out) + keep >= params.max_new_tokens:
            keep, reason = params.max_new_tokens - len(out), "length"
        new = emitted[:keep]
        if stop_fn is not None and new:
            cut = stop_fn(out + new)
            if cut is not None:
                new, reason = (out + new)[len(out) : cut] if cut > len(out) else [], "stop"
        metrics.record_round(g, n, len(new))
        if proposer is not None:
            metrics.draft_forwards = getattr(proposer, "forwards", 0)
            metrics.draft_seconds = getattr(proposer, "seconds", 0.0)
        out.extend(new)
        if new:
            yield new
        if reason is not None:
            result.finish_reason = reason
            metrics.finish()
            return


def generate(
    target: CausalLM,
    prompt: list[int],
    params: GenerationParams,
    proposer: Proposer | None = None,
    **kwargs,
) -> Generation:
    result = Generation()
    for _ in stream(target, prompt, params, proposer, result=result, **kwargs):
        pass
    return result
