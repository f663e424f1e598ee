"""Property-based request bodies (hypothesis) against a live server on the tiny models (issue 16).

Bodies are built from the OpenAI fields with values that are right, wrong in type, null, huge, non-finite, at the
float extremes (T 5e-324, top_p 1e-300: valid, and poison for a naive sampler), plus unknown fields, bad roles
and content parts, and raw bytes: truncated JSON, invalid UTF-8, broken unicode escapes, NaN literals. Every
response must be a 200 (a stream ending in [DONE] with no error chunk) or a 4xx OpenAI envelope: never a 5xx,
never a hang. Meanwhile a greedy request runs again and again beside the fuzz and must keep its exact output.
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import httpx
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from tests.test_server import MODEL, PROMPTS, dirs, live, models, reference, settings, sse  # noqa: F401 - fixtures
from verispec.server import create_app

MAX_NEW = 8  # the server's limit: every accepted request stays short
EXAMPLES = 200

json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                        st.text(max_size=12))
json_value = st.recursive(json_scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                               st.dictionaries(st.text(max_size=6), inner,
                                                                               max_size=3)), max_leaves=6)
words = st.lists(st.sampled_from(["x", "(", "a", ")", ":", "print", "if", "=", "1", "<|im_end|>",
                                  "<|im_start|>", "\n", "é", "\u2028", "\U0001f600", "\x00"]),
                 min_size=0, max_size=8).map(" ".join)
stops = st.one_of(words, st.lists(words, max_size=4))

# Valid values, the float extremes included (a temperature of 5e-324 or a top_p of 1e-300 is valid: poison
# for a naive sampler, which must hurt no other request).
VALID = {
    "model": st.just(MODEL),
    "max_tokens": st.integers(1, MAX_NEW),
    "temperature": st.sampled_from([0, 0.0, -0.0, 5e-324, 1e-300, 1e-30, 1e-7, 0.5, 1, 2]),
    "top_p": st.sampled_from([5e-324, 1e-300, 1e-12, 0.5, 1]),
    "top_k": st.integers(-1, 2**40),
    "seed": st.integers(0, 2**63 - 1),
    "stop": stops,
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "n": st.sampled_from([1, 2]),
    "presence_penalty": st.sampled_from([0, 0.5, -2]),
    "frequency_penalty": st.sampled_from([0, 1.5]),
    "repetition_penalty": st.sampled_from([1, 1.2]),
    "logit_bias": st.sampled_from([{}, {"5": 10}, {"7": -100}]),
    "user": st.text(max_size=5),
    "strategy": st.sampled_from(["draft", "ngram", "ar", "lookahead", "draft+ngram", "layerskip", "adaptive"]),
    "return_token_ids": st.booleans(),
}
# Wrong values that look right: every one must be a 4xx naming its field.
WRONG = {
    "model": st.sampled_from(["gpt-4o", ""]),
    "max_tokens": st.sampled_from([0, -3, MAX_NEW + 1, 2**31, 10**30]),
    "temperature": st.sampled_from([-1e-300, 2.0000001, 1e308]),
    "top_p": st.sampled_from([0, -0.0, 1.0000001]),
    "top_k": st.just(-2),
    "seed": st.sampled_from([-1, 2**64]),
    "stop": st.lists(words, min_size=5, max_size=6),
    "n": st.sampled_from([0, 9]),
    "presence_penalty": st.sampled_from([2.5, -2.0001]),
    "repetition_penalty": st.sampled_from([0, -1]),
    "logit_bias": st.sampled_from([{"x": 1}, {"5": 1000}, {str(10**9): 1}]),
    "strategy": st.just("medusa"),
}


def fields(wrong: bool) -> dict[str, st.SearchStrategy]:
    """Optional fields: valid values, or (wrong=True) anything JSON can hold, wrong-looking values, unknown keys."""
    if not wrong:
        return VALID
    return {**{k: st.one_of(v, WRONG.get(k, v), json_value) for k, v in VALID.items()}, "frobnicate": json_value}


def text_parts(wrong: bool) -> st.SearchStrategy:
    kinds = st.sampled_from(["text", "image_url", "refusal"]) if wrong else st.just("text")
    return st.lists(st.fixed_dictionaries({"type": kinds, "text": words}), min_size=1, max_size=2)


def message(wrong: bool) -> st.SearchStrategy:
    roles = ["system", "developer", "user", "assistant"] + (["tool", "wizard"] if wrong else [])
    content = st.one_of(words, text_parts(wrong), *([json_value] if wrong else []))
    return st.fixed_dictionaries({"role": st.sampled_from(roles), "content": content},
                                 optional={"refusal": st.none(), "tool_calls": st.none(), "name": st.text(max_size=4)})


def completion(wrong: bool) -> st.SearchStrategy:
    prompt = st.one_of(words, st.lists(st.integers(-2 if wrong else 0, 30 if wrong else 24), min_size=1, max_size=6),
                       *([json_value, st.lists(words, max_size=2)] if wrong else []))
    extra = {"echo": st.one_of(st.booleans(), json_value), "suffix": words} if wrong else {"echo": st.just(False)}
    return st.fixed_dictionaries({"prompt": prompt}, optional={**fields(wrong), **extra})


def chat(wrong: bool) -> st.SearchStrategy:
    extra = {"tools": st.just([]), "max_completion_tokens": st.integers(1, MAX_NEW),
             "response_format": st.just({"type": "text"})}
    if wrong:
        extra = {k: st.one_of(v, json_value) for k, v in extra.items()}
    messages = st.lists(message(wrong), min_size=0 if wrong else 1, max_size=3)
    return st.fixed_dictionaries({"messages": st.one_of(messages, json_value) if wrong else messages},
                                 optional={**fields(wrong), **extra})


@st.composite
def raw_body(draw, obj: st.SearchStrategy) -> bytes:
    """The object as JSON, sometimes damaged at the byte level."""
    text = json.dumps(draw(obj), allow_nan=True)  # floats at the extremes stay as they are; NaN cannot occur here
    damage = draw(st.sampled_from(["none", "none", "none", "truncate", "bad utf-8", "bad escape", "nan", "bom"]))
    data = text.encode()
    if damage == "truncate":
        return data[: draw(st.integers(0, max(len(data) - 1, 0)))]
    if damage == "bad utf-8":
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"])) + data[at:]
    if damage == "bad escape":
        return text.replace('"', '"' + draw(st.sampled_from(["\\ud800", "\\udfff", "\\u12", "\\x41", "\\"])), 1
                            ).encode()
    if damage == "nan":
        return text.replace("{", '{"temperature": ' + draw(st.sampled_from(["NaN", "Infinity", "-Infinity",
                                                                            "1e999"])) + ", ", 1).encode()
    if damage == "bom":
        return b"\xef\xbb\xbf" + data
    return data


REQUESTS = st.one_of(*(st.tuples(st.just(path), raw_body(body(wrong)))
                       for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat))
                       for wrong in (False, True)))


def check(r: httpx.Response, streamed: bool) -> str:
    """A 200 (a stream ends in [DONE] with no error chunk) or a 4xx OpenAI envelope; the outcome's name."""
    if r.status_code == 200:
        if streamed:
            events = sse(r.iter_lines())
            assert events and events[-1] == "[DONE]", events[-3:]
            assert not any(isinstance(e, dict) and "error" in e for e in events), events
        else:
            r.read()
            assert r.json()["choices"], r.text
        return "200"
    r.read()
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    return f"{r.status_code} {err['code']}"


def test_fuzzed_bodies_get_200_or_a_4xx_envelope_and_hurt_no_greedy_request(models, capsys):
    tok = models.target.tokenizer
    greedy_prompt = tok.encode(PROMPTS[3])
    want = reference(models, greedy_prompt, MAX_NEW)
    outcomes: Counter[str] = Counter()
    beside: list[bool] = []
    stop = threading.Event()
    app = create_app(settings(max_new_tokens_limit=MAX_NEW), models=models)
    with live(app) as base:

        def greedy_beside() -> None:
            with httpx.Client(base_url=base, timeout=30) as c:
                while not stop.is_set():
                    r = c.post("/v1/completions", json={"model": MODEL, "prompt": greedy_prompt, "temperature": 0,
                                                        "max_tokens": MAX_NEW, "return_token_ids": True})
                    beside.append(r.status_code == 200 and r.json()["choices"][0]["token_ids"] == want)

        neighbour = threading.Thread(target=greedy_beside)
        neighbour.start()
        try:
            with httpx.Client(base_url=base, timeout=httpx.Timeout(10)) as c:

                @hsettings(max_examples=EXAMPLES, deadline=None, database=None,
                           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
                @given(REQUESTS)
                def one(request: tuple[str, bytes]) -> None:
                    path, body = request
                    with c.stream("POST", path, content=body, headers={"Content-Type": "application/json"}) as r:
                        outcomes[check(r, r.headers.get("content-type", "").startswith("text/event-stream"))] += 1

                one()
        finally:
            stop.set()
            neighbour.join(timeout=30)
    with capsys.disabled():
        print(f"\nfuzz: {sum(outcomes.values())} requests: " + ", ".join(f"{k}: {v}" for k, v in
                                                                    sorted(outcomes.items())) +
              f"; greedy beside: {sum(beside)}/{len(beside)} exact")
    assert beside and all(beside), f"{beside.count(False)} of {len(beside)} greedy requests changed"
    assert outcomes["200"] > 0  # some fuzzed requests were valid and generated
