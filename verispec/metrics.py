"""Per-request measurements: what a user needs to judge whether speculation paid."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


def alpha_iid(accepted: float, rejections: float) -> float | None:
    """Per-token acceptance under the i.i.d. model: each tested draft is accepted with probability alpha, and
    a round stops testing at its first rejection, so accepted / (accepted + rejections) is the estimate."""
    tested = accepted + rejections
    return accepted / tested if tested else None


@dataclass
class RequestMetrics:
    """Counts and timings of one generation.

    alpha                  accepted / drafted tokens (vLLM's draft acceptance rate)
    alpha_iid              accepted / (accepted + rejections): the per-token acceptance probability of the
                           i.i.d. model in theory.py (its maximum-likelihood estimate). Lower-bounded by alpha:
                           drafts after a rejection count against alpha but are never tested
    mean_accepted_length   output tokens per verification (target) forward; counts the recovered/bonus token
    per_position_acceptance[i]  fraction of rounds that drafted position i in which draft i was accepted
    c                      draft seconds per draft forward / target seconds per decoding forward
    """

    gamma: int
    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0  # decoding forwards of the target (one per round)
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # rounds in which a drafted token was rejected
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    target_seconds: float = 0.0  # decoding forwards only
    draft_forwards: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0  # the verifier (and the logits -> probabilities it needs)
    proposer_prefill_seconds: float = 0.0  # proposer.reset: a draft model's prefill of the prompt
    start: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    end: float | None = None

    def record_round(self, drafted: int, accepted: int, emitted: int) -> None:
        if self.first_token is None and emitted:
            self.first_token = time.perf_counter()
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.rejections += int(accepted < drafted)
        self.new_tokens += emitted
        grow = drafted - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        for i in range(drafted):
            self.drafted_per_position[i] += 1
            self.accepted_per_position[i] += int(i < accepted)

    def finish(self) -> None:
        self.end = time.perf_counter()

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def alpha_iid(self) -> float | None:
        return alpha_iid(self.accepted, self.rejections) if self.drafted else None

    @property
    def mean_accepted_length(self) -> float | None:
        return self.new_tokens / self.rounds if self.rounds else None

    @property
    def c(self) -> float | None:
        if not (self.draft_forwards and self.rounds and self.target_seconds):
            return None
        return (self.draft_seconds / self.draft_forwards) / (self.target_seconds / self.rounds)

    @property
    def seconds(self) -> float:
        return (self.end or time.perf_counter()) - self.start

    @property
    def tokens_per_s(self) -> float:
        """New tokens over the whole request time, prefill included (what a user waits for)."""
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """New tokens per second after the first one, excluding prefill and time to first token."""
        if self.first_token is None or self.new_tokens < 2:
            return 0.0
        return (self.new_tokens - 1) / max((self.end or time.perf_counter()) - self.first_token, 1e-9)

    def profile(self) -> dict[str, float] | None:
        """Where a decoding round's time goes, in ms per round: draft, target forward, verification, and the
        rest (the loop's own work and the caller's time between yields). Both prefills are left out."""
        if not self.rounds:
            return None
        decode = self.seconds - self.prefill_seconds - self.proposer_prefill_seconds
        other = decode - self.draft_seconds - self.target_seconds - self.verify_seconds
        per = 1e3 / self.rounds
        return {"draft_ms": round(self.draft_seconds * per, 2), "target_ms": round(self.target_seconds * per, 2),
                "verify_ms": round(self.verify_seconds * per, 2), "other_ms": round(other * per, 2)}

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None, nd: int = 4) -> float | None:
            return None if x is None else round(x, nd)

        return {
            "gamma": self.gamma,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "alpha": r(self.alpha),
            "alpha_iid": r(self.alpha_iid),
            "mean_accepted_length": r(self.mean_accepted_length),
            "per_position_acceptance": [
                round(a / d, 4) if d else None for a, d in zip(self.accepted_per_position, self.drafted_per_position)
            ],
            "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "rejections": self.rejections,
            "target_forwards": self.rounds + int(self.prompt_tokens > 1),  # + the prefill, if any
            "draft_forwards": self.draft_forwards,
            "target_seconds": r(self.target_seconds),
            "draft_seconds": r(self.draft_seconds),
            "prefill_seconds": r(self.prefill_seconds),
            "proposer_prefill_seconds": r(self.proposer_prefill_seconds),
            "c": r(self.c),
            "seconds": r(self.seconds),
            "tokens_per_s": r(self.tokens_per_s, 2),
            "decode_tokens_per_s": r(self.decode_tokens_per_s, 2),
            "ttft_s": r(self.ttft),
            "round_profile": self.profile(),
        }
