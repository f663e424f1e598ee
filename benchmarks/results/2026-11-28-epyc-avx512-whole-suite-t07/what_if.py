"""How much faster our decoding, our prefill, or both would have to be for our default to reach a ratio over a peer
in a bench run: each prompt's recorded time to first token and decoding time divided by the factors, the peer's
whole-request tokens/s as recorded; geometric means over the code prompts and over all. Arithmetic on a run's own
records, no new measurement.

    python what_if.py <run>/runs.jsonl "auto γ=6" "llama.cpp prompt_lookup γ=2" [--goal 2.5]
"""
import argparse, collections, json, math
from pathlib import Path

from verispec.bench.report import read_recorded

ap = argparse.ArgumentParser()
ap.add_argument("runs"), ap.add_argument("ours"), ap.add_argument("peer")
ap.add_argument("--goal", type=float, default=2.5)
args = ap.parse_args()
by = collections.defaultdict(dict)
for line in read_recorded(Path(args.runs)).splitlines():  # runs.jsonl, or .gz
    r = json.loads(line)
    by[(r["prompt_id"], r["temperature"])][r["config"]] = r
code = {"code_completion", "code_instruct", "code_edit"}
gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))


def ratio(decode: float, prefill: float, chosen) -> float:
    xs = []
    for v in by.values():
        o, p = v[args.ours], v[args.peer]
        if chosen(o["category"]):
            seconds = o["ttft_s"] / prefill + (o["seconds"] - o["ttft_s"]) / decode
            xs.append((o["new_tokens"] / seconds) / (p["new_tokens"] / p["seconds"]))
    return gm(xs)


for label, chosen in (("code", lambda c: c in code), ("all", lambda c: True)):
    print(f"{label}: {ratio(1, 1, chosen):.2f}× now")
    for name, factors in (("decoding", lambda f: (f, 1)), ("prefill", lambda f: (1, f)), ("both", lambda f: (f, f))):
        f = 1.0
        while ratio(*factors(f), chosen) < args.goal and f < 3:
            f += 0.005
        print(f"  {name} {f:.3f}× faster reaches {args.goal}×" if f < 3 else f"  {name}: not within 3×")
