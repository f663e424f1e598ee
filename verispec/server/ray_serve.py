"""`verispec serve --backend ray`: verispec replicas behind one OpenAI-compatible endpoint, on Ray Serve.

    Ingress         the HTTP entry, behind Ray Serve's proxy: reads the body within the server's limits, hands the
                    request to a replica, retries it once on another replica if its replica died before a token
                    reached the client (and ends it with a 503 error envelope if it died after), answers /health
                    (replicas ready / total) and /metrics (every replica's, labelled replica="...")
    Replica         one verispec engine with its own batched rounds: the single-process app
                    (verispec.server.app) run in-process through ASGI, its models loaded before it takes a request
    AffinityRouter  Ray Serve's request router for the replicas: a conversation's requests go to the replica that
                    served it while that replica has a free batch row, else to the least loaded one

Ray Serve places the replicas, replaces one that dies, and scales between bounds when asked to. Ray is an
optional extra (`pip install -e '.[ray]'`); nothing else in verispec imports this module.
"""

import asyncio
import json
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import ray
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from verispec.server.app import Models, ServerSettings, create_app, read_body
from verispec.server.replicas import HttpCall, before_any_token, call_app, conversation_key, merge_metrics
from verispec.server.schemas import APIError, error_body

log = logging.getLogger("verispec.server")

APP = "verispec"
INGRESS = "Ingress"
REPLICA = "Replica"
REPLICA_HEADER = b"x-verispec-replica"  # on every response: which replica answered
BEAT_SECONDS = 1.0  # how often a replica reports to the ingress; missing 3 in a row makes it not ready
_LIVE_STATES = ("STARTING", "UPDATING", "RECOVERING", "RUNNING")


@dataclass(frozen=True)
class Beat:
    """What a replica tells the ingress every second: that it lives, where, and its metrics."""

    replica: str
    node: str
    pid: int
    running: int
    waiting: int
    metrics: bytes


class AffinityRouter(RequestRouter):
    """The conversation's replica first (the base class takes it if it has a free row), then the least loaded of
    all (the base class probes their queue lengths and takes the lowest)."""

    def initialize_state(self, max_conversations: int = 100_000) -> None:
        self._owners: OrderedDict[str, ReplicaID] = OrderedDict()
        self._max_conversations = max_conversations

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        key = pending_request.kwargs.get("affinity") if pending_request is not None else None
        owner = self._owners.get(key) if key else None
        first = [r for r in candidate_replicas if r.replica_id == owner]
        return [first, candidate_replicas] if first else [candidate_replicas]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        key = pending_request.kwargs.get("affinity")
        if key:
            self._owners[key] = replica_id
            self._owners.move_to_end(key)
            if len(self._owners) > self._max_conversations:
                self._owners.popitem(last=False)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        for key in [k for k, r in self._owners.items() if r == replica_id]:
            del self._owners[key]


@serve.deployment(name=REPLICA)
class Replica:
    """One verispec engine. Its models load in the constructor, so Ray Serve routes to it only once it can
    answer, and a replacement replica takes requests only once it is ready."""

    async def __init__(self, load: Callable[[], Models], settings: ServerSettings, threads: int,
                       log_level: str = "info") -> None:
        torch.set_num_threads(threads)
        logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
        self.app = create_app(settings, models=await asyncio.to_thread(load))
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()
        context = serve.get_replica_context()
        self.id = context.replica_id.unique_id
        self._ingress = serve.get_deployment_handle(INGRESS, app_name=context.app_name)
        self._node = socket.gethostname()
        self._beating = asyncio.get_running_loop().create_task(self._beat())
        log.info("replica %s ready (pid %d, %d threads)", self.id, os.getpid(), threads)

    async def _beat(self) -> None:
        while True:
            state = self.app.state.scheduler.state()
            beat = Beat(self.id, self._node, os.getpid(), int(state.get("running", 0)), int(state.get("waiting", 0)),
                        self.app.state.metrics.render())
            try:
                await self._ingress.report.remote(beat)
            except Exception as e:  # noqa: BLE001 - the ingress restarting; the next beat reaches it
                log.debug("heartbeat to the ingress failed: %s", e)
            await asyncio.sleep(BEAT_SECONDS)

    async def handle(self, call: HttpCall, affinity: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """The app's ASGI messages for `call`, the response naming this replica (X-Verispec-Replica);
        `affinity` is the router's, not read here."""
        async for message in call_app(self.app, call):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER, self.id.encode())]}
            yield message

    def __del__(self) -> None:
        scheduler = getattr(getattr(self, "app", None), "state", None)
        if scheduler is not None and scheduler.scheduler is not None:
            scheduler.scheduler.stop()


class _IngressMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "verispec_ingress_"
        self.retries = Counter(p + "retries", "Requests retried on another replica after theirs died before "
                               "a token reached the client", registry=r)
        self.unavailable = Counter(p + "replica_unavailable", "Requests answered with the 503 envelope because "
                                   "their replica died (after a token, or on the retry too)", registry=r)
        self.ready = Gauge(p + "replicas_ready", "Replicas that reported in the last 3 seconds", registry=r)
        self.total = Gauge(p + "replicas_total", "Replicas Ray Serve is running or starting", registry=r)


# Ray Serve pickles a deployment's class where it is decorated: what its methods use is defined above it.
_http = FastAPI(title="verispec on Ray Serve", docs_url=None, redoc_url=None, openapi_url=None)


@_http.exception_handler(APIError)
async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _unavailable(message: str) -> dict[str, Any]:
    return error_body(message, "service_unavailable", None, "replica_unavailable")


async def _head(stream: DeploymentResponseGenerator) -> tuple[dict[str, Any], list[bytes], bool]:
    """The response start and the body chunks up to the first that shows the client a token (or the end):
    (start, chunks, whether more follow). Until then a retry on another replica is invisible to the client."""
    start = await stream.__anext__()
    held: list[bytes] = []
    async for message in stream:
        if message["type"] != "http.response.body":
            continue
        held.append(message.get("body", b""))
        if not message.get("more_body", False):
            return start, held, False
        if message.get("body") and not before_any_token(message["body"]):
            return start, held, True
    return start, held, False


@serve.deployment(name=INGRESS, max_ongoing_requests=10_000, ray_actor_options={"num_cpus": 0})
@serve.ingress(_http)
class Ingress:
    def __init__(self, replicas: DeploymentHandle, settings: ServerSettings) -> None:
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")  # retries and failures: warnings
        self.replicas = replicas.options(stream=True)
        self.settings = settings
        self.beats: dict[str, tuple[float, Beat]] = {}
        self.metrics = _IngressMetrics()

    async def report(self, beat: Beat) -> None:
        self.beats[beat.replica] = (time.monotonic(), beat)

    def _ready(self) -> list[Beat]:
        now = time.monotonic()
        for replica in [r for r, (t, _) in self.beats.items() if now - t > 60]:
            del self.beats[replica]  # gone for a minute: replaced, or scaled down
        return [b for t, b in self.beats.values() if now - t <= 3 * BEAT_SECONDS]

    async def _total(self) -> int:
        def count() -> int:
            status = serve.status().applications[APP].deployments[REPLICA]
            return sum(n for state, n in status.replica_states.items() if str(state).split(".")[-1] in _LIVE_STATES)

        try:
            return await asyncio.to_thread(count)
        except Exception:  # noqa: BLE001 - the controller busy; what reported is a lower bound
            return len(self.beats)

    @_http.get("/health")
    async def health(self) -> JSONResponse:
        ready, total = self._ready(), await self._total()
        self.metrics.ready.set(len(ready))
        self.metrics.total.set(total)
        body = {"status": "ok" if ready else "loading", "replicas": {
            "ready": len(ready), "total": max(total, len(ready)),
            "list": [{"id": b.replica, "node": b.node, "pid": b.pid, "running": b.running, "waiting": b.waiting}
                     for b in sorted(ready, key=lambda b: b.replica)]}}
        return JSONResponse(body, status_code=200 if ready else 503)

    @_http.get("/metrics")
    async def metrics(self) -> Response:
        ready = self._ready()
        self.metrics.ready.set(len(ready))
        self.metrics.total.set(await self._total())
        text = merge_metrics({b.replica: b.metrics for b in ready}, generate_latest(self.metrics.registry))
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @_http.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def forward(self, path: str, request: Request) -> Response:
        """To a replica; once more to another if the first died before the client saw a token."""
        body = await read_body(request, self.settings) if request.method in ("POST", "PUT", "PATCH") else b""
        key = conversation_key(request.url.path, body, request.headers)
        call = HttpCall(request.method, request.url.path, request.url.query.encode(), tuple(request.headers.raw),
                        body)
        for attempt in (1, 2):
            stream: DeploymentResponseGenerator = self.replicas.handle.remote(call, affinity=key)
            try:
                start, held, more = await _head(stream)
            except RayActorError as e:
                stream.cancel()
                if attempt == 1:
                    self.metrics.retries.inc()
                    log.warning("a replica died before answering %s %s; retrying on another (%s)",
                                request.method, request.url.path, type(e).__name__)
                    continue
                self.metrics.unavailable.inc()
                return JSONResponse(_unavailable("the replica serving this request stopped, and so did the one it "
                                                 "was retried on; try again shortly"), status_code=503)
            except Exception:
                stream.cancel()
                log.exception("a replica failed on %s %s", request.method, request.url.path)
                return JSONResponse(error_body("internal server error", "server_error", None, None), 500)
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start.get("headers", [])
                       if k.lower() not in (b"content-length", b"transfer-encoding")}
            if not more:
                return Response(b"".join(held), status_code=start["status"], headers=headers)
            return StreamingResponse(self._rest(stream, held), status_code=start["status"], headers=headers)
        raise AssertionError("unreachable")

    async def _rest(self, stream: DeploymentResponseGenerator, held: list[bytes]) -> AsyncIterator[bytes]:
        """The held chunks, then the rest; if the replica dies now the client has seen tokens, so the stream
        ends with an error event (the status was sent long ago), never silently short."""
        try:
            for chunk in held:
                yield chunk
            async for message in stream:
                if message["type"] == "http.response.body" and message.get("body"):
                    yield message["body"]
        except RayActorError:
            self.metrics.unavailable.inc()
            error = _unavailable("the replica serving this request stopped after it had streamed tokens; the "
                                 "answer is incomplete (503)")
            yield f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode()
        finally:
            stream.cancel()


@dataclass(frozen=True)
class RayOptions:
    replicas: int = 1
    min_replicas: int | None = None  # both bounds given: autoscale between them on ongoing requests
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None  # per replica, for autoscaling (default: half its batch rows)
    replica_cpus: float | None = None  # default: the cluster's CPUs / replicas
    replica_gpus: float = 0.0
    address: str | None = None  # None: start a local Ray instance; "auto": join the running cluster
    host: str = "127.0.0.1"
    port: int = 8000


def deployment_options(options: RayOptions, settings: ServerSettings, cluster_cpus: float) -> tuple[dict, int]:
    """Ray Serve options of the Replica deployment, and the torch threads of each replica. Raises ValueError
    where the cluster cannot hold the replicas asked for (Ray would wait for them for ever)."""
    autoscale = options.min_replicas is not None or options.max_replicas is not None
    low = options.min_replicas if autoscale else options.replicas
    high = options.max_replicas if autoscale else options.replicas
    if low is None or high is None:
        raise ValueError("give both --min-replicas and --max-replicas to autoscale")
    if not 1 <= low <= high:
        raise ValueError(f"need 1 <= min replicas <= max replicas, got {low} and {high}")
    cpus = options.replica_cpus if options.replica_cpus is not None else max(1.0, cluster_cpus // high)
    if cpus <= 0 or options.replica_gpus < 0:
        raise ValueError("--replica-cpus must be positive and --replica-gpus >= 0")
    if low * cpus > cluster_cpus:
        raise ValueError(f"{low} replicas of {cpus:g} CPUs do not fit the cluster's {cluster_cpus:g} CPUs "
                         "(fewer --replicas, or --replica-cpus)")
    out: dict[str, Any] = {
        "max_ongoing_requests": settings.max_concurrency,  # one per batch row; more wait at the router
        "ray_actor_options": {"num_cpus": cpus, "num_gpus": options.replica_gpus},
        "request_router_config": RequestRouterConfig(request_router_class=AffinityRouter),
    }
    if autoscale:
        target = options.target_ongoing_requests or max(1.0, settings.max_concurrency / 2)
        out["autoscaling_config"] = {"min_replicas": low, "max_replicas": high, "target_ongoing_requests": target}
    else:
        out["num_replicas"] = low
    return out, max(1, int(cpus))


def deploy(load: Callable[[], Models], settings: ServerSettings, options: RayOptions, log_level: str = "info",
           ) -> None:
    """Start (or join) Ray, start Serve's HTTP proxy and deploy the app; returns once every replica is ready.
    `load` runs in each replica (it must pickle: a module-level function, or a partial of one)."""
    if not ray.is_initialized():
        ray.init(address=options.address, include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False)
    cluster_cpus = float(ray.cluster_resources().get("CPU", 0))
    replica, threads = deployment_options(options, settings, cluster_cpus)
    serve.start(http_options={"host": options.host, "port": options.port})
    app = Ingress.bind(Replica.options(**replica).bind(load, settings, threads, log_level), settings)
    serve.run(app, name=APP, route_prefix="/", blocking=False)


def shutdown() -> None:
    serve.shutdown()
    ray.shutdown()
