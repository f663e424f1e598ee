"""Structured output through the server under speculation: N requests with JSON schemas, each answer validated.

    python benchmarks/structured_output.py [--requests 50] [--clients 2] [--temperature 0.7] [--serve-args ...]

Starts `verispec serve` (the default pair and configuration unless --serve-args say otherwise) on a free port,
sends --requests chat completions, each with one of a few JSON schemas as `response_format` (round-robin) and a
prompt asking for that kind of object, from --clients threads at once; then validates every answer that ended
at the end-of-sequence token against its schema (`jsonschema`), and prints each request's finish reason,
validity, tokens, α and accepted length, with the totals. Then greedy identity on the real pair: each schema's
first prompt at temperature 0 with the server's strategy and with `ar` (plain decoding), token ids compared.
Exit status 1 if an answer that finished does not validate or a greedy pair differs.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time

import httpx
import jsonschema

SCHEMAS = {
    "person": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                                                "email": {"type": "string"}},
               "required": ["name", "age", "email"], "additionalProperties": False},
    "function": {"type": "object", "properties": {
        "name": {"type": "string", "pattern": "^[a-z_][a-z0-9_]*$"},
        "arguments": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "returns": {"type": "string"}, "pure": {"type": "boolean"}},
        "required": ["name", "arguments", "returns", "pure"], "additionalProperties": False},
    "language": {"type": "object", "properties": {
        "name": {"type": "string"}, "year": {"type": "integer"},
        "paradigms": {"type": "array", "items": {"enum": ["functional", "object-oriented", "procedural", "logic"]},
                      "minItems": 1, "maxItems": 3}, "typed": {"enum": ["static", "dynamic"]}},
        "required": ["name", "year", "paradigms", "typed"], "additionalProperties": False},
    "bug": {"type": "object", "properties": {
        "title": {"type": "string"}, "severity": {"enum": ["low", "medium", "high"]},
        "steps": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}},
        "required": ["title", "severity", "steps"], "additionalProperties": False},
    "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"},
                                               "label": {"type": "string", "maxLength": 20}},
              "required": ["x", "y", "label"], "additionalProperties": False},
}
TOPICS = {
    "person": ["a software engineer in Berlin", "a retired teacher", "a student who likes chess", "a chef",
               "a data scientist", "a pilot", "a librarian", "a game developer", "a nurse", "a musician"],
    "function": ["a Python function that reverses a string", "a function that merges two sorted lists",
                 "a function computing a factorial", "a function that parses a date", "a function for binary search",
                 "a function that counts words", "a function that flattens a list", "a function that checks primes",
                 "a function that reads a CSV file", "a function that computes a mean"],
    "language": ["Python", "Haskell", "C", "Java", "Prolog", "Rust", "JavaScript", "Go", "OCaml", "Ruby"],
    "bug": ["a crash when a file is empty", "an off-by-one in pagination", "a memory leak in a cache",
            "a wrong timezone in logs", "a race in a counter", "a slow query", "a broken login button",
            "an unhandled None", "a wrong rounding of prices", "a missing translation"],
    "point": ["the origin", "a point in the first quadrant", "a point on the x axis", "the centre of a unit square",
              "a point far to the left", "a point below the x axis", "a point near (3, 4)", "a random point",
              "the top-right corner of a 10x10 grid", "a point on the line y = x"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompt_for(kind: str, topic: str) -> str:
    return f"Give a JSON object describing {topic} ({kind} record). Reply with the JSON only."


def request(client: httpx.Client, kind: str, topic: str, temperature: float, seed: int, max_tokens: int,
            strategy: str | None = None) -> dict:
    body = {"messages": [{"role": "user", "content": prompt_for(kind, topic)}], "max_tokens": max_tokens,
            "temperature": temperature, "seed": seed, "return_token_ids": True,
            "response_format": {"type": "json_schema", "json_schema": {"name": kind, "schema": SCHEMAS[kind]}}}
    if strategy:
        body["strategy"] = strategy
    t0 = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    out = r.json()
    out["seconds"] = time.perf_counter() - t0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--serve-args", default="", help="extra `verispec serve` flags, one string")
    ap.add_argument("--server-log", default="structured_output_server.log", help="where the server's log goes")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a request may take before it counts as hung")
    args = ap.parse_args()

    port = free_port()
    cmd = [sys.executable, "-m", "verispec.cli", "serve", "--port", str(port), *args.serve_args.split()]
    print("server:", " ".join(cmd[2:]), flush=True)
    log = open(args.server_log, "w")
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
    print("server log:", args.server_log, flush=True)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=args.timeout) as client:
            deadline = time.monotonic() + 600
            while True:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    print(open(args.server_log).read(), file=sys.stderr)
                    return 2
                time.sleep(0.5)
            jobs = [(kind, TOPICS[kind][i // len(SCHEMAS) % 10], i) for i in range(args.requests)
                    for kind in [list(SCHEMAS)[i % len(SCHEMAS)]]]
            results: list[tuple[str, int, dict]] = []
            lock = threading.Lock()
            t0 = time.perf_counter()

            def worker(mine: list[tuple[str, str, int]]) -> None:
                for kind, topic, i in mine:
                    try:
                        out = request(client, kind, topic, args.temperature, i, args.max_tokens)
                    except httpx.HTTPError as e:  # a request that fails or hangs is a finding, not the end of the run
                        out = {"error": f"{type(e).__name__}: {e}"}
                    with lock:
                        results.append((kind, i, out))

            threads = [threading.Thread(target=worker, args=(jobs[c :: args.clients],)) for c in range(args.clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            bad, finished, tokens, accepted, drafted = 0, 0, 0, 0, 0
            print("\n| # | schema | finish | valid | tokens | alpha | tau | s |\n|---|---|---|---|---|---|---|---|")
            failed = [(kind, i, out) for kind, i, out in results if "error" in out]
            results = [r for r in results if "error" not in r[2]]
            for kind, i, out in failed:
                print(f"| {i} | {kind} | FAILED: {out['error'][:80]} | - | - | - | - | - |")
            for kind, i, out in sorted(results, key=lambda r: r[1]):
                choice, usage = out["choices"][0], out["usage"]
                spec = usage["speculative"]
                text = choice["message"]["content"]
                valid = "-"
                if choice["finish_reason"] == "stop":
                    finished += 1
                    try:
                        jsonschema.validate(json.loads(text), SCHEMAS[kind])
                        valid = "yes"
                    except (json.JSONDecodeError, jsonschema.ValidationError) as e:
                        valid, bad = f"NO: {str(e)[:60]}", bad + 1
                tokens += usage["completion_tokens"]
                accepted += spec["accepted_tokens"]
                drafted += spec["draft_tokens"]
                print(f"| {i} | {kind} | {choice['finish_reason']} | {valid} | {usage['completion_tokens']} | "
                      f"{spec['alpha']} | {spec['mean_accepted_length']} | {out['seconds']:.1f} |")
            for kind, i, out in sorted(results, key=lambda r: r[1]):  # what an answer cut at max_tokens was doing
                if out["choices"][0]["finish_reason"] == "length":
                    text = out["choices"][0]["message"]["content"]
                    print(f"cut at max_tokens: #{i} ({kind}): {text[:100]!r} ... {text[-60:]!r}")
            print(f"\n{len(results)} requests answered ({len(failed)} failed), {finished} finished at end of sequence, {bad} of them invalid; "
                  f"{tokens} tokens in {wall:.1f} s ({tokens / wall:.1f} tok/s over {args.clients} clients); "
                  f"alpha {accepted / max(drafted, 1):.3f} ({accepted}/{drafted} drafts accepted)")
            differ = 0
            print("\ngreedy identity (temperature 0): the server's strategy against ar")
            for kind in SCHEMAS:
                a = request(client, kind, TOPICS[kind][0], 0.0, 0, args.max_tokens)
                b = request(client, kind, TOPICS[kind][0], 0.0, 0, args.max_tokens, strategy="ar")
                same = a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
                differ += not same
                spec = a["usage"]["speculative"]
                print(f"  {kind}: {'equal' if same else 'DIFFER'} ({len(a['choices'][0]['token_ids'])} tokens, "
                      f"{spec['strategy']} alpha {spec['alpha']}, {a['seconds']:.1f} s vs ar {b['seconds']:.1f} s)")
            return 1 if bad or differ or failed else 0
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
