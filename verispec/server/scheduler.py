"""One worker thread owns the models and runs every active request's speculative round together.

    loop:
        admit queued requests into free batch rows (prefill each: target row + draft row)
        free the rows of cancelled requests (client gone)
        round:  drafts for all speculating rows (batched)            -> proposals
                ONE target forward over every row, right-padded        -> logits per row
                per row: verify (pure, verispec.verify) -> commit -> observe -> stop rules -> emit

A round is the engine's loop (verispec/engine.py) applied to n rows at once; each row keeps its own
cache length, pending token, generator and stop state, so what a request produces does not depend on
what runs beside it (greedy: identical to `verispec generate`, up to floating-point rounding of a batched
matmul; a lone request runs the model's own single-sequence forward and is bit-identical).

Speculation turns off for a round when more than `speculate_max_batch` rows are active: with a full batch
the target forward is no longer nearly free to widen, and drafting only adds cost. Rows keep their draft
state (`pending` grows) and catch up when speculation resumes.

Events go back to the request through `Request.sink`, called on this thread; the app makes it a
thread-safe handoff into an asyncio queue. Live rows are kept packed at 0 .. n-1 (see verispec.batch).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from verispec.batch import BatchKVCache, forward_rows
from verispec.engine import GenerationParams
from verispec.metrics import RequestMetrics
from verispec.models.llama import LlamaModel
from verispec.models.tokenizer import TextStream, Tokenizer
from verispec.sampling import argmax, logits_to_probs, make_generator
from verispec.server.drafting import BatchProposer
from verispec.server.metrics import ServerMetrics
from verispec.verify import verify_chain, verify_greedy

log = logging.getLogger("verispec.server")


# ---- what flows between the app and the worker -------------------------------------------------------------


@dataclass(frozen=True)
class Delta:
    text: str
    token_ids: list[int]


@dataclass(frozen=True)
class Done:
    finish_reason: str  # OpenAI's: "stop" (end of turn or a stop string) | "length"
    usage: dict


@dataclass(frozen=True)
class Failed:
    message: str  # safe to show a client: no paths, no traceback


Event = Delta | Done | Failed


@dataclass
class Request:
    prompt: list[int]
    params: GenerationParams
    sink: Callable[[Event], None]
    stop: list[str] = field(default_factory=list)
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class _Sequence:
    """A request admitted into a batch row. Target cache row invariant: everything except `pending`."""

    request: Request
    pending: int
    text: TextStream
    generator: torch.Generator
    metrics: RequestMetrics
    speculating: bool
    out: list[int] = field(default_factory=list)
    fell_back: bool = False
    first_token_at: float | None = None

    @property
    def params(self) -> GenerationParams:
        return self.request.params


def apply_stops(out: list[int], emitted: list[int], params: GenerationParams,
                stop_fn: Callable[[list[int]], int | None] | None) -> tuple[list[int], str | None]:
    """The engine's stop rules for one round: which of `emitted` to keep, and why generation ends (or None).

    Same order as verispec.engine.stream: end-of-sequence token, then the length limit, then stop strings.
    """
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


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int = 8  # rows: requests decoded at once; more wait in the queue
    max_len: int = 4096  # prompt + new tokens of one request (capped at the model's context)
    speculate_max_batch: int = 8  # above this many active rows, rounds run without drafting


class Scheduler:
    def __init__(self, target: LlamaModel, tokenizer: Tokenizer, proposer: BatchProposer | None,
                 config: SchedulerConfig, metrics: ServerMetrics) -> None:
        self.target, self.tokenizer, self.proposer = target, tokenizer, proposer
        # The app encodes prompts on the event loop while this thread decodes: one user of the tokenizer at a time.
        self.tokenizer_lock = threading.Lock()
        self.config, self.metrics = config, metrics
        self.gamma_slack = 16
        self.cache = BatchKVCache(target, config.max_batch, config.max_len, slack=self.gamma_slack)
        self.active: list[_Sequence] = []  # index == batch row
        self.queue: queue.Queue[Request] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="verispec-scheduler", daemon=True)

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def submit(self, request: Request) -> None:
        if request.params.gamma + 2 > self.gamma_slack:
            raise ValueError(f"gamma must be at most {self.gamma_slack - 2}")
        self.queue.put(request)
        self.metrics.waiting.set(self.queue.qsize())

    def state(self) -> dict:
        return {"running": len(self.active), "waiting": self.queue.qsize(),
                "rows_in_use": sum(1 for n in self.cache.lengths if n), "max_batch": self.config.max_batch}

    # ---- the worker ------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._admit()
                self._drop_cancelled()
                if not self.active:
                    self._wait_for_work()
                    continue
                self._round()
            except Exception:  # noqa: BLE001 - the server must outlive any request
                log.exception("round failed; failing the requests in it")
                self._fail_all("internal error while generating")
        self._fail_all("the server is shutting down")

    def _fail_all(self, message: str) -> None:
        try:
            for i in reversed(range(len(self.active))):
                self._finish(i, None, failure=message)
        except Exception:  # noqa: BLE001 - last resort: forget every row rather than let the worker die
            log.exception("could not finish the failed requests cleanly")
            self.active.clear()
            self.cache.lengths[:] = [0] * self.cache.rows
            self.metrics.running.set(0)

    def _wait_for_work(self) -> None:
        try:
            request = self.queue.get(timeout=0.05)
        except queue.Empty:
            return
        self._start(request)

    def _admit(self) -> None:
        while len(self.active) < self.config.max_batch:
            try:
                request = self.queue.get_nowait()
            except queue.Empty:
                break
            self._start(request)
        self.metrics.waiting.set(self.queue.qsize())

    def _start(self, request: Request) -> None:
        """Prefill a request into the next free row (the model's own forward: as `verispec generate` does)."""
        if request.cancelled.is_set():
            self.metrics.requests.labels(finish_reason="cancelled").inc()
            return
        row = len(self.active)
        try:
            seq = self._prefill(row, request)
        except Exception:  # noqa: BLE001
            log.exception("prefill failed")
            self.cache.free(row)
            request.sink(Failed("internal error while reading the prompt"))
            self.metrics.requests.labels(finish_reason="error").inc()
            return
        if self.proposer is not None:
            try:
                self.proposer.add(row, request.prompt, len(request.prompt) + seq.params.max_new_tokens
                                  + seq.params.gamma + 2)
            except Exception:  # noqa: BLE001
                self._fall_back(seq, row)
        self.active.append(seq)
        self.metrics.prompt_tokens.inc(len(request.prompt))
        self.metrics.running.set(len(self.active))

    def _prefill(self, row: int, request: Request) -> _Sequence:
        prompt, params = request.prompt, request.params
        metrics = RequestMetrics(gamma=params.gamma if self.proposer else 0, prompt_tokens=len(prompt))
        self.cache.free(row)
        if len(prompt) > 1:
            t0 = time.perf_counter()
            x = torch.tensor([prompt[:-1]], dtype=torch.long, device=self.target.device)
            self.target.forward(x, self.cache.row(row), last_n=1)
            self.cache.commit(row, len(prompt) - 1)
            metrics.prefill_seconds = time.perf_counter() - t0
        return _Sequence(request=request, pending=prompt[-1], text=TextStream(self.tokenizer, request.stop),
                         generator=make_generator(params.seed, self.target.device), metrics=metrics,
                         speculating=self.proposer is not None)

    def _fall_back(self, seq: _Sequence, row: int) -> None:
        log.warning("draft failed for a request; it continues target-only", exc_info=True)
        seq.speculating, seq.fell_back = False, True
        self.metrics.draft_failures.inc()
        if self.proposer is not None:
            self.proposer.free(row)

    def _drop_cancelled(self) -> None:
        for i in reversed(range(len(self.active))):
            if self.active[i].request.cancelled.is_set():
                self._finish(i, "cancelled")

    def _round(self) -> None:
        seqs, n = self.active, len(self.active)
        speculate = self.proposer is not None and n <= self.config.speculate_max_batch
        if self.proposer is not None and not speculate:
            self.metrics.speculation_off_rounds.inc()
        gammas = [min(s.params.gamma, s.params.max_new_tokens - len(s.out) - 1) if speculate and s.speculating
                  else 0 for s in seqs]
        drafts: list[list[int]] = [[] for _ in seqs]
        qs: list[torch.Tensor | None] = [None] * n
        rows = [i for i in range(n) if gammas[i] > 0]
        if rows:
            outcomes = self.proposer.propose(rows, [gammas[i] for i in rows],
                                             [seqs[i].params.sampling for i in rows],
                                             [seqs[i].generator for i in rows])
            for i, outcome in zip(rows, outcomes):
                if isinstance(outcome, BaseException):
                    self._fall_back(seqs[i], i)
                    continue
                drafts[i], qs[i] = outcome.tokens.tolist(), outcome.q
        chains = [[s.pending] + d for s, d in zip(seqs, drafts)]
        t0 = time.perf_counter()
        logits = self._target_forward(chains)
        share = (time.perf_counter() - t0) / n
        self.metrics.target_forwards.inc()
        self.metrics.batched_sequences.inc(n)
        finished: list[tuple[int, str]] = []
        for i, seq in enumerate(seqs):
            seq.metrics.target_seconds += share
            reason = self._verify_and_emit(i, seq, drafts[i], qs[i], logits[i])
            if reason is not None:
                finished.append((i, reason))
        for i, reason in reversed(finished):
            self._finish(i, reason)

    def _target_forward(self, chains: list[list[int]]) -> list[torch.Tensor]:
        if len(chains) == 1:  # exactly the engine's call
            x = torch.tensor([chains[0]], dtype=torch.long, device=self.target.device)
            return [self.target.forward(x, self.cache.row(0))[0]]
        return forward_rows(self.target, chains, self.cache)

    def _verify_and_emit(self, row: int, seq: _Sequence, draft: list[int], q: torch.Tensor | None,
                         logits: torch.Tensor) -> str | None:
        """The engine's round body for one row: verify, commit, observe, stop rules, emit."""
        device, sampling = logits.device, seq.params.sampling
        d = torch.tensor(draft, dtype=torch.long, device=device)
        g = len(draft)
        if sampling.greedy:
            verified = verify_greedy(d[None], argmax(logits)[None])
        else:
            p = logits_to_probs(logits, sampling)  # [g + 1, V]
            if q is None:  # a deterministic proposal (n-gram): one-hot q; g = 0 gives an empty q
                q = torch.zeros(g, p.shape[-1], device=device).scatter_(-1, d[:, None], 1.0)
            q = q.to(device)
            verified = verify_chain(d[None], p[None], q[None], seq.generator)
        accepted = int(verified.num_accepted[0])
        emitted = verified.tokens[0, : accepted + 1].tolist()
        self.cache.commit(row, accepted + 1)
        seq.pending = emitted[-1]
        if seq.speculating:
            try:
                self.proposer.observe(row, accepted, emitted)
            except Exception:  # noqa: BLE001
                self._fall_back(seq, row)
        with self.tokenizer_lock:
            new, reason = apply_stops(seq.out, emitted, seq.params, seq.text.stop_fn if seq.text.stop else None)
        seq.metrics.record_round(g, accepted, len(new))
        self.metrics.record_round(g, accepted)
        seq.out.extend(new)
        if new:
            if seq.first_token_at is None:
                seq.first_token_at = time.perf_counter()
                self.metrics.ttft.observe(seq.first_token_at - seq.request.arrival)
            self.metrics.generation_tokens.inc(len(new))
            with self.tokenizer_lock:
                delta = seq.text.push(new)
            seq.request.sink(Delta(delta, new))
        return reason

    def _finish(self, row: int, reason: str | None, failure: str | None = None) -> None:
        """Send the request its last event, free its rows, and keep live rows packed."""
        seq = self.active[row]
        now = time.perf_counter()
        seq.metrics.finish()
        if self.proposer is not None and seq.speculating:
            seq.metrics.draft_forwards, seq.metrics.draft_seconds = self.proposer.stats(row)
        try:
            if failure is not None:
                seq.request.sink(Failed(failure))
                self.metrics.requests.labels(finish_reason="error").inc()
            elif reason == "cancelled":
                self.metrics.requests.labels(finish_reason="cancelled").inc()
            else:
                tail = seq.text.flush()  # no decoding: the text is already there
                if tail:
                    seq.request.sink(Delta(tail, []))
                seq.request.sink(Done("length" if reason == "length" else "stop", self._usage(seq)))
                self.metrics.requests.labels(finish_reason=reason or "stop").inc()
                self.metrics.e2e.observe(now - seq.request.arrival)
                if seq.first_token_at is not None and len(seq.out) > 1:
                    self.metrics.per_token.observe((now - seq.first_token_at) / (len(seq.out) - 1))
        except Exception:  # noqa: BLE001 - a sink that fails must not stop the worker
            log.exception("could not deliver the last event")
        last = len(self.active) - 1
        if row != last:
            self.cache.move(last, row)
            if self.proposer is not None:
                self.proposer.move(last, row)
            self.active[row] = self.active[last]
        self.active.pop()
        self.cache.free(last)
        if self.proposer is not None:
            self.proposer.free(last)
        self.metrics.running.set(len(self.active))

    def _usage(self, seq: _Sequence) -> dict:
        m = seq.metrics
        return {
            "prompt_tokens": m.prompt_tokens,
            "completion_tokens": len(seq.out),
            "total_tokens": m.prompt_tokens + len(seq.out),
            "speculative": {
                "alpha": None if m.alpha is None else round(m.alpha, 4),
                "mean_accepted_length": None if m.mean_accepted_length is None else round(m.mean_accepted_length, 4),
                "target_forwards": m.rounds + int(m.prompt_tokens > 1),
                "draft_tokens": m.drafted,
                "accepted_tokens": m.accepted,
                "draft_fallback": seq.fell_back,
            },
        }
