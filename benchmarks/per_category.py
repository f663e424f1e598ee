"""Per category and configuration of a bench run: speedup over our plain decoding (geometric mean of per-prompt
whole-request tokens/s ratios), α (accepted ÷ drafted), τ (tokens a target forward: new tokens ÷ rounds), c (the
drafter's time a round over a target step, mean of the runs) and tokens/s (whole requests, summed tokens over summed
seconds). The bench's report gives speedup and α by category; issue 17 asks for τ and c by category too.

    python benchmarks/per_category.py benchmarks/results/<run>/runs.jsonl.gz > benchmarks/results/<run>/per_category.md
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from verispec.bench.report import read_recorded

CODE = ("code_completion", "code_instruct", "code_edit")


def main(path: str) -> None:
    records = [json.loads(line) for line in read_recorded(Path(path)).splitlines()]
    rows = [r for r in records if r.get("system", "verispec") == "verispec"]
    plain = {(r["prompt_id"], r["temperature"]): r for r in rows if r["strategy"] == "ar"}
    cats = list(dict.fromkeys(r["category"] for r in rows))
    groups = {"code": CODE, "all": tuple(cats), **{c: (c,) for c in cats}}
    for t in sorted({r["temperature"] for r in rows}):
        configs = list(dict.fromkeys(r["config"] for r in rows if r["temperature"] == t))
        print(f"\n## {'greedy' if t == 0 else f'T = {t}'}: speedup over plain · whole-request tok/s · τ · α · c "
              "(prompts)\n")
        cells: dict[str, list[str]] = {}
        for config in configs:
            runs = [r for r in rows if r["temperature"] == t and r["config"] == config]
            for group, members in groups.items():
                rs = [r for r in runs if r["category"] in members]
                cells.setdefault(group, []).append(cell(rs, plain, t))
        print("| category | " + " | ".join(configs) + " |")
        print("|---|" + "---|" * len(configs))
        for group, row in cells.items():
            print(f"| {group} | " + " | ".join(row) + " |")


def cell(rs: list[dict], plain: dict, t: float) -> str:
    """Speedup over plain · tokens/s · τ · α · c of some runs of one configuration."""
    if not rs:
        return "–"
    ratios = [r["tokens_per_s"] / plain[(r["prompt_id"], t)]["tokens_per_s"] for r in rs
              if (r["prompt_id"], t) in plain]
    gm = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
    parts = [f"{gm:.2f}×", f"{sum(r['new_tokens'] for r in rs) / sum(r['seconds'] for r in rs):.1f} tok/s",
             f"τ {sum(r['new_tokens'] for r in rs) / sum(r['rounds'] for r in rs):.2f}"]
    drafted = sum(r["drafted"] or 0 for r in rs)
    if drafted:
        parts.append(f"α {sum(r['accepted'] or 0 for r in rs) / drafted:.2f}")
    cs = [r["c"] for r in rs if r["c"] is not None]
    if cs:
        parts.append(f"c {sum(cs) / len(cs):.3f}")
    return " · ".join(parts) + f" ({len(rs)})"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/per_category.py RUNS.jsonl[.gz]")
    main(sys.argv[1])
