"""Drafting with a smaller model that shares the target's vocabulary, for any number of rows at once.

`draft_steps` is the one draft loop: it feeds each row's pending tokens, then one token a step, through a
`Rows` model (the draft model's own cache here; the target's cache, cut to its first layers, in layer-skip
self-speculation), all live rows in one forward per step. On a memory-bound CPU or GPU, k rows cost little more
than one, so batching keeps speculation worth it as the server's batch grows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from verispec.batch import Rows, make_rows, prefill_rows
from verispec.models.base import CausalLM
from verispec.proposers.base import Outcome, Proposal, ProposerStats, charge
from verispec.sampling import SamplingParams, Shaper, argmax, logits_to_probs, sample


def _onto(x: Tensor, vocab_size: int, ids: Tensor | None, fill: float) -> Tensor:
    """x [..., V_draft] over a head's rows on the target's vocabulary [..., V]: rows at their ids (0..V_draft-1, or
    `ids`), extra rows cut, the ids the head lacks at `fill`."""
    if ids is not None:
        return torch.full((*x.shape[:-1], vocab_size), fill, dtype=x.dtype, device=x.device).index_copy_(-1, ids, x)
    if x.shape[-1] < vocab_size:
        return torch.nn.functional.pad(x, (0, vocab_size - x.shape[-1]), value=fill)
    return x[..., :vocab_size]


def to_vocab(logits: Tensor, vocab_size: int, ids: Tensor | None = None) -> Tensor:
    """A draft's logits [..., V_draft] on the target's vocabulary: extra rows cut, missing ids at -inf. ids: the
    target ids of a head's rows where they are not 0..V_draft-1 (an EAGLE head of the most frequent ids)."""
    return _onto(logits, vocab_size, ids, float("-inf"))


def spread(q: Tensor, vocab_size: int, ids: Tensor | None = None) -> Tensor:
    """A distribution over a head's rows [..., V_draft] on the target's vocabulary: the ids it lacks at 0."""
    return _onto(q, vocab_size, ids, 0.0)


def probs_on_vocab(logits: Tensor, sampling: SamplingParams, vocab_size: int, ids: Tensor | None = None) -> Tensor:
    """logits_to_probs(to_vocab(logits)), computed over the draft's own ids and spread with zeros: the same q (the
    ids it lacks are -inf, probability 0, after any temperature, top-k or top-p), without softmaxing a 152k-id
    vector for a 32k-row head (a truncated-head drafter's sampled rounds cost ~3x its greedy ones that way)."""
    if ids is None and logits.shape[-1] >= vocab_size:
        return logits_to_probs(to_vocab(logits, vocab_size), sampling)
    return spread(logits_to_probs(logits, sampling), vocab_size, ids)


SINKS = 4  # a windowed draft context keeps the prompt's first tokens: attention leans on them (StreamingLLM)


def checked_window(window: int | None) -> int | None:
    """A draft's prompt window (draft_context) as given, or ValueError where it is no window at all."""
    if window is not None and window < 1:
        raise ValueError(f"the draft's context must be >= 1 prompt tokens, got {window}")
    return window


def checked_confidence(confidence: float) -> float:
    """A confidence stop (see draft_steps) as given, or ValueError where it is no probability."""
    if not 0.0 <= confidence <= 1.0:
        raise ValueError(f"draft confidence must be in [0, 1], got {confidence}")
    return confidence


def draft_context(tokens: list[int], window: int | None) -> list[int]:
    """What a draft reads of a prompt: all of it, or (window set and the prompt longer) its first SINKS tokens and
    its last `window`. The draft's guesses may get worse, never the output: verification uses the q it gave.

    >>> draft_context(list(range(10)), 3), draft_context(list(range(7)), 3), draft_context([1, 2], None)
    ([0, 1, 2, 3, 7, 8, 9], [0, 1, 2, 3, 4, 5, 6], [1, 2])
    """
    if window is None or len(tokens) <= SINKS + window:
        return tokens
    return tokens[:SINKS] + tokens[len(tokens) - window:]


@dataclass
class Drafted:
    proposals: list[Proposal]
    fed: list[int]  # slots each row's steps wrote past its committed length (all rolled back on return)


def draft_steps(model: Rows, rows: list[int], feeds: list[list[int]], gammas: list[int],
                sampling: list[SamplingParams], generators: list[torch.Generator], stats: dict[int, ProposerStats],
                *, vocab_size: int, confidence: float = 0.0, layers: int | None = None,
                features: list[Tensor] | None = None, shapes: list[Shaper | None] | None = None,
                head_ids: Tensor | None = None) -> Drafted:
    """Draft up to gammas[i] tokens for rows[i], whose next input is feeds[i] (its pending tokens).

    Each step runs every row still drafting in one forward and commits what it fed provisionally, so the next
    step sees it; on return every row's committed length is what it was on entry. A row stops early after a
    token the draft gave less than `confidence` (the proposal's length then depends on the draft alone, so the
    output distribution is untouched). stats[row] receives forwards and a share of each step's seconds.
    features[i] [len(feeds[i]), F]: the feeds' input features, for a feature-level drafter (EAGLE), which then
    feeds each drafted token with its own last output as the feature. shapes[i]: row i's Shaper, applied to each
    step's logits with the tokens drafted before it. head_ids: the target ids of the model's logit rows, where they
    are not 0..V'-1 (`to_vocab`).
    """
    base = [model.length(r) for r in rows]
    tokens: list[list[int]] = [[] for _ in rows]
    qs: list[list[Tensor]] = [[] for _ in rows]
    feed = list(feeds)
    feat = list(features) if features is not None else None
    live = [i for i, g in enumerate(gammas) if g > 0]
    try:
        while live:
            t0 = time.perf_counter()
            out = model.forward([rows[i] for i in live], [feed[i] for i in live], last_only=True, layers=layers,
                                features=None if feat is None else [feat[i] for i in live], hidden=feat is not None)
            logits, states = out if feat is not None else (out, None)
            still = []
            for j, i in enumerate(live):
                model.commit(rows[i], len(feed[i]))  # provisional; rolled back below
                if states is not None:
                    feat[i] = states[j][-1:]  # the drafter's predicted feature: the next step's input
                last = logits[j][-1] if head_ids is not None else logits[j][-1][:vocab_size]  # ids past V': q = 0
                ids = head_ids
                if shapes is not None and shapes[i] is not None:
                    last, ids = shapes[i](to_vocab(last, vocab_size, ids), tokens[i]), None
                    if not bool(torch.isfinite(last).any()):  # the constraint allows none of the draft's ids
                        continue  # the row's proposal ends here (the draft's truncated head lacks them)
                if sampling[i].greedy:
                    k = int(argmax(last))
                    sure = confidence == 0.0 or float(torch.softmax(last.float(), -1)[k]) >= confidence
                else:
                    p = logits_to_probs(last, sampling[i])  # over the draft's own rows, then spread (probs_on_vocab)
                    k = int(sample(p, generators[i]))
                    qs[i].append(spread(p, vocab_size, ids))
                    sure = float(p[k]) >= confidence
                token = k if ids is None else int(ids[k])
                tokens[i].append(token)
                feed[i] = [token]
                if sure and len(tokens[i]) < gammas[i]:
                    still.append(i)
            charge(stats, [rows[i] for i in live], t0)  # the step's sampling included
            live = still
    finally:
        fed = [model.length(r) - b for r, b in zip(rows, base)]
        for r, n in zip(rows, fed):
            model.rollback(r, n)
    proposals = [Proposal(tokens=torch.tensor(t, dtype=torch.long), q=torch.stack(q) if q else None)
                 for t, q in zip(tokens, qs)]
    return Drafted(proposals, fed)


class DraftModelProposer:
    """A draft model with its own KV cache of `rows` rows, kept in step with each row's sequence.

    Invariant between rounds, per row: the draft cache holds every token of the sequence (of the prompt, those
    draft_context keeps) except `pending` (one token, or two after a round in which all drafts were accepted:
    the last draft, which was never fed to the draft model, and the bonus token). The next round feeds `pending`
    in a single forward, so the draft catches up without re-running the prefix.
    """

    def __init__(self, model: CausalLM, max_len: int, vocab_size: int | None = None, confidence: float = 0.0,
                 *, rows: int = 1, max_gamma: int = 16, context: int | None = None) -> None:
        """max_len: tokens of the longest sequence; confidence: stop drafting after a token the draft itself gave
        less than this probability (0: always draft the gamma asked for), see draft_steps; context: the draft
        reads only the first SINKS and the last `context` tokens of a longer prompt (None: all of it), which
        bounds its prefill (draft_context)."""
        self.confidence, self.context = checked_confidence(confidence), checked_window(context)
        self.model = model
        self.vocab_size = vocab_size or model.vocab_size  # the target's; embedding tables may be padded
        self.cache = make_rows(model, rows, max_len, slack=max_gamma + 2)
        self.max_len = self.cache.max_len  # the model may cap it at its context length
        self.pending: dict[int, list[int]] = {}
        self.fed: dict[int, int] = {}  # slots written past the committed length in the row's current round
        self._stats: dict[int, ProposerStats] = {}

    def reset(self, rows: list[int], prompts: list[list[int]], target: Rows | None = None,
              hidden: list[Tensor | None] | None = None) -> None:
        prefill_rows(self.cache, rows, [draft_context(p[:-1], self.context) for p in prompts])  # one forward
        for row, prompt in zip(rows, prompts):
            self.pending[row], self.fed[row] = prompt[-1:], 0
            self._stats[row] = ProposerStats()  # count drafting only, not the prefill

    def propose(self, rows: list[int], gammas: list[int], sampling: list[SamplingParams],
                generators: list[torch.Generator], shapes: list[Shaper | None] | None = None) -> list[Proposal]:
        gammas = [min(g, self.max_len - self.cache.length(r) - len(self.pending[r]) - 1) for r, g in zip(rows, gammas)]
        drafted = draft_steps(self.cache, rows, [self.pending[r] for r in rows], gammas, sampling, generators,
                              self._stats, vocab_size=self.vocab_size, confidence=self.confidence, shapes=shapes)
        for r, n in zip(rows, drafted.fed):
            self.fed[r] = n
        return drafted.proposals

    def observe(self, row: int, outcome: Outcome) -> None:
        # The cache holds (uncommitted) pending + drafts[:gamma-1]. Keep pending + the accepted drafts that
        # were fed; whatever was emitted beyond that becomes the new pending.
        # Worked example, pending [a], gamma 3, drafts (x, y, z): fed [a, x, y].
        #   2 accepted, emitted [x, y, r] -> keep 3 ([a, x, y]), pending [r]
        #   3 accepted, emitted [x, y, z, b] -> keep 3, pending [z, b]
        # A round in which this row did not draft (fed 0) keeps nothing and queues all it emitted.
        keep = min(len(self.pending[row]) + outcome.num_accepted, self.fed[row])
        self.cache.commit(row, keep)
        self.pending[row] = (self.pending[row] + outcome.emitted)[keep:]
        self.fed[row] = 0

    def move(self, src: int, dst: int) -> None:
        self.cache.move(src, dst)
        for state in (self.pending, self.fed, self._stats):
            state[dst] = state.pop(src)

    def free(self, row: int) -> None:
        self.cache.free(row)
        for state in (self.pending, self.fed, self._stats):
            state.pop(row, None)

    def stats(self, row: int) -> ProposerStats:
        return self._stats[row]
