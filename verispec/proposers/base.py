"""The one small interface every drafting method implements, for a batch of rows.

The round (verispec.engine.Batch.round) addresses sequences by their row in the target's cache. A proposer
serves any number of rows at once:

    reset(rows, prompts, target, hidden)  sequences start in `rows` (after their first round, a plain step, so
                                     that a draft's prefill does not delay the first token: prompts[i] is the
                                     prompt and that round's token), in one call (a draft model prefills them
                                     in one forward); the target cache row holds all of it but its last token
                                     (a self-speculating proposer drafts in it; others ignore it); hidden[i]
                                     [len(prompts[i]) - 1, H]: the target's last-block outputs there (a
                                     feature-level drafter reads them; None, or hidden None, where the target
                                     gives none)
    propose(rows, gammas, ...)       up to gammas[i] tokens for each of `rows`, in as few forwards as it can
    observe(row, outcome)            the round's outcome for one row
    move(src, dst) / free(row)       the round keeps live rows packed at 0 .. n-1
    stats(row)                       draft forwards and seconds spent for the row's sequence

Methods that keep one sequence's state and have no use for batching (prompt lookup, lookahead, test doubles)
implement the smaller `SequenceProposer` instead; `PerRow` serves them behind `Proposer`, one instance per row.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from verispec.sampling import SamplingParams, Shaper

if TYPE_CHECKING:  # the round's model over cache rows (verispec.batch imports the models, not the proposers)
    from verispec.batch import Rows


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
    # Their logits come back in Outcome.extra_logits [E, V]. The chain never sees them, so they cannot change
    # what is verified; their cache slots are scratch that the next forward overwrites. The round leaves them
    # out (and extra_logits is None) when the row's cache has no room for them.
    extra: Tensor | None = None
    extra_positions: Tensor | None = None
    extra_mask: Tensor | None = None
    # A token tree instead of a chain: parents [gamma'] int, parents[i] < i the node tokens[i] follows (-1: the
    # pending token), siblings in the order they were drawn; q[i] is what tokens[i] was drawn from given its parent
    # and its earlier siblings (verispec.verify.verify_tree). The target verifies the whole tree in one forward.
    parents: Tensor | None = None


@dataclass(frozen=True)
class Outcome:
    """One row's round: num_accepted proposed tokens were kept (the first ones of a chain, the nodes `path` of a
    tree), and `emitted` (those accepted tokens plus the recovered/bonus one) now follows the sequence."""

    num_accepted: int
    emitted: list[int]
    extra_logits: Tensor | None = None
    path: list[int] | None = None  # which proposed tokens were accepted, in order (0 .. n-1 for a chain)
    hidden: Tensor | None = None  # [num_accepted + 1, H] the target's last-block outputs at pending + accepted


@dataclass
class ProposerStats:
    forwards: int = 0  # draft model (or draft layer) forwards
    seconds: float = 0.0  # time spent drafting


def each_hidden(rows: list[int], hidden: list[Tensor | None] | None) -> list[Tensor | None]:
    """reset()'s hidden, one entry a row (None for every row where the caller gave none)."""
    return [None] * len(rows) if hidden is None else hidden


def charge(stats: dict[int, ProposerStats], rows: list[int], since: float) -> None:
    """One batched draft forward for `rows`, begun at perf_counter() == since: each row gets the forward and an
    equal share of the seconds (c, and the drafting time per request, are per row)."""
    share = (time.perf_counter() - since) / len(rows)
    for r in rows:
        stats[r].forwards += 1
        stats[r].seconds += share


class Proposer(Protocol):
    def reset(self, rows: list[int], prompts: list[list[int]], target: "Rows | None" = None,
              hidden: list[Tensor | None] | None = None) -> None: ...

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator], shapes: list[Shaper | None] | None = None) -> list[Proposal]:
        """shapes[i]: row i's penalties and grammar (sampling.Shaper), to apply to the logits it drafts from;
        a proposer may ignore them (q is what the drafts were drawn from either way: exactness holds), at the
        cost of drafts the target's shaped law rejects."""
        ...

    def observe(self, row: int, outcome: Outcome) -> None: ...

    def move(self, src: int, dst: int) -> None: ...

    def free(self, row: int) -> None: ...

    def stats(self, row: int) -> ProposerStats: ...


class SequenceProposer(ABC):
    """A proposer for one sequence; `stats` is its running count (reset() starts it afresh)."""

    def __init__(self) -> None:
        self.stats = ProposerStats()

    @abstractmethod
    def reset(self, prompt: list[int]) -> None:
        """Start a new sequence whose tokens so far are `prompt`."""

    @abstractmethod
    def propose(self, gamma: int, sampling: SamplingParams, generator: torch.Generator) -> Proposal:
        """Guess up to gamma tokens that follow the sequence so far."""

    @abstractmethod
    def observe(self, num_accepted: int, emitted: list[int], extra_logits: Tensor | None = None) -> None:
        """The round's outcome (the fields of Outcome)."""


class PerRow:
    """A Proposer over SequenceProposers: `factory()` makes one for each sequence that starts."""

    def __init__(self, factory: Callable[[], SequenceProposer]) -> None:
        self.factory = factory
        self.by_row: dict[int, SequenceProposer] = {}

    def reset(self, rows: list[int], prompts: list[list[int]], target: "Rows | None" = None,
              hidden: list[Tensor | None] | None = None) -> None:
        for row, prompt in zip(rows, prompts):
            proposer = self.factory()
            proposer.reset(prompt)
            self.by_row[row] = proposer

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator], shapes: list[Shaper | None] | None = None) -> list[Proposal]:
        # one-sequence proposers (prompt lookup, lookahead) copy text or guess deterministically: nothing to shape
        return [self.by_row[r].propose(g, s, gen) for r, g, s, gen in zip(rows, gammas, sampling, generators)]

    def observe(self, row: int, outcome: Outcome) -> None:
        self.by_row[row].observe(outcome.num_accepted, outcome.emitted, outcome.extra_logits)

    def move(self, src: int, dst: int) -> None:
        self.by_row[dst] = self.by_row.pop(src)

    def free(self, row: int) -> None:
        self.by_row.pop(row, None)

    def stats(self, row: int) -> ProposerStats:
        return self.by_row[row].stats
