"""Where a bench run's whole-request time goes: each configuration's share in time to first token, the draft's own
prefill (in the gap between the first and second arrivals of a drafting configuration, beside one round), and what our default would score against
llama.cpp with a faster prefill.

    python whole_request_split.py ../2026-11-27-epyc-avx512-llamacpp-draft/runs.jsonl "auto γ=6"
"""
import collections
import json
import math
import sys
from pathlib import Path

from verispec.bench.report import read_recorded

CODE = ("code_completion", "code_instruct", "code_edit")
rows = [json.loads(line) for line in read_recorded(Path(sys.argv[1])).splitlines()]  # runs.jsonl, or .gz
ours = sys.argv[2] if len(sys.argv) > 2 else "auto γ=6"
by: dict[str, dict[str, dict]] = collections.defaultdict(dict)
for r in rows:
    by[r["config"]][r["prompt_id"]] = r
for cfg, runs in by.items():
    total = sum(r["seconds"] for r in runs.values())
    ttft = sum(r["ttft_s"] for r in runs.values())
    gap = sum(r["arrivals"][1][0] - r["ttft_s"] for r in runs.values() if len(r["arrivals"]) > 1)
    print(f"{cfg:32s} whole {total:6.1f} s, first token {ttft:5.1f} s ({ttft / total:.0%}), "
          f"first-to-second arrival {gap:4.1f} s ({gap / total:.0%})")
peers = [c for c in ("llama.cpp ar", "llama.cpp prompt_lookup γ=2") if c in by]  # its plain and best speculation
for f in (1.0, 0.8, 0.7, 0.6):
    cells = []
    for ref in peers:
        for name, cats in (("code", CODE), ("all", None)):
            ratios = [r["new_tokens"] / (r["seconds"] - r["ttft_s"] * (1 - f)) / by[ref][pid]["tokens_per_s"]
                      for pid, r in by[ours].items() if cats is None or r["category"] in cats]
            cells.append(f"{ref} {name} {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x")
    print(f"{ours} with its first token x{f}: " + ", ".join(cells))
