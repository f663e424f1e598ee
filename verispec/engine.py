"""The one round: propose, verify in one target forward, commit, emit, for B rows at once.

    while rows are live:                                          # Batch.round
        drafts = proposer.propose(rows, gammas)                   # tokens + proposal probs q, per row
        logits = target.forward(rows, [pending] + drafts)         # ONE forward over every row
        result = verify(drafts, logits, q, sampling)              # pure function, all rows in one call
        commit 1 + accepted per row; proposer.observe(row, result)   # the rest of the slots are scratch
        stop rules; emit; metrics

A row's first round is a plain step: its proposer starts at the next one (a draft model's prefill would delay
the first token). `generate` and `stream` are B = 1 of it, `bench` runs `stream`, and the server's scheduler only
decides which requests join the batch (verispec.server.scheduler). Plain decoding is the same round with no proposer
(gamma = 0), so every speedup is measured against the same code. Invariant, per row: the target cache holds the
whole sequence except `pending`, its last token.

A row's failure (its proposer, its verification) is that row's alone: a failing proposer leaves the row to
continue target-only, and a row whose verification fails ends with the error while the others go on, with the
outputs they would have had without it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from verispec.batch import Rows, Tree, make_rows, prefill_rows, tree_layout
from verispec.grammar import Constraint, mask_logits
from verispec.metrics import RequestMetrics
from verispec.models.base import CausalLM
from verispec.prefix import PrefixCache
from verispec.proposers.base import Outcome, PerRow, Proposal, Proposer, SequenceProposer
from verispec.sampling import (
    Penalties, SamplingParams, Shaper, TokenLogprob, draft_paths, make_generator, penalize, token_logprobs,
)
from verispec.verify import ChainVerifier, TreeVerifier, verify, verify_chain, verify_tree

log = logging.getLogger("verispec.engine")

# Given all new token ids so far, return how many to keep if a stop sequence occurred, else None.
StopFn = Callable[[list[int]], "int | None"]
T = TypeVar("T")


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 128
    gamma: int = 4
    sampling: SamplingParams = SamplingParams()
    seed: int | None = None
    eos_ids: tuple[int, ...] = ()
    penalties: Penalties = Penalties()  # applied to the target at every verified position (sampling.penalize)
    logprobs: int | None = None  # None: none; k >= 0: each emitted token's, with the k most likely beside it

    def __post_init__(self) -> None:
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {self.gamma}")


@dataclass
class Generation:
    """Filled in while a sequence runs; complete once it has finished."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "length" | "eos" | "stop" | "error" | "cancelled"
    metrics: RequestMetrics | None = None
    error: BaseException | None = None  # why it ended, when finish_reason is "error"
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token id, where params.logprobs asks


@dataclass
class Sequence:
    """One live row of a Batch. `tag` is the caller's (the server keeps its request there)."""

    prompt: list[int]
    params: GenerationParams
    proposer: Proposer | None  # None: plain decoding, or drafting failed and the row went on target-only
    stop_fn: StopFn | None
    generator: torch.Generator
    result: Generation
    pending: int
    tag: Any = None
    fell_back: bool = False  # its proposer failed
    constraint: Constraint | None = None  # a grammar the output must follow (verispec.grammar)
    speculate: bool = True  # False: its proposer sits out the next rounds (the server's drift fallback)
    # The proposer starts after the first round (a plain step), so that its prefill (a draft model's: ~0.5 s of a
    # 300-token prompt) does not delay the first token; until then it holds nothing for this row.
    started: bool = False
    prefill_hidden: Any = None  # the target's last-block outputs over the prompt but its last token, for reset
    start_with: tuple[list[int], Any] | None = None  # after its first round: (what it emitted, the round's features)
    # with a prefix cache: the tokens its cache row holds and their features, stored there when it ends (a
    # conversation's next turn then prefills only what follows this answer)
    kept: list[int] | None = None
    kept_hidden: list[Any] | None = None  # None: the model gives no features

    @property
    def out(self) -> list[int]:
        return self.result.token_ids

    def shaper(self) -> Shaper | None:
        """Its penalties and grammar as a Shaper (None where it has neither): what the round applies to the
        target at every verified position, and hands the proposer for its drafts."""
        penalties, constraint = self.params.penalties, self.constraint
        if penalties.neutral and constraint is None:
            return None

        def shape(logits: torch.Tensor, path: list[int]) -> torch.Tensor:
            if not penalties.neutral:
                logits = penalize(logits[None], self.prompt, self.out, [path], penalties)[0]
            if constraint is not None:
                allowed = constraint.allowed(path)
                if allowed is not None:  # else an earlier draft breaks the grammar: this position is never reached
                    logits = mask_logits(logits, allowed)
            return logits

        return shape

    @property
    def metrics(self) -> RequestMetrics:
        assert self.result.metrics is not None
        return self.result.metrics


@dataclass(frozen=True)
class Step:
    """What one round did for one sequence: `new` tokens emitted; finished once seq.result.finish_reason is set."""

    seq: Sequence
    new: list[int]
    drafted: int
    accepted: int
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of `new`, where the sequence asks for them
    # the target's last-block outputs at the pending token and the accepted drafts, the features a feature-level
    # drafter reads (and `train-drafter` records); None where the model gives none
    hidden: torch.Tensor | None = None


def apply_stops(out: list[int], emitted: list[int], params: GenerationParams,
                stop_fn: StopFn | None) -> tuple[list[int], str | None]:
    """Which of a round's `emitted` tokens to keep, and why generation ends (or None): the end-of-sequence
    token first, then the length limit, then stop strings."""
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
    return new, reason


def extra_layout(g: int, proposal: Proposal) -> Tree:
    """The tree of one forward over [pending] + chain (g tokens, causal) + the proposal's extra tokens."""
    e = proposal.extra.numel()
    positions = torch.cat([torch.arange(g + 1), proposal.extra_positions.to(torch.long).cpu()])
    mask = torch.zeros(g + 1 + e, g + 1 + e, dtype=torch.bool)
    mask[: g + 1, : g + 1] = torch.ones(g + 1, g + 1, dtype=torch.bool).tril()
    mask[g + 1 :] = proposal.extra_mask.to(torch.bool).cpu()
    return Tree(positions=positions, mask=mask)


def per_row(fn: Callable[[list[int]], list[T]], idx: list[int],
            generators: list[torch.Generator] | None = None) -> list[T | BaseException]:
    """fn over all of `idx` at once; if that raises, over each alone (from the same random state, where fn draws
    from `generators`), so only the failing ones get their exception (a batch's failure must not cost the other
    rows anything)."""
    gens = generators if generators is not None else [None] * len(idx)
    states = [g.get_state() if g is not None else None for g in gens]
    try:
        return list(fn(idx))
    except Exception as e:  # noqa: BLE001
        if len(idx) == 1:
            return [e]
    out: list[T | BaseException] = []
    for i, g, state in zip(idx, gens, states):
        if g is not None:
            g.set_state(state)
        try:
            out.append(fn([i])[0])
        except Exception as e:  # noqa: BLE001 - this row alone
            out.append(e)
    return out


def _by_proposer(seqs: list[Sequence], idx: list[int]) -> list[tuple[Proposer, list[int]]]:
    """The rows idx grouped by their sequence's proposer (one call serves all of a proposer's rows), in order."""
    groups: dict[int, tuple[Proposer, list[int]]] = {}
    for i in idx:
        groups.setdefault(id(seqs[i].proposer), (seqs[i].proposer, []))[1].append(i)
    return list(groups.values())


@dataclass
class NewSequence:
    """Batch.add()'s arguments, for Batch.add_many."""

    prompt: list[int]
    params: GenerationParams
    proposer: Proposer | None = None
    stop_fn: StopFn | None = None
    tag: Any = None
    result: Generation | None = None
    constraint: Constraint | None = None


class Batch:
    """Up to `rows` sequences of one target, kept packed at cache rows 0 .. n-1, advanced together by round().

    max_len: prompt + new tokens of the longest sequence; slack: scratch slots past it that one forward may
    write (gamma + 1 drafts, a lookahead window: a window that does not fit is left out of that round).
    fall_back: a sequence whose proposer fails goes on target-only (a server's choice); else it ends with
    the error (a library call's: a broken proposer must not pass unnoticed). prefix: recent prompts' keys and
    values (verispec.prefix), so a prompt that begins like one of them prefills only the rest (a server's choice).
    """

    def __init__(self, target: CausalLM, rows: int, max_len: int, *, slack: int = 32,
                 verifier: ChainVerifier = verify_chain, tree_verifier: TreeVerifier = verify_tree,
                 fall_back: bool = False, prefix: PrefixCache | None = None) -> None:
        self.target: Rows = make_rows(target, rows, max_len, slack)
        self.prefix = prefix  # recent prompts' keys/values: a prompt that starts the same way prefills the rest
        self.verifier, self.tree_verifier, self.fall_back = verifier, tree_verifier, fall_back
        self.live: list[Sequence] = []  # index == cache row
        # exception types whose drafting failure was logged with its traceback: later ones get one line each, so
        # a failure that repeats every round cannot flood the log (a server blocked writing to a full stderr
        # pipe stalls every request: benchmarks/results/2026-11-25-xeon-amx-structured-output, run 5)
        self._traced: set[type] = set()

    @property
    def max_len(self) -> int:
        return self.target.max_len

    def add(self, prompt: list[int], params: GenerationParams, proposer: Proposer | None = None, *,
            stop_fn: StopFn | None = None, tag: Any = None, result: Generation | None = None,
            constraint: Constraint | None = None) -> Sequence:
        """Prefill a sequence into the next free row; `result` (default a new Generation) receives its ids,
        finish reason and metrics as they come; `constraint`: a grammar its output follows (one per sequence).
        Raises ValueError for a request that cannot run."""
        return self.add_many([NewSequence(prompt, params, proposer, stop_fn, tag, result, constraint)])[0]

    def add_many(self, news: list[NewSequence]) -> list[Sequence]:
        """add() of several sequences, prefilled together in one target forward (a caller that starts many at
        once: the law tests, the audit). Raises ValueError, before any prefill, if one of them cannot run."""
        if len(self.live) + len(news) > self.target.rows:
            raise ValueError(f"the batch is full ({self.target.rows} rows)")
        for new in news:
            if not new.prompt:
                raise ValueError("the prompt is empty")
            if len(new.prompt) + new.params.max_new_tokens > self.max_len:
                raise ValueError(f"prompt ({len(new.prompt)}) + max new tokens exceeds the model's context "
                                 f"({self.max_len})")
        rows = list(range(len(self.live), len(self.live) + len(news)))
        metrics = [RequestMetrics(gamma=n.params.gamma if n.proposer else 0, prompt_tokens=len(n.prompt))
                   for n in news]
        t0 = time.perf_counter()
        hidden = prefill_rows(self.target, rows, [n.prompt[:-1] for n in news], self.prefix)
        seconds = time.perf_counter() - t0  # each waited for all of it
        seqs = []
        for new, m, h in zip(news, metrics, hidden):
            result = new.result if new.result is not None else Generation()
            result.metrics = m
            m.prefill_seconds = seconds
            seq = Sequence(prompt=new.prompt, params=new.params, proposer=new.proposer, stop_fn=new.stop_fn,
                           generator=make_generator(new.params.seed, self.target.model.device), result=result,
                           pending=new.prompt[-1], tag=new.tag, constraint=new.constraint, prefill_hidden=h)
            if self.prefix is not None:
                seq.kept = list(new.prompt[:-1])
                seq.kept_hidden = [h] if h is not None else [] if not seq.kept else None
            self.live.append(seq)
            seqs.append(seq)
        return seqs

    def _start(self, proposer: Proposer, rows: list[int]) -> None:
        """Start `proposer` on these rows after their first round, in one reset (a draft model prefills them in one
        forward): each row's sequence is its prompt and what that round emitted, and the target's features cover
        all of it but the new pending token (the prompt's, then the round's). A row whose reset fails goes on
        target-only (or ends: fall_back), the others start."""
        seqs = [self.live[r] for r in rows]
        prompts, features = [], []
        for seq in seqs:
            assert seq.proposer is proposer and seq.start_with is not None
            emitted, hidden = seq.start_with
            before = seq.prefill_hidden
            seq.start_with, seq.prefill_hidden, seq.started = None, None, True
            prompts.append(seq.prompt + emitted)
            features.append(hidden if before is None else before if hidden is None else torch.cat([before, hidden]))

        def reset(ii: list[int]) -> list[None]:
            proposer.reset([rows[i] for i in ii], [prompts[i] for i in ii], self.target, [features[i] for i in ii])
            return [None] * len(ii)

        t0 = time.perf_counter()
        got = per_row(reset, list(range(len(rows))))
        seconds = time.perf_counter() - t0  # each waited for all of it
        for seq, row, outcome in zip(seqs, rows, got):
            if isinstance(outcome, BaseException):
                self._fall_back(seq, row, outcome)
            seq.metrics.proposer_prefill_seconds = seconds

    def remove(self, seq: Sequence, reason: str = "cancelled") -> None:
        """Take a sequence out of the batch (its request ended, or was cancelled)."""
        if seq.result.finish_reason is None:
            seq.result.finish_reason = reason
            seq.metrics.finish()
        row = self.live.index(seq)
        last = len(self.live) - 1
        if self.prefix is not None and seq.kept is not None and len(seq.kept) == self.target.length(row):
            self._keep(seq, row)
        if seq.proposer is not None and seq.started:
            seq.proposer.free(row)
        if row != last:  # keep live rows packed
            moved = self.live[last]
            self.target.move(last, row)
            if moved.proposer is not None and moved.started:
                moved.proposer.move(last, row)
            self.live[row] = moved
        self.live.pop()
        self.target.free(last)

    def _keep(self, seq: Sequence, row: int) -> None:
        """Store an ending row's cache (its prompt and answer) in the prefix cache."""
        assert self.prefix is not None and seq.kept is not None
        if len(seq.kept) < self.prefix.min_tokens:
            return
        hidden = torch.cat(seq.kept_hidden) if seq.kept_hidden else None
        snapshot, nbytes = self.target.snapshot(row)
        self.prefix.put(seq.kept, snapshot, hidden, nbytes)
        seq.kept, seq.kept_hidden = None, None

    def _fall_back(self, seq: Sequence, row: int, error: BaseException) -> None:
        assert seq.proposer is not None
        if not self.fall_back:
            self._fail(seq, error)
            return
        first = type(error) not in self._traced
        self._traced.add(type(error))
        log.warning("drafting failed for a sequence (%s: %s); it continues target-only", type(error).__name__, error,
                    exc_info=error if first else None)
        try:
            stats = seq.proposer.stats(row)
            seq.metrics.draft_forwards, seq.metrics.draft_seconds = stats.forwards, stats.seconds
            seq.proposer.free(row)
        except Exception:  # noqa: BLE001 - e.g. it failed before its row existed
            log.exception("could not read or free the failed proposer's row")
        seq.proposer, seq.fell_back = None, True

    def _fail(self, seq: Sequence, error: BaseException) -> None:
        log.error("a sequence failed: %r", error)
        seq.result.finish_reason, seq.result.error = "error", error
        seq.metrics.finish()

    def round(self, *, speculate: bool = True) -> list[Step]:
        """One round over every live sequence; finished ones leave the batch. speculate=False: no drafting."""
        for s in [s for s in self.live if s.result.finish_reason is not None]:  # e.g. its proposer failed at add
            self.remove(s)
        starting = [i for i, s in enumerate(self.live) if s.start_with is not None]  # their first round is out
        for proposer, rows in _by_proposer(self.live, starting):
            self._start(proposer, rows)
        seqs = list(self.live)
        target = self.target
        gammas = [min(s.params.gamma, s.params.max_new_tokens - len(s.out) - 1)
                  if speculate and s.speculate and s.started and s.proposer is not None
                  and s.result.finish_reason is None else 0 for s in seqs]  # a row whose proposer failed to start
        proposals: list[Proposal | None] = [None] * len(seqs)
        shapes = [s.shaper() for s in seqs]
        for proposer, idx in _by_proposer(seqs, [i for i, g in enumerate(gammas) if g > 0]):
            got = per_row(lambda ii: proposer.propose(ii, [gammas[i] for i in ii],
                                                      [seqs[i].params.sampling for i in ii],
                                                      [seqs[i].generator for i in ii], [shapes[i] for i in ii]),
                          idx, [seqs[i].generator for i in idx])
            for i, p in zip(idx, got):
                if isinstance(p, BaseException):
                    self._fall_back(seqs[i], i, p)
                else:
                    proposals[i] = p

        # One target forward over every row: [pending] + drafts (+ a lookahead window where it fits).
        chains, trees, drafts = [], [], []
        for i, (s, p) in enumerate(zip(seqs, proposals)):
            draft = p.tokens.cpu() if p is not None else torch.empty(0, dtype=torch.long)
            chain = [s.pending] + draft.tolist()
            tree = None
            if p is not None and p.parents is not None:  # a token tree, verified whole in this forward
                tree = tree_layout(p.parents.tolist())
            elif p is not None and p.extra is not None and p.extra.numel():
                if target.length(i) + len(chain) + p.extra.numel() <= target.capacity:
                    tree = extra_layout(len(chain) - 1, p)
                    chain += p.extra.tolist()
            drafts.append(draft)
            chains.append(chain)
            trees.append(tree)
        t0 = time.perf_counter()
        # (the last block's outputs come free with the logits: a feature-level drafter reads the accepted ones)
        logits, states = target.forward(list(range(len(seqs))), chains, trees=trees if any(trees) else None,
                                        hidden=True)
        if target.model.device.type == "cuda":
            torch.cuda.synchronize(target.model.device)
        share = (time.perf_counter() - t0) / len(seqs)
        extra_logits = [lg[d.numel() + 1 :] if t is not None else None for lg, d, t in zip(logits, drafts, trees)]
        logits = [lg[: d.numel() + 1] for lg, d in zip(logits, drafts)]

        # Verify every row in one call (rows whose verification fails end alone).
        t0 = time.perf_counter()
        qs = [p.q if p is not None else None for p in proposals]
        parents = [p.parents if p is not None else None for p in proposals]

        def shaped(i: int) -> torch.Tensor:
            """Row i's logits with its penalties and grammar, each position seeing the context it would have had
            (the output, then the drafts before it)."""
            shape = shapes[i]
            if shape is None:
                return logits[i]
            par = parents[i].tolist() if parents[i] is not None else None
            paths = draft_paths(drafts[i].tolist(), par)
            return torch.stack([shape(row, path) for row, path in zip(logits[i], paths)])

        got = per_row(lambda ii: verify([drafts[i] for i in ii], [shaped(i) for i in ii], [qs[i] for i in ii],
                                        [seqs[i].params.sampling for i in ii], [seqs[i].generator for i in ii],
                                        self.verifier, parents=[parents[i] for i in ii], tree=self.tree_verifier),
                      list(range(len(seqs))), [s.generator for s in seqs])
        verify_share = (time.perf_counter() - t0) / len(seqs)

        steps = []
        for i, (s, v) in enumerate(zip(seqs, got)):
            s.metrics.target_seconds += share
            s.metrics.verify_seconds += verify_share
            if s.result.finish_reason is not None:  # its proposer failed this round
                steps.append(Step(s, [], 0, 0))
                continue
            if isinstance(v, BaseException):
                self._fail(s, v)
                steps.append(Step(s, [], drafts[i].numel(), 0))
                continue
            n, emitted = v.num_accepted, v.emitted
            # pending + the accepted drafts (a tree's path, moved next to each other); the recovered/bonus token is
            # the new pending
            kept = [0] + [1 + node for node in v.path]  # forward positions of pending and the accepted drafts
            target.commit_path(i, kept)  # a chain's are 0 .. n: nothing moves
            hidden = states[i][kept] if states[i] is not None else None
            if s.kept is not None:
                s.kept += [s.pending] + emitted[:n]
                s.kept_hidden = None if s.kept_hidden is None or hidden is None else s.kept_hidden + [hidden]
            s.pending = emitted[-1]
            new, reason = apply_stops(s.out, emitted, s.params, s.stop_fn)
            if s.proposer is not None:
                if not s.started:
                    if reason is None:  # its first round: the proposer starts at the next, once this one's out
                        s.start_with = (emitted, hidden)
                else:
                    try:
                        s.proposer.observe(i, Outcome(n, emitted, extra_logits[i], v.path, hidden))
                    except Exception as e:  # noqa: BLE001 - the row goes on target-only
                        self._fall_back(s, i, e)
            if s.constraint is not None and reason is None:
                try:
                    s.constraint.advance(new)
                except Exception as e:  # noqa: BLE001 - this row alone
                    self._fail(s, e)
                    steps.append(Step(s, [], drafts[i].numel(), n))
                    continue
            lps = []
            if s.params.logprobs is not None and new:  # the target's own logits where each token was chosen
                lps = token_logprobs(logits[i][kept[: len(new)]], new, s.params.logprobs)
                s.result.logprobs.extend(lps)
            s.metrics.record_round(drafts[i].numel(), n, len(new))
            if s.proposer is not None and s.started:
                stats = s.proposer.stats(i)
                s.metrics.draft_forwards, s.metrics.draft_seconds = stats.forwards, stats.seconds
            s.out.extend(new)
            if reason is not None:
                s.result.finish_reason = reason
                s.metrics.finish()
            steps.append(Step(s, new, drafts[i].numel(), n, lps, hidden))
        for s in seqs:
            if s.result.finish_reason is not None:
                self.remove(s)
        return steps


def as_proposer(proposer: Proposer | SequenceProposer | None) -> Proposer | None:
    """A SequenceProposer instance serves one sequence; the round speaks to proposers by row."""
    if isinstance(proposer, SequenceProposer):
        return PerRow(lambda: proposer)
    return proposer


def stream(
    target: CausalLM,
    prompt: list[int],
    params: GenerationParams,
    proposer: Proposer | SequenceProposer | None = None,
    *,
    result: Generation | None = None,
    stop_fn: StopFn | None = None,
    verifier: ChainVerifier = verify_chain,
    tree_verifier: TreeVerifier = verify_tree,
    constraint: Constraint | None = None,
) -> Iterator[list[int]]:
    """Yield the new tokens of each round of one sequence (a Batch of one row); `result` receives ids, finish
    reason and metrics. A proposer built for one row (strategies.make_proposer's default) serves it."""
    if not prompt:
        raise ValueError("the prompt is empty")
    # Scratch for the widest verification forward (gamma + 1 tokens, +1 spare); a lookahead window fits where the
    # remaining length leaves room, and is left out of the last rounds otherwise.
    batch = Batch(target, 1, len(prompt) + params.max_new_tokens, slack=params.gamma + 2, verifier=verifier,
                  tree_verifier=tree_verifier)
    seq = batch.add(prompt, params, as_proposer(proposer), stop_fn=stop_fn, result=result, constraint=constraint)
    while batch.live:
        for step in batch.round():
            if step.new:
                yield step.new
    if seq.result.error is not None:
        raise seq.result.error


def generate(
    target: CausalLM,
    prompt: list[int],
    params: GenerationParams,
    proposer: Proposer | SequenceProposer | None = None,
    **kwargs,
) -> Generation:
    result = Generation()
    for _ in stream(target, prompt, params, proposer, result=result, **kwargs):
        pass
    return result
