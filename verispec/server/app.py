"""The OpenAI-compatible HTTP app: FastAPI in front of one Scheduler.

`create_app` takes either loaded models (tests inject tiny ones) or a `load` function that runs in a
background thread after the server starts listening, so /health can answer 503 while weights load.
Everything the app owns (scheduler, metrics registry, state) lives on `app.state`: two apps in one process
never share anything.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from verispec.defaults import DEFAULT_STRATEGY
from verispec.engine import GenerationParams
from verispec.grammar import Constraint, GrammarCompiler
from verispec.models.llama import LlamaModel
from verispec.models.load import LoadedModel
from verispec.proposers.base import Outcome, Proposal, Proposer, ProposerStats
from verispec.sampling import Penalties, SamplingParams
from verispec.server.drift import DriftWatch
from verispec.server.metrics import ServerMetrics
from verispec.server.scheduler import Delta, Done, Event, Failed, Request, Scheduler, SchedulerConfig, TokenInfo
from verispec.server.schemas import (
    APIError, ChatRequest, CompletionRequest, error_body, validation_error_body,
)
from verispec.strategies import STRATEGIES, StrategyOptions, check_options, make_proposer, verify_cost_of

log = logging.getLogger("verispec.server")


@dataclass(frozen=True)
class ServerSettings:
    model_name: str = "verispec"  # the id clients send as `model` and /v1/models lists
    strategy: str = DEFAULT_STRATEGY  # for requests that name none (the `strategy` extension field)
    gamma: int = 4
    api_key: str | None = None
    max_concurrency: int = 8  # batch rows
    max_prompt_tokens: int = 2048
    max_new_tokens_limit: int = 512
    speculate_max_batch: int = 8
    prefix_cache_mb: int = 256  # recent prompts' keys/values: a prompt that starts the same way prefills the rest
    batch_draft: bool = True  # False: proposers run request by request (the comparison in the README)
    options: StrategyOptions = field(default_factory=StrategyOptions)
    # Limits checked before any work, so that no request can stall the others:
    max_body_bytes: int = 4 * 2**20
    max_prompt_chars: int | None = None  # text to tokenize; None: 32 characters per allowed prompt token
    body_timeout: float = 30.0  # seconds for the whole body to arrive once the headers have
    allow_special_tokens: bool = False  # raw completion prompts may spell control tokens (chat text never may)
    # drift watch (verispec.server.drift): window of rounds, the alpha fall that warns, plain decoding while
    # speculation does not pay, the baseline alpha per strategy (from a tune config; else the first window)
    drift_window: int = 200
    drift_drop: float = 0.05
    drift_fallback: bool = True
    drift_baseline: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose from {', '.join(STRATEGIES)}")
        for name in ("gamma", "max_concurrency", "max_prompt_tokens", "max_new_tokens_limit", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1")
        if self.max_prompt_chars is not None and self.max_prompt_chars < 1:
            raise ValueError("max-prompt-chars must be at least 1")
        if not self.body_timeout > 0:
            raise ValueError("body-timeout must be positive")
        if not 1 <= self.gamma <= 14:
            raise ValueError("gamma must be in [1, 14]")
        if self.speculate_max_batch < 0:
            raise ValueError("speculate-max-batch must be >= 0 (0 never speculates)")
        if self.prefix_cache_mb < 0:
            raise ValueError("prefix-cache-mb must be >= 0 (0 keeps no prompts)")
        if self.drift_window < 1 or not 0 < self.drift_drop < 1:
            raise ValueError("drift-window must be >= 1 and drift-drop in (0, 1)")

    @property
    def prompt_char_limit(self) -> int:
        return self.max_prompt_chars or 32 * self.max_prompt_tokens


@dataclass
class Models:
    target: LoadedModel
    draft: LoadedModel | None = None


def build_scheduler(models: Models, settings: ServerSettings, metrics: ServerMetrics) -> Scheduler:
    """Check the models fit the server and wire target, proposers and cache rows together."""
    target, draft = models.target, models.draft
    if not isinstance(target.model, LlamaModel):
        raise ValueError("the server batches requests on the native Llama-family model (llama/qwen2/mistral); "
                         f"{target.name} is not one")
    max_len = min(settings.max_prompt_tokens + settings.max_new_tokens_limit,
                  target.model.cfg.max_position_embeddings)
    config = SchedulerConfig(max_batch=settings.max_concurrency, max_len=max_len,
                             speculate_max_batch=settings.speculate_max_batch,
                             prefix_cache_bytes=settings.prefix_cache_mb * 2**20)
    if STRATEGIES[settings.strategy].needs_draft and draft is None:
        raise ValueError(f"strategy {settings.strategy!r} needs a draft model")

    def proposer_for(strategy: str) -> Proposer | None:
        proposer = make_proposer(strategy, target, draft, max_len, settings.options, rows=settings.max_concurrency,
                                 max_gamma=config.max_gamma + 2)
        return proposer if settings.batch_draft or proposer is None else OneRowAtATime(proposer)

    drift = DriftWatch(window=settings.drift_window, drop=settings.drift_drop, fall_back=settings.drift_fallback,
                       baselines=settings.drift_baseline, verify_cost=verify_cost_of(target.model),
                       probe_every=max(20, settings.drift_window // 2), probe=max(5, settings.drift_window // 10))
    scheduler = Scheduler(target.model, target.tokenizer, proposer_for, config, metrics, drift)
    scheduler.proposer(settings.strategy)  # the default strategy is built (and its options checked) at start-up
    # the chat template renders through transformers' tokenizer, loaded on first use: load it now, not inside
    # the first chat request (which would hold the tokenizer lock for ~2 s while other rows wait to decode)
    target.tokenizer.has_chat_template  # noqa: B018 - loads it
    return scheduler


class OneRowAtATime:
    """A proposer whose rows draft one after another, never batched (what the server's batching is measured
    against)."""

    def __init__(self, inner: Proposer) -> None:
        self.inner = inner

    def reset(self, rows: list[int], prompts: list[list[int]], target=None, hidden=None) -> None:
        for i, (row, prompt) in enumerate(zip(rows, prompts)):
            self.inner.reset([row], [prompt], target, None if hidden is None else [hidden[i]])

    def propose(self, rows, gammas, sampling, generators, shapes=None) -> list[Proposal]:
        shapes = shapes or [None] * len(rows)
        return [self.inner.propose([r], [g], [s], [gen], [sh])[0]
                for r, g, s, gen, sh in zip(rows, gammas, sampling, generators, shapes)]

    def observe(self, row: int, outcome: Outcome) -> None:
        self.inner.observe(row, outcome)

    def move(self, src: int, dst: int) -> None:
        self.inner.move(src, dst)

    def free(self, row: int) -> None:
        self.inner.free(row)

    def stats(self, row: int) -> ProposerStats:
        return self.inner.stats(row)


class _ApiKey:
    """Pure ASGI middleware: /v1/* needs `Authorization: Bearer <key>` (checked before the body is read)."""

    def __init__(self, app, key: str | None) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send) -> None:
        if self.key is not None and scope["type"] == "http" and scope["path"].startswith("/v1"):
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"").decode("latin-1")
            if given != f"Bearer {self.key}":
                message = "missing API key" if not given else "invalid API key"
                response = JSONResponse(error_body(message, "invalid_request_error", None, "invalid_api_key"), 401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(settings: ServerSettings, *, models: Models | None = None,
               load: Callable[[], Models] | None = None,
               on_load_failure: Callable[[BaseException], None] | None = None) -> FastAPI:
    """An app serving `models`, or the result of `load()` (run in a thread once the app starts)."""
    if (models is None) == (load is None):
        raise ValueError("give exactly one of models and load")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = app.state
        if models is not None:
            _ready(state, models)
        else:
            threading.Thread(target=_load_in_background, args=(state,), daemon=True, name="verispec-load").start()
        yield
        if state.scheduler is not None:
            state.scheduler.stop()

    def _ready(state, loaded: Models) -> None:
        scheduler = build_scheduler(loaded, settings, state.metrics)
        scheduler.start()
        state.models, state.scheduler, state.status = loaded, scheduler, "ok"

    def _load_in_background(state) -> None:
        try:
            _ready(state, load())
        except BaseException as e:  # noqa: BLE001
            state.status = "failed"
            log.error("loading the models failed: %s", e)
            if on_load_failure is not None:
                on_load_failure(e)

    app = FastAPI(title="verispec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.settings = settings
    app.state.metrics = ServerMetrics()
    app.state.scheduler = None
    app.state.models = None
    app.state.grammar, app.state.grammar_lock = None, threading.Lock()  # GrammarCompiler, built on first use
    app.state.status = "loading"
    app.add_middleware(_ApiKey, key=settings.api_key)
    _add_error_handlers(app)
    _add_routes(app)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: HTTPRequest, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_error_body(list(exc.errors())), status_code=400)

    @app.exception_handler(APIError)
    async def _api(request: HTTPRequest, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: HTTPRequest, exc: StarletteHTTPException) -> JSONResponse:
        message = {404: "no such endpoint", 405: "method not allowed"}.get(exc.status_code, "request failed")
        return JSONResponse(error_body(message, "invalid_request_error", None, None), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: HTTPRequest, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(error_body("internal server error", "server_error", None, None), status_code=500)


# ---- request -> prompt ids + params --------------------------------------------------------------------------


def _check_ready(app: FastAPI) -> Scheduler:
    if app.state.scheduler is None:
        loading = app.state.status == "loading"
        raise APIError(503, "the models are still loading" if loading else "the models failed to load",
                       type_="service_unavailable", code="model_loading" if loading else "model_load_failed")
    return app.state.scheduler


def _check_model(name: str | None, settings: ServerSettings) -> None:
    if name is not None and name != settings.model_name:
        raise APIError(404, f"the model {name!r} does not exist; this server serves {settings.model_name!r}",
                       param="model", code="model_not_found")


Body = TypeVar("Body", bound=BaseModel)


def _json_body(model: type[Body]) -> Callable[[HTTPRequest], Awaitable[Body]]:
    """A dependency giving the request body as `model`: read within the size and time limits, parsed as JSON
    whatever its content type (`curl -d` says form-encoded), validated off the event loop."""

    async def parse(http: HTTPRequest) -> Body:
        raw = await read_body(http, http.app.state.settings)
        try:
            return await asyncio.to_thread(model.model_validate_json, raw)
        except ValidationError as e:
            raise RequestValidationError(e.errors(include_url=False, include_input=False)) from None

    return parse


async def read_body(http: HTTPRequest, settings: ServerSettings) -> bytes:
    """The body, refused (413) as soon as it is known to exceed the limit: by its declared length before a byte
    is read, else once the bytes read pass it; 408, closing the connection, if it does not arrive in time."""
    limit = settings.max_body_bytes

    def too_large(size: str) -> APIError:
        return APIError(413, f"the request body is {size} bytes; this server accepts at most {limit}",
                        code="request_too_large")

    declared = http.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(declared)
    body = bytearray()
    try:
        async with asyncio.timeout(settings.body_timeout):
            async for chunk in http.stream():
                body += chunk
                if len(body) > limit:
                    raise too_large(f"more than {limit}")
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {settings.body_timeout:g} s",
                       code="request_timeout", headers={"Connection": "close"}) from None
    except ClientDisconnect:
        raise APIError(400, "the client closed the connection before the body ended", code="incomplete_body",
                       headers={"Connection": "close"}) from None
    return bytes(body)


async def _prompt_ids(app: FastAPI, body: CompletionRequest | ChatRequest) -> list[int]:
    """Tokenize in a worker thread (a long prompt must not stall the event loop), after the length check."""
    settings: ServerSettings = app.state.settings
    chars = body.text_length()
    if chars > settings.prompt_char_limit:
        param = "messages" if isinstance(body, ChatRequest) else "prompt"
        raise APIError(400, f"the prompt text is {chars} characters; this server accepts at most "
                            f"{settings.prompt_char_limit}", param=param, code="context_length_exceeded")

    def encode() -> list[int]:
        with app.state.scheduler.tokenizer_lock:
            return _encode(app.state.models.target.tokenizer, body, settings.allow_special_tokens)

    return await asyncio.to_thread(encode)


def _encode(tok, body: CompletionRequest | ChatRequest, allow_special: bool) -> list[int]:
    param = "messages" if isinstance(body, ChatRequest) else "prompt"
    try:
        if isinstance(body, ChatRequest):
            ids = tok.chat(body.chat_messages())
        elif isinstance(body.prompt, str):
            ids = tok.encode(body.prompt, special=allow_special)
        else:
            ids = list(body.prompt)
            bad = [i for i in ids if not 0 <= i < len(tok)]
            if bad:
                raise APIError(400, f"prompt: token id {bad[0]} is outside the vocabulary [0, {len(tok)})",
                               param="prompt", code="invalid_token_id")
    except ValueError as e:  # no chat template; text this tokenizer can only encode as control tokens
        raise APIError(400, f"{param}: {e}", param=param, code="invalid_value") from None
    if not ids:
        raise APIError(400, f"{param}: the prompt is empty after tokenization", param=param, code="invalid_value")
    return ids


def _params(app: FastAPI, body: CompletionRequest | ChatRequest, prompt: list[int], scheduler: Scheduler,
            ) -> GenerationParams:
    settings: ServerSettings = app.state.settings
    param = "messages" if isinstance(body, ChatRequest) else "prompt"
    if len(prompt) > settings.max_prompt_tokens:
        raise APIError(400, f"the prompt has {len(prompt)} tokens; this server accepts at most "
                            f"{settings.max_prompt_tokens}", param=param, code="context_length_exceeded")
    room = scheduler.max_len - len(prompt)
    max_tokens = body.max_tokens
    if max_tokens is None:
        max_tokens = min(settings.max_new_tokens_limit, room)
        if max_tokens < 1:
            raise APIError(400, "the prompt leaves no room for new tokens in the model's context",
                           param=param, code="context_length_exceeded")
    elif max_tokens > settings.max_new_tokens_limit:
        raise APIError(400, f"max_tokens is {max_tokens}; this server allows at most "
                            f"{settings.max_new_tokens_limit}", param="max_tokens", code="invalid_value")
    elif max_tokens > room:
        raise APIError(400, f"the prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the "
                            f"context of {scheduler.max_len} tokens", param="max_tokens",
                       code="context_length_exceeded")
    sampling = SamplingParams(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p)
    tok = app.state.models.target.tokenizer
    bias = tuple((int(k), v) for k, v in (body.logit_bias or {}).items())
    bad = [t for t, _ in bias if t >= len(tok)]
    if bad:
        raise APIError(400, f"logit_bias: token id {bad[0]} is outside the vocabulary [0, {len(tok)})",
                       param="logit_bias", code="invalid_token_id")
    penalties = Penalties(repetition=body.repetition_penalty, frequency=body.frequency_penalty,
                          presence=body.presence_penalty, logit_bias=bias)
    return GenerationParams(max_new_tokens=max_tokens, gamma=settings.gamma, sampling=sampling, seed=body.seed,
                            eos_ids=() if body.ignore_eos else tok.eos_ids, penalties=penalties, logprobs=body.top_logprobs_wanted())


async def _constraint(app: FastAPI, body: CompletionRequest | ChatRequest) -> Constraint | None:
    """The request's response_format as a grammar state, compiled in a worker thread (the tokenizer's grammar
    view is built on the first such request: about a second for a 150k-token vocabulary)."""
    spec = body.response_format.grammar() if body.response_format is not None else None
    if spec is None:
        return None

    def build() -> Constraint:
        with app.state.grammar_lock:
            if app.state.grammar is None:
                target = app.state.models.target
                app.state.grammar = GrammarCompiler(target.tokenizer, target.model.vocab_size, target.tokenizer.eos_ids)
        return app.state.grammar.constraint(spec)

    try:
        return await asyncio.to_thread(build)
    except ValueError as e:
        raise APIError(400, f"response_format: {e}", param="response_format", code="invalid_value") from None


def _strategy(app: FastAPI, body: CompletionRequest | ChatRequest) -> str:
    """The request's `strategy` (an extension field), else the server's."""
    name = body.strategy or app.state.settings.strategy
    if name not in STRATEGIES:
        raise APIError(400, f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}", param="strategy",
                       code="invalid_value")
    if STRATEGIES[name].needs_draft and app.state.models.draft is None:
        raise APIError(400, f"strategy {name!r} needs a draft model, and this server has none", param="strategy",
                       code="invalid_value")
    try:
        check_options(name, app.state.settings.options)
    except ValueError as e:
        raise APIError(400, f"{e}; this server was started without it", param="strategy",
                       code="invalid_value") from None
    return name


# ---- routes ----------------------------------------------------------------------------------------------------


def _add_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health() -> JSONResponse:
        status = app.state.status
        return JSONResponse({"status": status}, status_code=200 if status == "ok" else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(app.state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def model_card() -> dict:
        return {"id": app.state.settings.model_name, "object": "model", "created": 0, "owned_by": "verispec"}

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str) -> dict:
        _check_model(model_id, app.state.settings)
        return model_card()

    @app.get("/v1/state")
    async def state() -> dict:
        """Scheduler occupancy (extension): running / waiting requests and batch rows in use."""
        scheduler = _check_ready(app)
        return scheduler.state()

    @app.post("/v1/completions")
    async def completions(body: Annotated[CompletionRequest, Depends(_json_body(CompletionRequest))],
                          http: HTTPRequest) -> Response:
        return await _serve(app, http, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: Annotated[ChatRequest, Depends(_json_body(ChatRequest))],
                               http: HTTPRequest) -> Response:
        return await _serve(app, http, body, chat=True)


async def _serve(app: FastAPI, http: HTTPRequest, body: CompletionRequest | ChatRequest, *, chat: bool) -> Response:
    scheduler = _check_ready(app)
    _check_model(body.model, app.state.settings)
    prompt = await _prompt_ids(app, body)
    params = _params(app, body, prompt, scheduler)
    strategy = _strategy(app, body)
    constraints = [await _constraint(app, body) for _ in range(body.n)]
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
    requests = []
    for i, constraint in enumerate(constraints):  # n choices: n sequences, seeded seed, seed + 1, ...

        def sink(event: Event, i: int = i) -> None:  # called on the scheduler thread
            loop.call_soon_threadsafe(events.put_nowait, (i, event))

        seed = None if params.seed is None else (params.seed + i) % 2**63
        requests.append(Request(prompt=prompt, params=dataclasses.replace(params, seed=seed), sink=sink,
                                stop=body.stop, strategy=strategy, constraint=constraint,
                                route="chat" if chat else "completions"))
    for request in requests:
        scheduler.submit(request)
    ids = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    shape = _Shape(id=ids, created=int(time.time()), model=app.state.settings.model_name, chat=chat,
                   token_ids=body.return_token_ids, logprobs=params.logprobs is not None)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_sse(shape, events, requests, include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        choices = [_Choice() for _ in requests]
        done: dict[int, Done] = {}
        while len(done) < len(requests):
            try:
                i, event = await asyncio.wait_for(events.get(), timeout=0.5)
            except TimeoutError:
                if await http.is_disconnected():
                    return Response(status_code=499)
                continue
            if isinstance(event, Delta):
                choices[i].add(event)
            elif isinstance(event, Failed):
                raise APIError(500, event.message, type_="server_error")
            else:
                done[i] = event
        return JSONResponse(shape.full(choices, [done[i] for i in range(len(requests))]))
    finally:
        for request in requests:
            request.cancel()  # a no-op once finished; frees the row if the handler is left early


@dataclass
class _Choice:
    """One choice's text, token ids and logprobs as they arrive."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenInfo] = field(default_factory=list)

    def add(self, delta: Delta) -> None:
        self.text.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs or [])


def _usage(usages: list[dict]) -> dict:
    """The request's usage over its choices: the prompt once, completion tokens and drafting summed."""
    if len(usages) == 1:
        return usages[0]
    specs = [u["speculative"] for u in usages]
    completion = sum(u["completion_tokens"] for u in usages)
    drafted, accepted = sum(s["draft_tokens"] for s in specs), sum(s["accepted_tokens"] for s in specs)
    forwards = sum(s["target_forwards"] for s in specs)
    # tokens per round over every choice's rounds (each choice's target forwards less its prefill)
    rounds = [(s["mean_accepted_length"], s["target_forwards"] - int(u["prompt_tokens"] > 1))
              for s, u in zip(specs, usages) if s["mean_accepted_length"] is not None]
    total = sum(r for _, r in rounds)
    prompt = usages[0]["prompt_tokens"]
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "speculative": {"strategy": specs[0]["strategy"],
                            "alpha": round(accepted / drafted, 4) if drafted else None,
                            "mean_accepted_length": round(sum(m * r for m, r in rounds) / total, 4) if total else None,
                            "target_forwards": forwards, "draft_tokens": drafted,
                            "accepted_tokens": accepted, "draft_fallback": any(s["draft_fallback"] for s in specs)}}


@dataclass(frozen=True)
class _Shape:
    """OpenAI response bodies for one request (completion or chat, full or chunk, n choices)."""

    id: str
    created: int
    model: str
    chat: bool
    token_ids: bool
    logprobs: bool = False

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def logprobs_of(self, infos: list[TokenInfo], offset: int = 0) -> dict[str, Any] | None:
        """A choice's `logprobs` in OpenAI's shape for this endpoint (None where not asked for); offset: the
        characters of completion text before these tokens (the legacy shape's text_offset)."""
        if not self.logprobs:
            return None
        if self.chat:
            def entry(text: str, lp: float) -> dict[str, Any]:
                return {"token": text, "logprob": lp, "bytes": list(text.encode())}
            content = [{**entry(t.text, t.logprob), "top_logprobs": [entry(a, v) for a, v in t.top]} for t in infos]
            return {"content": content, "refusal": None}
        offsets = []
        for t in infos:
            offsets.append(offset)
            offset += len(t.text)
        return {"tokens": [t.text for t in infos], "token_logprobs": [t.logprob for t in infos],
                "top_logprobs": [dict(t.top) for t in infos], "text_offset": offsets}

    def full(self, choices: list[_Choice], done: list[Done]) -> dict[str, Any]:
        out = []
        for i, (c, d) in enumerate(zip(choices, done)):
            text, lp = "".join(c.text), self.logprobs_of(c.logprobs)
            if self.chat:
                message = {"role": "assistant", "content": text, "refusal": None}  # OpenAI's shape, echoed back
                choice = {"index": i, "message": message, "logprobs": lp, "finish_reason": d.finish_reason}
            else:
                choice = {"index": i, "text": text, "logprobs": lp, "finish_reason": d.finish_reason}
            if self.token_ids:
                choice["token_ids"] = c.token_ids
            out.append(choice)
        return {**self._head(False), "choices": out, "usage": _usage([d.usage for d in done])}

    def chunk(self, index: int, text: str | None, token_ids: list[int] | None, finish_reason: str | None,
              role: bool = False, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs,
                                      "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        if self.token_ids and token_ids is not None:
            choice["token_ids"] = token_ids
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, usage: dict) -> dict[str, Any]:
        return {**self._head(True), "choices": [], "usage": usage}


def _data(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


async def _sse(shape: _Shape, events: asyncio.Queue, requests: list[Request],
               include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events: a role chunk per choice (chat), text chunks, each choice's finish chunk, usage (if
    asked), then [DONE].

    A failure after the stream has begun cannot change the status code any more: it is sent as an error
    chunk, followed by [DONE]. Leaving this generator early (client gone) cancels the request, and the
    scheduler frees its batch rows at its next step.
    """
    try:
        if shape.chat:
            for i in range(len(requests)):
                yield _data(shape.chunk(i, "", [], None, role=True))
        offsets = [0] * len(requests)  # completion characters of each choice's tokens sent so far (text_offset)
        usages: dict[int, dict] = {}
        while len(usages) < len(requests):
            i, event = await events.get()
            if isinstance(event, Delta):
                lp = shape.logprobs_of(event.logprobs, offsets[i]) if event.logprobs else None
                offsets[i] += sum(len(t.text) for t in event.logprobs or [])
                if event.text or shape.token_ids or lp:
                    yield _data(shape.chunk(i, event.text, event.token_ids, None, logprobs=lp))
            elif isinstance(event, Failed):
                yield _data(error_body(event.message, "server_error", None, None))
                break
            else:
                yield _data(shape.chunk(i, None if shape.chat else "", None, event.finish_reason))
                usages[i] = event.usage
        else:
            if include_usage:
                yield _data(shape.usage_chunk(_usage([usages[i] for i in range(len(requests))])))
        yield _data("[DONE]")
    finally:
        for request in requests:
            request.cancel()
