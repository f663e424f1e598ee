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


class Proposer(Protocol):
    def reset(self, prompt: list[int]) -> None:
        """Start a new sequence whose tokens so far are `prompt`."""

    def propose(self, gamma: int, sampling: SamplingParams, generator: torch.Generator) -> Proposal:
        """Guess up to gamma tokens that follow the sequence so far."""

    def observe(self, num_accepted: int, emitted: list[int]) -> None:
        """The round's outcome: the first num_accepted proposed tokens were kept, and `emitted` (those
        accepted tokens plus the recovered/bonus one) now follows the sequence."""
