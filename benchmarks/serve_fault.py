"""Load and faults against a live `verispec serve`: does any request hurt another, or get lost?

    python benchmarks/serve_fault.py                      # tiny random models (seconds)
    python benchmarks/serve_fault.py --real --clients 8   # the packaged pair (long on a CPU)

Starts `verispec serve` in a child process (the real command, with one substitution: the draft model fails on
any sequence holding a trigger token, so "a failing draft" happens on demand), then runs concurrent clients:

    greedy        plain completions; must equal the same request sent alone before the load
    stream        the same, streamed; must end in [DONE]
    dropped       a stream the client closes after its first chunk (expected to end there)
    poisoned      extreme but valid sampling (T 5e-324, T 1e-30, top_p 1e-300 at T 2): two clients send them
                  without pause, so nearly every round has one; each must equal the greedy answer
    failing draft a prompt with the trigger token: the draft fails, the request falls back to the target alone
                  and must still equal its lone answer (draft_fallback true)
    mistake       bodies a careless client sends (invalid UTF-8, unknown field, tools, 5 MB): must be a 4xx
    sigterm       streams in flight when the server gets SIGTERM: each must finish; then the port is closed

and prints a markdown table: sent / completed / failed as expected / lost per kind. "Lost" is anything else: a
5xx, a broken connection, a hang, or tokens that differ from the lone answer. Plain asyncio + httpx rather than
a load tool such as locust: what is counted is each request's fate and exact tokens, not throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
POISON = [{"temperature": 5e-324}, {"temperature": 1e-30}, {"temperature": 2.0, "top_p": 1e-300},
          {"temperature": 1e-300, "top_p": 5e-324}]
MISTAKES = [
    b'{"prompt": "x \xff\xfe", "max_tokens": 4}',
    b'{"prompt": "x", "max_tokens": 4, "frobnicate": 1}',
    b'{"prompt": "x \\ud800", "max_tokens": 4}',
    b'{"prompt": "x",',
    b'{"prompt": "x", "n": 3}',
]
HUGE = json.dumps({"prompt": "x " * 2_600_000, "max_tokens": 4}).encode()  # 5.2 MB: over the 4 MiB limit


# ---- the child: `verispec serve` with a draft that fails on demand ------------------------------------------------


def child(trigger: int, argv: list[str]) -> int:
    """Run `verispec serve argv`, its draft model failing on the prefill of any prompt that starts with the `trigger`
    token id (only a prefill: a trigger drafted or generated later must not fail a request without it)."""
    import torch

    from verispec.cli import main, serve

    class FailingEmbed(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        @property
        def weight(self) -> torch.Tensor:
            return self.inner.weight

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            if tokens.shape[-1] > 1 and bool((tokens[:, 0] == trigger).any()):
                raise RuntimeError("injected draft failure")
            return self.inner(tokens)

    load_models = serve.load_models

    def load_with_failing_draft(*args, **kwargs):
        target, draft = load_models(*args, **kwargs)
        if draft is not None:
            draft.model.embed = FailingEmbed(draft.model.embed)
        return target, draft

    serve.load_models = load_with_failing_draft
    return main(["serve", *argv])


# ---- the parent: clients and their accounting ---------------------------------------------------------------------


class Tally:
    def __init__(self) -> None:
        self.rows: dict[str, Counter] = defaultdict(Counter)
        self.notes: list[str] = []

    def add(self, kind: str, fate: str, note: str = "") -> None:
        self.rows[kind]["sent"] += 1
        self.rows[kind][fate] += 1
        if fate == "lost":
            self.notes.append(f"{kind}: {note}")

    def table(self) -> str:
        lines = ["| kind | sent | completed | failed as expected | lost |", "|---|---|---|---|---|"]
        total: Counter = Counter()
        for kind, c in self.rows.items():
            total.update(c)
            lines.append(f"| {kind} | {c['sent']} | {c['completed']} | {c['expected']} | {c['lost']} |")
        lines.append(f"| **all** | **{total['sent']}** | **{total['completed']}** | **{total['expected']}** | "
                     f"**{total['lost']}** |")
        return "\n".join(lines)


async def generate(c: httpx.AsyncClient, body: dict, *, stream: bool = False, drop: bool = False,
                   on_first=None) -> tuple[list[int] | None, dict]:
    """One completion: (token ids, usage), or (None, {}) when the client dropped the stream on purpose."""
    body = {**body, "return_token_ids": True}
    if not stream:
        r = await c.post("/v1/completions", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        out = r.json()
        return out["choices"][0]["token_ids"], out["usage"]
    ids, usage, done = [], {}, False
    async with c.stream("POST", "/v1/completions", json={**body, "stream": True,
                                                          "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            if event.get("usage"):
                usage = event["usage"]
            if event["choices"]:
                ids += event["choices"][0].get("token_ids", [])
                if on_first is not None:
                    on_first()
                    on_first = None
                if drop:
                    return None, {}
    if not done:
        raise RuntimeError("the stream ended without [DONE]")
    return ids, usage


async def run(args: argparse.Namespace, url: str, proc: subprocess.Popen, prompts: list, trigger: int,
              tally: Tally) -> dict:
    limits = httpx.Limits(max_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=args.timeout, limits=limits) as c:
        greedy = {"max_tokens": args.max_tokens, "temperature": 0}
        failing = [[trigger, *p] for p in prompts if isinstance(p, list)][:4]
        last_wave = [{**greedy, "prompt": p, "max_tokens": 4 * args.max_tokens}
                     for p in (prompts * args.sigterm_streams)[: args.sigterm_streams]]
        alone = {}  # each request's tokens when it runs alone, before the load
        for body in [{**greedy, "prompt": p} for p in prompts + failing] + last_wave:
            alone[key(body)] = (await generate(c, body))[0]

        async def checked(kind: str, body: dict, *, stream: bool = False, on_first=None,
                          fallback: bool = False) -> None:
            try:
                ids, usage = await generate(c, body, stream=stream, on_first=on_first)
            except Exception as e:  # noqa: BLE001 - every failure is counted, none may escape
                tally.add(kind, "lost", repr(e)[:160])
                return
            want = alone[key(body)]
            if ids != want:
                tally.add(kind, "lost", f"tokens differ from the lone request: {ids} != {want}")
            elif fallback != usage.get("speculative", {}).get("draft_fallback"):
                tally.add(kind, "lost", "the draft did not fail as injected" if fallback else
                          "its draft fell back, though its prompt has no trigger")
            else:
                tally.add(kind, "completed")

        async def dropped(prompt) -> None:
            try:
                await generate(c, {**greedy, "prompt": prompt, "max_tokens": args.max_tokens * 4}, stream=True,
                               drop=True)
                tally.add("dropped", "expected")
            except Exception as e:  # noqa: BLE001
                tally.add("dropped", "lost", repr(e)[:160])

        async def mistake(body: bytes) -> None:
            r = await c.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
            ok = 400 <= r.status_code < 500 and set(r.json().get("error", {})) >= {"message", "type", "code"}
            tally.add("mistake", "expected" if ok else "lost", f"HTTP {r.status_code}: {r.text[:120]}")

        stop_poison = asyncio.Event()

        async def poisoner(k: int) -> None:
            rng = random.Random(k)
            while not stop_poison.is_set():
                await checked("poisoned", {**greedy, **rng.choice(POISON), "prompt": rng.choice(prompts)})

        async def client(k: int) -> None:
            rng = random.Random(100 + k)
            for j in range(args.requests):
                step = (k + j) % 6
                prompt = rng.choice(prompts)
                if step == 0:
                    await checked("greedy", {**greedy, "prompt": prompt})
                elif step == 1:
                    await checked("stream", {**greedy, "prompt": prompt}, stream=True)
                elif step == 2:
                    await dropped(prompt)
                elif step == 3:
                    await checked("failing draft", {**greedy, "prompt": rng.choice(failing)}, fallback=True)
                elif step == 4:
                    await mistake(HUGE if j % 4 == 0 else rng.choice(MISTAKES))
                else:
                    await checked("greedy", {**greedy, "prompt": prompt, "seed": j})

        t0 = time.perf_counter()
        poisoners = [asyncio.create_task(poisoner(k)) for k in range(2)]
        await asyncio.gather(*(client(k) for k in range(args.clients)))
        stop_poison.set()
        await asyncio.gather(*poisoners)
        load_s = time.perf_counter() - t0
        await asyncio.sleep(0.3)
        state = (await c.get("/v1/state")).json()
        metrics = (await c.get("/metrics")).text

        # SIGTERM while streams are in flight: each must still finish with its lone answer.
        started = 0
        all_started = asyncio.Event()

        def first_chunk() -> None:
            nonlocal started
            started += 1
            if started == args.sigterm_streams:
                all_started.set()

        wave = [asyncio.create_task(checked("sigterm (in flight)", body, stream=True, on_first=first_chunk))
                for body in last_wave]
        try:
            await asyncio.wait_for(all_started.wait(), timeout=args.timeout)
        except TimeoutError:
            pass
        in_flight = sum(not t.done() for t in wave)
        proc.send_signal(signal.SIGTERM)
        await asyncio.gather(*wave)
    exit_code = await asyncio.to_thread(proc.wait, 60)
    try:
        httpx.get(f"{url}/health", timeout=2)
        tally.add("after sigterm", "lost", "the server still answers after SIGTERM")
    except httpx.TransportError:
        tally.add("after sigterm", "expected")
    return {"load_s": load_s, "state": state, "exit_code": exit_code, "metrics": metrics, "in_flight": in_flight}


def key(body: dict) -> str:
    return json.dumps([body["prompt"], body["max_tokens"]])


def metric(text: str, name: str) -> str:
    """A sample of a Prometheus text page ("0" when absent: a labelled counter not yet incremented)."""
    line = next((x for x in text.splitlines() if x.startswith(name + " ")), None)
    return line.split()[1] if line else "0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", action="store_true", help="the packaged pair instead of tiny random models")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=12, help="per client")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--sigterm-streams", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds any one request may take")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)  # the server, with its trigger
    args, rest = parser.parse_known_args()
    if args.child is not None:
        return child(args.child, rest)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = ["--port", str(port), "--strategy", "draft", "--max-concurrency", "8", "--log-level", "warning"]
    with tempfile.TemporaryDirectory() as tmp:
        if args.real:
            from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET

            serve += ["--target", DEFAULT_TARGET, "--draft", DEFAULT_DRAFT]
            trigger = 151643  # Qwen2.5's <|endoftext|>
            prompts = ["def quicksort(arr):", "class Stack:\n    def __init__(self):", "def fibonacci(n):",
                       "def is_prime(n):", "# reverse a string\ndef rev(s):", "def binary_search(xs, x):",
                       [750, 4715, 1445, 982, 5406, 982, 1648, 1648, 1648, 220], [474, 2643, 198, 198, 750]]
        else:
            sys.path.insert(0, str(ROOT))  # tests/tiny_hf.py builds the tiny models
            from tests.tiny_hf import make_tiny_hf_dir

            target = make_tiny_hf_dir(Path(tmp) / "target", seed=0)
            draft = make_tiny_hf_dir(Path(tmp) / "draft", seed=1, noise_from=target)
            serve += ["--target", str(target), "--draft", str(draft), "--dtype", "float32", "--draft-dtype",
                      "float32", "--gamma", "3", "--max-prompt-tokens", "64", "--max-new-tokens-limit", "128"]
            trigger = 1  # <|endoftext|>
            prompts = [list(range(7 + i, 12 + i)) for i in range(8)] + ["x ( a ) :", "if x = 1 :", "print ( y )"]
        command = [sys.executable, __file__, "--child", str(trigger), *serve]
        proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            deadline = time.monotonic() + (1800 if args.real else 120)
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not come up (exit {proc.poll()})")
                time.sleep(0.2)
            tally = Tally()
            out = asyncio.run(run(args, url, proc, prompts, trigger, tally))
        finally:
            if proc.poll() is None:
                proc.kill()
    models = "the packaged pair" if args.real else "tiny random models (tests/tiny_hf.py), float32"
    print(f"`verispec serve --strategy draft --max-concurrency 8` on {models}; {args.clients} clients x "
          f"{args.requests} requests, 2 poisoned clients throughout, max_tokens {args.max_tokens}; load phase "
          f"{out['load_s']:.1f} s\n")
    print(tally.table())
    m = out["metrics"]
    outcomes = ", ".join(f"{k} {float(n):g}" for k, n in
                         re.findall(r'^verispec_requests_total\{finish_reason="(\w+)"\} (\S+)$', m, re.M))
    rows = float(metric(m, "verispec_target_forward_sequences_total"))
    forwards = float(metric(m, "verispec_target_forwards_total"))
    print(f"\nafter the load: /v1/state {out['state']}; draft failures (fallbacks) "
          f"{metric(m, 'verispec_spec_decode_draft_failures_total')}; requests by outcome: {outcomes}; "
          f"mean rows per target forward {rows / max(forwards, 1):.2f}")
    print(f"SIGTERM sent with {out['in_flight']} of {args.sigterm_streams} streams in flight; server exit code "
          f"{out['exit_code']} (uvicorn re-raises the signal once its graceful shutdown is done: -15)")
    for note in tally.notes[:20]:
        print(f"- lost: {note}")
    lost = sum(c["lost"] for c in tally.rows.values())
    return 1 if lost or out["exit_code"] not in (0, -signal.SIGTERM) or out["state"]["running"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
