"""A burst of 4 streamed chat requests sent at once to a running `verispec serve`; each one's time to first token
(the first chunk with text), and the burst's. Then one request with n = 4."""
import json, statistics, sys, threading, time
import httpx

URL = sys.argv[1]
MODEL = None
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Explain in two sentences what a context manager is in Python and give a short example of one.",
    "Complete this function: def is_palindrome(s: str) -> bool:  # ignore case and spaces",
    "What does the following code print? for i in range(3): print(i * i, end=' ')",
]


def one(c, messages, n, out, i, t0):
    body = {"model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0, "stream": True, "n": n}
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: ") and line != "data: [DONE]":
                ev = json.loads(line[6:])
                if ev.get("choices") and ev["choices"][0].get("delta", {}).get("content"):
                    out[i] = time.perf_counter() - t0
                    break
        for _ in lines:
            pass


def main():
  global MODEL
  with httpx.Client(base_url=URL, timeout=300) as c:
      MODEL = c.get("/v1/models").json()["data"][0]["id"]
      for rep in range(REPS):
          out = [None] * 4
          t0 = time.perf_counter()
          ts = [threading.Thread(target=one, args=(httpx.Client(base_url=URL, timeout=300), [{"role": "user", "content": p}], 1, out, i, t0)) for i, p in enumerate(PROMPTS)]
          for t in ts: t.start()
          for t in ts: t.join()
          single = [None]
          t1 = time.perf_counter()
          one(c, [{"role": "user", "content": PROMPTS[rep % 4]}], 4, single, 0, t1)
          print(json.dumps({"rep": rep, "burst_ttft_s": [round(x, 3) for x in out], "burst_max_s": round(max(out), 3),
                            "burst_mean_s": round(statistics.mean(out), 3), "n4_ttft_s": round(single[0], 3)}), flush=True)

main()
