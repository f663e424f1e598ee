"""The one small interface every drafting method implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from verispec.sampling import SamplingParams


@dataclass
class Proposal:
    """tokens [gamma'] (gamma' <= the gamma asked for, may be 0); q [gamma', V] processed proposal probs, or
    None when the proposal is deterministic (verification then uses one-hot q) or sampling is greedy."""

    tokens: Tensor
    q: Tensor | None = None
    # Optional tokens the target should also run in the verification forward, without being verified
    # (lookahead decoding's Jacobi window). They sit after the chain in the same forward:
    #   extra            [E] token ids
    #   extra_positions  [E] position offsets, counted from the pending token (pending 0, draft i at i + 1)
    #   extra_mask       [E, 1 + gamma' + E] bool: which of the forward's new tokens each extra token sees
    # Their logits come back as observe(..., extra_logits=[E, V]). The chain never sees them, so they cannot
    # change what is verified; their cache slots are scratch that the next forward overwrites.
    extra: Tensor | None = None
    extra_positions: Tensor | None = None
    extra_mask: Tensor | None = None


class Proposer(Protocol):
    def reset(self, prompt: list[int]) -> None:
        """Start a new sequence whose tokens so far are `prompt`."""

    def propose(self, gamma: int, sampling: SamplingParams, generator: torch.Generator) -> Proposal:
        """Guess up to gamma tokens that follow the sequence so far."""

    def observe(self, num_accepted: int, emitted: list[int]) -> None:
        """The round's outcome: the first num_accepted proposed tokens were kept, and `emitted` (those
        accepted tokens plus the recovered/bonus one) now follows the sequence. A proposal with `extra`
        tokens is answered with observe(num_accepted, emitted, extra_logits=...)."""


# Optional, for proposers that draft with the target's own weights (self-speculation): the engine calls
# `proposer.bind_target_cache(cache)` before `reset`, handing over the target's KV cache. Such a proposer may
# write past cache.length (scratch) but must leave cache.length as it found it when propose() returns.
