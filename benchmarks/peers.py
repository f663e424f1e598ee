"""Every configuration of a bench run over llama.cpp's plain decoding, and our default over each llama.cpp
speculation, geometric means of per-prompt tokens/s ratios, code prompts and all: whole requests (the first token's
time included), then decoding alone (the tokens after the first over the time after it); then, per category, our
default over each peer configuration (whole requests).

    python benchmarks/peers.py benchmarks/results/<run>/runs.jsonl [OURS] > benchmarks/results/<run>/peers.md

OURS: our default's configuration label (default: the run's highest `auto γ=N`). The last column counts the greedy
prompts whose output differs from the same system's plain decoding (llama.cpp's rows against llama.cpp's).
"""
import collections, json, math, sys
from pathlib import Path

from verispec.bench.report import read_recorded

rows = [json.loads(l) for l in read_recorded(Path(sys.argv[1])).splitlines()]  # runs.jsonl, or .gz
by = collections.defaultdict(dict)
for r in rows:
    by[(r["prompt_id"], r["category"], r["temperature"])][r["config"]] = r
configs = sorted({r["config"] for r in rows})
ours = sys.argv[2] if len(sys.argv) > 2 else max((c for c in configs if c.startswith("auto γ=")),
                                                  key=lambda c: int(c.split("=")[1]))
code = {"code_completion", "code_instruct", "code_edit"}
measures = {"whole request": lambda r: r["new_tokens"] / r["seconds"],
            "decoding (after the first token)": lambda r: (r["new_tokens"] - 1) / (r["seconds"] - r["ttft_s"])}
gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")
for T in sorted({k[2] for k in by}):
    for measure, tps in measures.items():
        print(f"\n## T = {T}, {measure}\n\n| configuration | / llama.cpp plain, code | all | {ours} / it, code | all | "
              "differs from its plain (greedy) |")
        print("|---|---|---|---|---|---|")
        for c in configs:
            cells = []
            for base, num in (("llama.cpp ar", c), (c, ours)):
                for sel in (lambda k: k in code, lambda k: True):
                    xs = [tps(v[num]) / tps(v[base]) for (p, k, t), v in by.items()
                          if t == T and sel(k) and num in v and base in v and v[num]["new_tokens"] > 1
                          and v[base]["new_tokens"] > 1]
                    cells.append(f"{gm(xs):.2f}×")
            plain = "llama.cpp ar" if c.startswith("llama.cpp") else "openvino ar" if c.startswith("openvino") else "ar"
            diff = sum(v[c]["token_ids"] != v[plain]["token_ids"] for (p, k, t), v in by.items()
                       if t == T and T == 0 and c in v and plain in v)
            print(f"| {c} | " + " | ".join(cells) + f" | {diff if T == 0 else '–'} |")
    # by category, whole request: our default over each peer configuration
    peers = [c for c in configs if c.startswith(("llama.cpp", "openvino"))]
    cats = sorted({k for (p, k, t) in by if t == T})
    print(f"\n## T = {T}, whole request, {ours} over each peer by category\n\n| category | prompts | "
          + " | ".join(f"/ {c}" for c in peers) + " |")
    print("|---|---|" + "---|" * len(peers))
    for cat in cats:
        cells = []
        for c in peers:
            xs = [measures["whole request"](v[ours]) / measures["whole request"](v[c]) for (p, k, t), v in by.items()
                  if t == T and k == cat and ours in v and c in v]
            cells.append(f"{gm(xs):.2f}×")
        n = sum(1 for (p, k, t) in by if t == T and k == cat)
        print(f"| {cat} | {n} | " + " | ".join(cells) + " |")
