"""The pieces of a replicated server that need no cluster (verispec.server.replicas): a request through the app
in-process equals what the engine generates, conversations keep one key as they grow, the first token of a
stream is recognised (a retry is invisible before it), and the replicas' metrics merge into one valid exposition.
The replicas on Ray Serve themselves are tested in tests/test_ray_serve.py (slow)."""

from __future__ import annotations

import asyncio
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.test_server import MODEL, _load, dirs, reference, settings  # noqa: F401 (dirs: a fixture)
from verispec.server import create_app
from verispec.server.metrics import ServerMetrics
from verispec.server.replicas import HttpCall, before_any_token, call_app, conversation_key, merge_metrics


def _call(path: str, body: dict, headers: tuple = ()) -> HttpCall:
    return HttpCall("POST", path, b"", ((b"content-type", b"application/json"), *headers), json.dumps(body).encode())


async def _collect(app, call: HttpCall, stop_after: int | None = None) -> tuple[dict, list[bytes]]:
    start, chunks = None, []
    async for message in call_app(app, call):
        if message["type"] == "http.response.start":
            start = message
        elif message.get("body"):
            chunks.append(message["body"])
            if stop_after is not None and len(chunks) >= stop_after:
                break
    return start, chunks


def test_call_app_answers_as_the_server_does(dirs):  # noqa: F811
    models = _load(dirs)
    app = create_app(settings(), models=models)
    tok = models.target.tokenizer

    async def main() -> None:
        async with app.router.lifespan_context(app):
            prompt = "for a in b :"
            start, chunks = await _collect(app, _call("/v1/completions", {
                "model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0, "return_token_ids": True}))
            assert start["status"] == 200
            out = json.loads(b"".join(chunks))
            assert out["choices"][0]["token_ids"] == reference(models, tok.encode(prompt), 24)

            start, chunks = await _collect(app, _call("/v1/completions", {"model": "other", "prompt": "x"}))
            assert start["status"] == 404 and json.loads(b"".join(chunks))["error"]["code"] == "model_not_found"

            # a chat stream: role chunk first (no token yet), then tokens; leaving early frees the batch row
            body = {"model": MODEL, "messages": [{"role": "user", "content": "x = 1"}], "max_tokens": 40,
                    "temperature": 0, "stream": True, "ignore_eos": True}
            start, chunks = await _collect(app, _call("/v1/chat/completions", body), stop_after=3)
            assert start["status"] == 200 and before_any_token(chunks[0]) and not before_any_token(chunks[-1])
            for _ in range(200):
                if app.state.scheduler.state()["running"] == 0:
                    break
                await asyncio.sleep(0.01)
            assert app.state.scheduler.state()["running"] == 0

    asyncio.run(main())


def test_ignore_eos_decodes_max_tokens(dirs):  # noqa: F811
    models = _load(dirs)
    app = create_app(settings(), models=models)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            for ignore in (False, True):
                _, chunks = await _collect(app, _call("/v1/completions", {
                    "model": MODEL, "prompt": "return a + b", "max_tokens": 60, "temperature": 0,
                    "ignore_eos": ignore}))
                usage = json.loads(b"".join(chunks))["usage"]
                assert (usage["completion_tokens"] == 60) == ignore, usage

    asyncio.run(main())


def test_conversation_key():
    chat = "/v1/chat/completions"
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    later = first + [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "and then?"}]
    other = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "goodbye"}]
    key = conversation_key(chat, json.dumps({"messages": first}).encode(), {})
    assert key is not None
    assert conversation_key(chat, json.dumps({"messages": later, "stream": True}).encode(), {}) == key
    assert conversation_key(chat, json.dumps({"messages": other}).encode(), {}) != key
    assert conversation_key(chat, b"{not json", {}) is None
    assert conversation_key(chat, json.dumps({"messages": first}).encode(),
                            {"x-verispec-conversation": "abc"}) == "client:abc"
    done = "/v1/completions"
    long = "word " * 100
    assert conversation_key(done, json.dumps({"prompt": long}).encode(), {}) == \
        conversation_key(done, json.dumps({"prompt": long + "more"}).encode(), {})
    assert conversation_key(done, json.dumps({"prompt": "a"}).encode(), {}) != \
        conversation_key(done, json.dumps({"prompt": "b"}).encode(), {})
    assert conversation_key(done, json.dumps({"prompt": [1, 2, 3]}).encode(), {}) is not None
    assert conversation_key(done, json.dumps({"prompt": ""}).encode(), {}) is None


def test_before_any_token():
    def data(obj) -> bytes:
        return f"data: {json.dumps(obj)}\n\n".encode()

    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    token = {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}
    assert before_any_token(data(role))
    assert before_any_token(data(role) + data(role))
    assert not before_any_token(data(token))
    assert not before_any_token(data(role) + data(token))
    assert not before_any_token(data({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}))
    assert not before_any_token(data({"error": {"message": "x"}}))
    assert not before_any_token(b'{"choices": []}')  # a JSON body, not a stream
    assert not before_any_token(b"data: [DONE]\n\n")


def test_merge_metrics_labels_each_replica_and_stays_valid():
    a, b, own = ServerMetrics(), ServerMetrics(), ServerMetrics()
    a.record_round(drafted=4, accepted=3)
    b.record_round(drafted=4, accepted=1)
    b.record_round(drafted=2, accepted=2)
    a.ttft.observe(0.2)
    own.running.set(7)
    text = merge_metrics({"r1": a.render(), "r2": b.render()}, own.render()).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    accepted = {s.labels.get("replica"): s.value for s in families["verispec_spec_decode_num_accepted_tokens"].samples
                if s.name.endswith("_total")}
    assert accepted == {None: 0.0, "r1": 3.0, "r2": 3.0}
    per_pos = {(s.labels["replica"], s.labels["position"]): s.value
               for s in families["verispec_spec_decode_num_accepted_tokens_per_pos"].samples
               if s.name.endswith("_total") and "replica" in s.labels}
    assert per_pos == {("r1", "0"): 1, ("r1", "1"): 1, ("r1", "2"): 1, ("r2", "0"): 2, ("r2", "1"): 1}
    running = {s.labels.get("replica"): s.value for s in families["verispec_num_requests_running"].samples}
    assert running == {None: 7.0, "r1": 0.0, "r2": 0.0}
    buckets = [s for s in families["verispec_time_to_first_token_seconds"].samples
               if s.name.endswith("_count") and s.labels.get("replica") == "r1"]
    assert [s.value for s in buckets] == [1.0]
    helps = [line for line in text.splitlines() if line.startswith("# HELP verispec_num_requests_running ")]
    assert len(helps) == 1


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_conversation_key_never_raises_on_odd_bodies(path):
    for body in (b"", b"null", b"[]", b'{"messages": 3}', b'{"messages": [1, 2]}', b'{"prompt": {"a": 1}}',
                 b"\xff\xfe", b'{"prompt": [["x"]]}'):
        conversation_key(path, body, {})


def test_cli_refuses_ray_options_without_the_ray_backend(capsys):
    from verispec.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--target", "random:/nonexistent", "--replicas", "2"])
    assert "--replicas applies to --backend ray only" in capsys.readouterr().err
