"""What a server of several replicas needs beyond the single-process app, with no cluster runtime in it.

    call_app          one HTTP request through an ASGI app in this process, its messages as they come: each
                      replica answers with the app `verispec serve` runs (the same validation, auth, errors,
                      streaming), not a second copy of the API
    conversation_key  which requests belong to one conversation (the routing affinity)
    before_any_token  whether a response chunk still precedes the first token (a retry is still invisible)
    merge_metrics     every replica's Prometheus text as one exposition, each sample labelled replica="..."

`verispec.server.ray_serve` puts these on Ray Serve; they are tested here without it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

CONVERSATION_HEADER = "x-verispec-conversation"  # a client's own conversation id, if it sends one


@dataclass(frozen=True)
class HttpCall:
    """An HTTP request as bytes, to hand to another process."""

    method: str
    path: str
    query: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


async def call_app(app: Any, call: HttpCall) -> AsyncIterator[dict[str, Any]]:
    """Run `call` through the ASGI `app`; yield the ASGI messages it sends (response start, body chunks).

    Leaving the iteration early (the caller's client went away) tells the app the client disconnected, as a
    server would, so a streaming request frees its batch row."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": call.method,
             "scheme": "http", "path": call.path, "raw_path": call.path.encode(), "query_string": call.query,
             "root_path": "", "headers": list(call.headers), "client": ("replica-caller", 0),
             "server": ("replica", 0)}
    out: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    gone = asyncio.Event()
    body_sent = False

    async def receive() -> dict[str, Any]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": call.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await out.put(message)

    task = asyncio.create_task(app(scope, receive, send))
    task.add_done_callback(lambda _: out.put_nowait(None))
    try:
        while (message := await out.get()) is not None:
            yield message
        task.result()  # an error the app did not turn into a response
    finally:
        gone.set()
        if not task.done():
            try:
                await asyncio.wait_for(task, timeout=10)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()


def conversation_key(path: str, body: bytes, headers: Mapping[str, str]) -> str | None:
    """A key shared by the requests of one conversation: the client's `X-Verispec-Conversation` header, else
    what stays the same as a conversation grows (a chat's messages up to its first user message; the first
    256 characters or 64 token ids of a completion prompt). None where the body says nothing (or is invalid:
    the replica will answer it)."""
    given = headers.get(CONVERSATION_HEADER)
    if given:
        return "client:" + given
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(request, dict):
        return None
    if path.endswith("/chat/completions"):
        messages = request.get("messages")
        if not isinstance(messages, list):
            return None
        first = next((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"),
                     len(messages) - 1)
        head: Any = messages[:first + 1]
    else:
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        head = prompt[:256] if isinstance(prompt, str) else prompt[:64] if isinstance(prompt, list) else None
    if not head:
        return None
    return hashlib.sha256(json.dumps(head, sort_keys=True).encode()).hexdigest()[:20]


def before_any_token(chunk: bytes) -> bool:
    """True for a server-sent-events chunk that carries no token yet: the role chunks a chat stream opens
    with. Anything else (a token, a finish, an error, a JSON body) counts as the client having seen output."""
    try:
        text = chunk.decode()
    except UnicodeDecodeError:
        return False
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    if not events:
        return False
    for event in events:
        try:
            obj = json.loads(event)
        except ValueError:
            return False
        choices = obj.get("choices") if isinstance(obj, dict) else None
        if not choices or not all(isinstance(c, dict) and "role" in (c.get("delta") or {})
                                  and not (c["delta"].get("content")) for c in choices):
            return False
    return True


class _Families:
    """A collector over parsed metric families (what generate_latest renders)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def merge_metrics(replicas: Mapping[str, bytes], own: bytes = b"") -> bytes:
    """One Prometheus exposition of every replica's metrics, each sample labelled `replica`, after `own` (the
    ingress's metrics, unlabelled). Families keep one HELP/TYPE and all their samples together, as the text
    format requires."""
    families: dict[str, Metric] = {}
    sources = [(None, own)] + sorted(replicas.items())
    for replica, text in sources:
        for family in text_string_to_metric_families(text.decode()):
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            for s in family.samples:
                labels = dict(s.labels) if replica is None else {**s.labels, "replica": replica}
                merged.add_sample(s.name, labels, s.value, s.timestamp, s.exemplar)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)
