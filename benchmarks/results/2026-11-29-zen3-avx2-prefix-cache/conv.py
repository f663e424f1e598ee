"""Two-turn chats against a running `verispec serve`: turn 1 asks about a piece of standard-library source
(~400 tokens), turn 2 sends the conversation again with a follow-up. Each turn's time to first token, and the
server's prompt-token count (usage). Greedy, 48 new tokens a turn."""
import hashlib, inspect, json, sys, time
import httpx, textwrap, shlex, fractions, string

URL = sys.argv[1]
SOURCES = [textwrap.dedent, shlex.split, fractions.Fraction.limit_denominator, string.capwords]


def turn(c, model, messages):
    body = {"model": model, "messages": messages, "max_tokens": 48, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0, ttft, text, usage = time.perf_counter(), None, [], None
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        for line in lines:
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices") or []:
                piece = ch.get("delta", {}).get("content")
                if piece:
                    ttft = ttft or time.perf_counter() - t0
                    text.append(piece)
    return ttft, "".join(text), usage["prompt_tokens"]


with httpx.Client(base_url=URL, timeout=600) as c:
    model = c.get("/v1/models").json()["data"][0]["id"]
    for fn in SOURCES:
        src = inspect.getsource(fn)[:1600]
        messages = [{"role": "system", "content": "You are a careful Python reviewer."},
                    {"role": "user", "content": f"Explain what this function does:\n```python\n{src}\n```"}]
        t1, answer, p1 = turn(c, model, messages)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Now list one edge case."}]
        t2, answer2, p2 = turn(c, model, messages)
        print(json.dumps({"source": fn.__qualname__, "turn1_prompt": p1, "turn1_ttft_s": round(t1, 3),
                          "turn2_prompt": p2, "turn2_ttft_s": round(t2, 3),
                          "answers_sha1": hashlib.sha1((answer + "\0" + answer2).encode()).hexdigest()[:12]}), flush=True)
