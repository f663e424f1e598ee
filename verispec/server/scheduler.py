"""One worker thread owns the models and decides which requests share the engine's round.

    loop:
        admit queued requests into free batch rows (Batch.add_many: one prefill for all that start together)
        take out the rows of cancelled requests (client gone)
        Batch.round(): the engine's one round over every row (verispec.engine)
        hand each request its new text, and its last event when it finished

Drafting, the target forward, verification, commits, stop rules and per-row failure isolation are the round's
(the same code `verispec generate` runs), so what a request produces does not depend on what runs beside it
(greedy: identical to `verispec generate`, up to floating-point rounding of a batched matmul; a lone request
runs the model's own single-sequence forward and is bit-identical). Each request may name its strategy; one
proposer per strategy serves all rows that use it, batched where the strategy batches (a draft model runs all
its rows in one forward per step).

Speculation turns off for a round when more than `speculate_max_batch` rows are active: with a full batch
the target forward is no longer nearly free to widen, and drafting only adds cost. Rows keep their draft
state and catch up when speculation resumes.

Events go back to the request through `Request.sink`, called on this thread; the app makes it a
thread-safe handoff into an asyncio queue.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from verispec.engine import Batch, GenerationParams, NewSequence, Sequence, Step, per_row
from verispec.grammar import Constraint
from verispec.models.llama import LlamaModel
from verispec.models.tokenizer import TextStream, Tokenizer
from verispec.prefix import PrefixCache
from verispec.proposers.base import Proposer
from verispec.server.drift import DriftWatch, RoundSample
from verispec.server.metrics import ServerMetrics

log = logging.getLogger("verispec.server")


# ---- what flows between the app and the worker -------------------------------------------------------------


@dataclass(frozen=True)
class TokenInfo:
    """One emitted token's log-probability for a response's `logprobs`: its text, and its alternatives'."""

    text: str
    logprob: float
    top: list[tuple[str, float]]


@dataclass(frozen=True)
class Delta:
    text: str
    token_ids: list[int]
    logprobs: list[TokenInfo] | None = None  # one per token id, where the request asked for them


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
    strategy: str = "ar"
    route: str = "completions"  # the endpoint ("chat", "completions"): the drift watch keeps them apart
    constraint: Constraint | None = None  # a grammar its output follows (response_format)
    arrival: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class _Stream:
    """What the worker keeps for an admitted request beside its engine Sequence (Sequence.tag)."""

    request: Request
    text: TextStream
    first_token_at: float | None = None
    draft_s: float = 0.0  # the sequence's draft and target seconds at the last round (per-round deltas: drift)
    target_s: float = 0.0


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int = 8  # rows: requests decoded at once; more wait in the queue
    max_len: int = 4096  # prompt + new tokens of one request (capped at the model's context)
    speculate_max_batch: int = 8  # above this many active rows, rounds run without drafting
    max_gamma: int = 14  # the longest proposal a request may ask for
    scratch: int = 32  # cache slots past max_len one forward may write (gamma + 1 drafts, a lookahead window)
    prefix_cache_bytes: int = 0  # recent prompts' keys/values kept (verispec.prefix); 0: none


class Scheduler:
    def __init__(self, target: LlamaModel, tokenizer: Tokenizer, proposer_for: Callable[[str], Proposer | None],
                 config: SchedulerConfig, metrics: ServerMetrics, drift: DriftWatch | None = None) -> None:
        """proposer_for(strategy) builds the proposer that serves every row of that strategy (None: plain);
        it is called once per strategy, on the worker thread, when a request first asks for it. drift: watches
        acceptance per strategy and may have a strategy's rows decode plainly while speculation does not pay."""
        self.target, self.tokenizer, self.proposer_for = target, tokenizer, proposer_for
        self.drift = drift
        # The app encodes prompts in worker threads while this thread decodes: one user of the tokenizer at a time.
        self.tokenizer_lock = threading.Lock()
        self.config, self.metrics = config, metrics
        prefix = PrefixCache(config.prefix_cache_bytes) if config.prefix_cache_bytes else None
        self.batch = Batch(target, config.max_batch, config.max_len, slack=config.scratch, fall_back=True,
                           prefix=prefix)
        self.proposers: dict[str, Proposer | None] = {}
        self.queue: queue.Queue[Request] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="verispec-scheduler", daemon=True)

    @property
    def max_len(self) -> int:
        return self.batch.max_len

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def submit(self, request: Request) -> None:
        if request.params.gamma > self.config.max_gamma:
            raise ValueError(f"gamma must be at most {self.config.max_gamma}")
        self.queue.put(request)
        self.metrics.waiting.set(self.queue.qsize())

    def state(self) -> dict:
        return {"running": len(self.batch.live), "waiting": self.queue.qsize(),
                "rows_in_use": len(self.batch.live), "max_batch": self.config.max_batch}

    # ---- the worker ------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._admit()
                self._drop_cancelled()
                if not self.batch.live:
                    self._wait_for_work()
                    continue
                self._round()
            except Exception:  # noqa: BLE001 - the server must outlive any request
                log.exception("round failed; failing the requests in it")
                self._fail_all("internal error while generating")
        self._fail_all("the server is shutting down")

    def _fail_all(self, message: str) -> None:
        for seq in list(self.batch.live):
            try:
                self._send_last(seq, failure=message)
            except Exception:  # noqa: BLE001 - a sink that fails must not stop the worker
                log.exception("could not deliver the last event")
            try:
                self.batch.remove(seq, "error")
            except Exception:  # noqa: BLE001 - last resort: forget every row rather than let the worker die
                log.exception("could not free a failed request's row")
                self.batch.live.remove(seq)
        self.metrics.running.set(len(self.batch.live))

    def _wait_for_work(self) -> None:
        try:
            request = self.queue.get(timeout=0.05)
        except queue.Empty:
            return
        self._admit(request)

    def _admit(self, first: Request | None = None) -> None:
        """Start the queued requests that fit in the free rows; those admitted together (a burst, or a request's n
        choices) are prefilled in one target forward, and their proposers start together after their first round."""
        requests = [first] if first is not None else []
        while len(self.batch.live) + len(requests) < self.config.max_batch:
            try:
                requests.append(self.queue.get_nowait())
            except queue.Empty:
                break
        if requests:
            self._start(requests)
        self.metrics.waiting.set(self.queue.qsize())

    def proposer(self, strategy: str) -> Proposer | None:
        """The proposer that serves every row of `strategy` (built on first use)."""
        if strategy not in self.proposers:
            self.proposers[strategy] = self.proposer_for(strategy)
        return self.proposers[strategy]

    def _start(self, requests: list[Request]) -> None:
        """Prefill requests into the next free rows, together (the model's own forward where one starts alone: as
        `verispec generate` does). A joint prefill that fails is retried one request at a time, so a request that
        cannot be prefilled fails alone."""
        news = []
        for request in requests:
            if request.cancelled.is_set():
                self.metrics.requests.labels(finish_reason="cancelled").inc()
                continue
            try:
                proposer = self.proposer(request.strategy)
            except Exception as e:  # noqa: BLE001
                self._refuse(request, e)
                continue
            text = TextStream(self.tokenizer, request.stop)
            news.append(NewSequence(request.prompt, request.params, proposer,
                                    stop_fn=self._stop_fn(text) if request.stop else None,
                                    tag=_Stream(request, text), constraint=request.constraint))
        if not news:
            return
        prefix = self.batch.prefix
        hits, reused = (prefix.hits, prefix.reused_tokens) if prefix is not None else (0, 0)
        got = per_row(lambda ii: self.batch.add_many([news[i] for i in ii]), list(range(len(news))))
        for new, seq in zip(news, got):
            if isinstance(seq, BaseException):
                self._refuse(new.tag.request, seq)
                continue
            if seq.fell_back:
                self.metrics.draft_failures.inc()
            self.metrics.prompt_tokens.inc(len(seq.prompt))
        if prefix is not None:
            self.metrics.prefix_cache_hits.inc(prefix.hits - hits)
            self.metrics.prefix_cache_tokens.inc(prefix.reused_tokens - reused)
            self.metrics.prefix_cache_bytes.set(prefix.nbytes)
        self.metrics.running.set(len(self.batch.live))

    def _stop_fn(self, text: TextStream) -> Callable[[list[int]], int | None]:
        def stop_fn(ids: list[int]) -> int | None:  # decodes: one user of the tokenizer at a time
            with self.tokenizer_lock:
                return text.stop_fn(ids)

        return stop_fn

    def _refuse(self, request: Request, error: BaseException) -> None:
        log.error("prefill failed", exc_info=error)
        self.metrics.requests.labels(finish_reason="error").inc()
        request.sink(Failed("internal error while reading the prompt"))

    def _drop_cancelled(self) -> None:
        for seq in list(self.batch.live):
            if seq.tag.request.cancelled.is_set():
                self.batch.remove(seq, "cancelled")
                self.metrics.requests.labels(finish_reason="cancelled").inc()
        self.metrics.running.set(len(self.batch.live))

    def _round(self) -> None:
        n = len(self.batch.live)
        speculate = n <= self.config.speculate_max_batch
        if not speculate and any(s.proposer is not None for s in self.batch.live):
            self.metrics.speculation_off_rounds.inc()
        fell_back = sum(s.fell_back for s in self.batch.live)
        paused = set()
        if self.drift is not None:
            for seq in self.batch.live:
                if seq.proposer is None:  # plain decoding (ar), or its proposer failed
                    continue
                key = (seq.tag.request.strategy, seq.tag.request.route)
                seq.speculate = self.drift.speculating(key)
                if not seq.speculate:
                    paused.add(key)
        steps = self.batch.round(speculate=speculate)
        self.metrics.target_forwards.inc()
        self.metrics.batched_sequences.inc(n)
        self.metrics.draft_failures.inc(sum(s.seq.fell_back for s in steps) - fell_back)
        for step in steps:
            seq, stream = step.seq, step.seq.tag
            self.metrics.record_round(step.drafted, step.accepted)
            if self.drift is not None:
                self._watch(step)
            if step.new:
                if stream.first_token_at is None:
                    stream.first_token_at = time.perf_counter()
                    self.metrics.ttft.observe(stream.first_token_at - stream.request.arrival)
                self.metrics.generation_tokens.inc(len(step.new))
                infos = None
                with self.tokenizer_lock:
                    delta = stream.text.push(step.new)
                    if step.logprobs:
                        text = self.tokenizer.token_text
                        infos = [TokenInfo(text(lp.token), lp.logprob, [(text(t), v) for t, v in lp.top])
                                 for lp in step.logprobs]
                stream.request.sink(Delta(delta, step.new, infos))
            if seq.result.finish_reason is not None:
                try:
                    self._send_last(seq)
                except Exception:  # noqa: BLE001 - a sink that fails must not stop the worker
                    log.exception("could not deliver the last event")
        if self.drift is not None:
            for key in paused:
                self.drift.plain_round(key)
            self._drift_metrics()
        self.metrics.running.set(len(self.batch.live))

    def _watch(self, step: Step) -> None:
        """Hand a speculative round of one row to the drift watch, with the row's draft and target seconds."""
        assert self.drift is not None
        stream, m = step.seq.tag, step.seq.metrics
        target_s = m.target_seconds + m.verify_seconds
        draft_s, spent = m.draft_seconds - stream.draft_s, target_s - stream.target_s
        stream.draft_s, stream.target_s = m.draft_seconds, target_s
        if step.drafted and step.seq.result.finish_reason is None:  # a last round's stops cut what it emitted
            self.drift.record((stream.request.strategy, stream.request.route),
                              RoundSample(step.drafted, step.accepted, step.accepted + 1, draft_s, spent))

    def _drift_metrics(self) -> None:
        assert self.drift is not None
        for (strategy, route), figures in self.drift.snapshot().items():
            for key, gauge in (("alpha", self.metrics.drift_alpha), ("baseline", self.metrics.drift_baseline),
                               ("ratio", self.metrics.drift_ratio),
                               ("tokens_per_forward", self.metrics.drift_tokens_per_forward)):
                if figures[key] is not None:
                    gauge.labels(strategy=strategy, route=route).set(float(figures[key]))
            self.metrics.drift_fallback.labels(strategy=strategy, route=route).set(1.0 if figures["fallback"] else 0.0)

    def _send_last(self, seq: Sequence, failure: str | None = None) -> None:
        """The request's last event: Done with its usage, or Failed. Its metrics are recorded first, so that a
        scrape made as soon as the client has its answer counts it."""
        stream, result = seq.tag, seq.result
        if failure is None and result.finish_reason == "error":
            failure = "internal error while generating"
        if failure is not None:
            self.metrics.requests.labels(finish_reason="error").inc()
            stream.request.sink(Failed(failure))
            return
        now = time.perf_counter()
        reason = result.finish_reason
        self.metrics.requests.labels(finish_reason=reason).inc()
        self.metrics.e2e.observe(now - stream.request.arrival)
        if stream.first_token_at is not None and len(seq.out) > 1:
            self.metrics.per_token.observe((now - stream.first_token_at) / (len(seq.out) - 1))
        tail = stream.text.flush()  # no decoding: the text is already there
        if tail:
            stream.request.sink(Delta(tail, []))
        stream.request.sink(Done("length" if reason == "length" else "stop", self._usage(seq)))

    @staticmethod
    def _usage(seq: Sequence) -> dict:
        m = seq.metrics
        return {
            "prompt_tokens": m.prompt_tokens,
            "completion_tokens": len(seq.out),
            "total_tokens": m.prompt_tokens + len(seq.out),
            "speculative": {
                "strategy": seq.tag.request.strategy,
                "alpha": None if m.alpha is None else round(m.alpha, 4),
                "mean_accepted_length": None if m.mean_accepted_length is None else round(m.mean_accepted_length, 4),
                "target_forwards": m.rounds + int(m.prompt_tokens > 1),
                "draft_tokens": m.drafted,
                "accepted_tokens": m.accepted,
                "draft_fallback": seq.fell_back,
            },
        }
