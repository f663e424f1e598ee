"""Fire N concurrent clients x M requests at a running `verispec serve` and print throughput and latency.

    python benchmarks/serve_load.py --url http://127.0.0.1:8000 --clients 4 --requests 2 --max-tokens 64

Each client sends its requests one after another (streamed chat completions, greedy by default) with prompts
from the packaged bench suite (code categories by default), so the server sees at most N requests at once.
Prints requests/s, P50/P99 latency and time to first token, total generated tokens/s, errors, and the
server's speculative counters over the run (from /metrics). Run it once against a server started with the
default settings and once with `--speculate-max-batch 0` (or `--strategy ar`) to compare.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import threading
import time

import httpx

from verispec.bench.suite import load_prompts


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def counters(text: str) -> dict[str, float]:
    """The `_total` samples of a Prometheus text page that have no label but `replica` (summed over replicas:
    `serve --backend ray` labels each replica's)."""
    out: dict[str, float] = {}
    for m in re.finditer(r'^(verispec_\w+_total)(?:\{replica="[^"]*"\})? (\S+)$', text, re.M):
        out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def one_request(client: httpx.Client, body: dict) -> tuple[float, float | None, int]:
    """Stream one chat completion; return (latency, time to first token, completion tokens)."""
    t0 = time.perf_counter()
    ttft, usage = None, None
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:200]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            if ttft is None and event.get("choices") and event["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - t0
            if event.get("usage"):
                usage = event["usage"]
    if usage is None:
        raise RuntimeError("no usage chunk")
    return time.perf_counter() - t0, ttft, usage["completion_tokens"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--categories", default="code_completion,code_instruct,code_edit")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--metrics-delay", type=float, default=0.0, help="seconds to wait before reading /metrics "
                    "after the load (2 for `serve --backend ray`, whose replicas report every second)")
    args = ap.parse_args()

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with httpx.Client(base_url=args.url, headers=headers, timeout=3600) as c:
        model = args.model or c.get("/v1/models").json()["data"][0]["id"]
        before = counters(c.get("/metrics").text)
    prompts = load_prompts("suite", categories=args.categories.split(","))
    jobs = [[prompts[(k * args.requests + j) % len(prompts)] for j in range(args.requests)] for k in range(args.clients)]
    latencies: list[float] = []
    ttfts: list[float] = []
    tokens: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client_loop(mine) -> None:
        with httpx.Client(base_url=args.url, headers=headers, timeout=3600) as c:
            for p in mine:
                body = {"model": model, "messages": list(p.messages), "max_tokens": args.max_tokens,
                        "temperature": args.temperature, "seed": 0, "stream": True,
                        "stream_options": {"include_usage": True}}
                try:
                    latency, ttft, n = one_request(c, body)
                    with lock:
                        latencies.append(latency)
                        tokens.append(n)
                        if ttft is not None:
                            ttfts.append(ttft)
                except Exception as e:  # noqa: BLE001 - count it, keep loading
                    with lock:
                        errors.append(str(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client_loop, args=(mine,)) for mine in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    time.sleep(args.metrics_delay)
    with httpx.Client(base_url=args.url, headers=headers) as c:
        after = counters(c.get("/metrics").text)
    delta = {k.removeprefix("verispec_").removesuffix("_total"): after.get(k, 0) - before.get(k, 0) for k in after}
    drafted, accepted = delta.get("spec_decode_num_draft_tokens", 0), delta.get("spec_decode_num_accepted_tokens", 0)
    forwards = delta.get("target_forwards", 0)
    result = {
        "clients": args.clients, "requests": len(latencies) + len(errors), "errors": len(errors),
        "wall_s": round(wall, 2),
        "requests_per_s": round(len(latencies) / wall, 4),
        "latency_p50_s": round(percentile(latencies, 50), 2) if latencies else None,
        "latency_p99_s": round(percentile(latencies, 99), 2) if latencies else None,
        "ttft_p50_s": round(percentile(ttfts, 50), 2) if ttfts else None,
        "tokens_total": sum(tokens),
        "tokens_per_s": round(sum(tokens) / wall, 2),
        "alpha": round(accepted / drafted, 3) if drafted else None,
        "mean_batch": round(delta.get("target_forward_sequences", 0) / forwards, 2) if forwards else None,
        "rounds_without_drafting": int(delta.get("speculation_off_rounds", 0)),
        "draft_failures": int(delta.get("spec_decode_draft_failures", 0)),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['requests']} requests ({args.clients} clients x {args.requests}), {result['errors']} errors, "
          f"{result['wall_s']} s")
    print(f"  requests/s {result['requests_per_s']}, latency P50 {result['latency_p50_s']} s / "
          f"P99 {result['latency_p99_s']} s, TTFT P50 {result['ttft_p50_s']} s")
    print(f"  tokens {result['tokens_total']}, {result['tokens_per_s']} tokens/s total; alpha {result['alpha']}, "
          f"mean batch {result['mean_batch']}, rounds without drafting {result['rounds_without_drafting']}")
    if errors:
        print("  first error:", errors[0])
    if latencies:
        print(f"  mean latency {statistics.mean(latencies):.2f} s")


if __name__ == "__main__":
    main()
