"""From measured runs to report.json, report.md and plots.

Speedups are per-prompt ratios against plain decoding measured in the same block (same prompt, repeat and
temperature, run back to back), then summarised by their median and geometric mean; tokens/s is total new
tokens over total seconds. Per-token latency: a gap g between two arrivals that brought k tokens counts as k
tokens of g / k each (the first arrival is the time to first token, reported on its own).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verispec.bench.runner import Config, Run
from verispec.bench.stats import geomean, median, percentile
from verispec.metrics import alpha_iid
from verispec.theory import expected_tokens, interpolate_cost, optimal_gamma, predicted_speedup

ALL = "all"


def recorded(path: Path) -> Path | None:
    """`path`, or its gzipped copy `path.gz` (how results folders keep their large files), or None."""
    for p in (path, path.with_name(path.name + ".gz")):
        if p.exists():
            return p
    return None


def read_recorded(path: Path) -> str:
    """The text of a recorded file, plain or gzipped (by its `.gz` suffix)."""
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()


@dataclass
class Row:
    config: Config
    category: str
    runs: int
    tokens_per_s: float
    alpha: float | None  # accepted / drafted
    alpha_iid: float | None  # accepted / (accepted + rejections): the alpha of the theory's model
    mean_accepted_length: float | None  # output tokens per target forward while decoding
    per_position: list[float | None]
    c: float | None
    speedup_median: float | None  # over our plain decoding
    speedup_geomean: float | None
    own_speedup_median: float | None  # peers: over their own plain decoding
    own_speedup_geomean: float | None
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    ttft_ms: float | None
    differ: int | None  # greedy only: outputs that differ from our plain decoding's

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None, nd: int = 3) -> float | None:
            return None if x is None else round(x, nd)

        return {
            "config": self.config.label, "system": self.config.system, "strategy": self.config.strategy,
            "gamma": self.config.gamma, "temperature": self.config.temperature, "category": self.category,
            "runs": self.runs, "tokens_per_s": r(self.tokens_per_s), "alpha": r(self.alpha),
            "alpha_iid": r(self.alpha_iid), "mean_accepted_length": r(self.mean_accepted_length),
            "per_position_acceptance": [r(x) for x in self.per_position], "c": r(self.c),
            "speedup_median": r(self.speedup_median), "speedup_geomean": r(self.speedup_geomean),
            "own_speedup_median": r(self.own_speedup_median), "own_speedup_geomean": r(self.own_speedup_geomean),
            "latency_p50_ms": r(self.latency_p50_ms, 1), "latency_p99_ms": r(self.latency_p99_ms, 1),
            "ttft_ms": r(self.ttft_ms, 1), "differ_from_ar": self.differ,
        }


def _key(run: Run) -> tuple[str, int, float]:
    return run.prompt_id, run.rep, run.config.temperature


def summarize(runs: Sequence[Run], configs: Sequence[Config]) -> list[Row]:
    """One row per configuration and category, plus category 'all'."""
    ours_ar = {_key(r): r for r in runs if r.config.system == "verispec" and r.config.plain}
    own_ar = {(r.config.system, *_key(r)): r for r in runs if r.config.plain}
    by: dict[tuple[Config, str], list[Run]] = defaultdict(list)
    for r in runs:
        by[(r.config, r.category)].append(r)
        by[(r.config, ALL)].append(r)
    categories = list(dict.fromkeys(r.category for r in runs)) + [ALL]
    rows = []
    for config in configs:
        for cat in categories:
            rs = by.get((config, cat))
            if rs:
                rows.append(_row(config, cat, rs, ours_ar, own_ar))
    return rows


def _ratios(rs: Sequence[Run], base: dict, key) -> list[float]:
    out = []
    for r in rs:
        b = base.get(key(r))
        if b is not None and b.tokens_per_s > 0 and r.tokens_per_s > 0:
            out.append(r.tokens_per_s / b.tokens_per_s)
    return out


def _rejections(r: Run) -> int | None:
    """Rounds with a rejected draft. Records from before they were counted: rounds that tested position i are
    estimated as min(rounds that drafted i, rounds that accepted i-1), exact when every round drafts alike."""
    if r.rejections is not None or not r.drafted:
        return r.rejections or 0
    d, a = r.drafted_per_position, r.accepted_per_position
    if not d:
        return None
    tested = sum(min(d[i], a[i - 1] if i else d[0]) for i in range(len(d)))
    return tested - sum(a)


def _row(config: Config, cat: str, rs: list[Run], ours_ar: dict, own_ar: dict) -> Row:
    tokens, seconds = sum(r.new_tokens for r in rs), sum(r.seconds for r in rs)
    drafted = sum(r.drafted or 0 for r in rs)
    accepted = sum(r.accepted or 0 for r in rs)
    rounds = [r.rounds for r in rs if r.rounds]
    width = max((len(r.drafted_per_position) for r in rs), default=0)
    per_pos: list[float | None] = []
    for i in range(width):
        d = sum(r.drafted_per_position[i] for r in rs if i < len(r.drafted_per_position))
        a = sum(r.accepted_per_position[i] for r in rs if i < len(r.accepted_per_position))
        per_pos.append(a / d if d else None)
    ours = _ratios(rs, ours_ar, _key)
    own = _ratios(rs, own_ar, lambda r: (r.config.system, *_key(r))) if config.system != "verispec" else []
    lat = [x for r in rs for x in r.token_latencies()]
    ttfts = [r.ttft for r in rs if r.ttft is not None]
    cs = [r.c for r in rs if r.c is not None]
    rejections = [_rejections(r) for r in rs]
    differ = None
    if config.temperature == 0:
        pairs = [(r, ours_ar.get(_key(r))) for r in rs]
        differ = sum(b is not None and r.token_ids != b.token_ids for r, b in pairs)
    return Row(
        config=config, category=cat, runs=len(rs), tokens_per_s=tokens / seconds if seconds else 0.0,
        alpha=accepted / drafted if drafted else None,
        alpha_iid=alpha_iid(accepted, sum(rejections)) if drafted and None not in rejections else None,
        mean_accepted_length=sum(r.new_tokens for r in rs if r.rounds) / sum(rounds) if rounds else None,
        per_position=per_pos, c=sum(cs) / len(cs) if cs else None,
        speedup_median=median(ours), speedup_geomean=geomean(ours),
        own_speedup_median=median(own), own_speedup_geomean=geomean(own),
        latency_p50_ms=None if not lat else 1000 * percentile(lat, 50),
        latency_p99_ms=None if not lat else 1000 * percentile(lat, 99),
        ttft_ms=None if not ttfts else 1000 * median(ttfts), differ=differ,
    )


# ---- theory beside the measurements ------------------------------------------------------------------------
def theory_rows(rows: Sequence[Row], curve: Sequence[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """For each drafting strategy and temperature: per gamma, the measured alpha and c, the predicted mean
    accepted length and speedup next to the measured ones; the gamma theory calls for and the one that won.
    alpha is the per-token alpha_iid (the model's parameter); with a measured verification-cost `curve`, the
    speedup is also predicted with what a (gamma + 1)-token forward really costs. Tree rows are left out: a tree's
    gamma is its node budget, not a chain's length (benchmarks/tree_sizes.py sets the tree theory beside them)."""
    cost = interpolate_cost([(p["tokens"], p["relative_to_1"]) for p in curve]) if curve else None
    groups: dict[tuple[str, float], list[Row]] = defaultdict(list)
    for row in rows:
        if (row.category == ALL and row.config.system == "verispec" and not row.config.plain
                and row.alpha_iid is not None and row.config.strategy not in ("tree", "tree+ngram")):
            groups[(row.config.strategy, row.config.temperature)].append(row)
    out = []
    for (strategy, temperature), rs in groups.items():
        rs.sort(key=lambda r: r.config.gamma)
        per_gamma = []
        for r in rs:
            g, a, c = r.config.gamma, min(r.alpha_iid, 1.0), r.c or 0.0
            per_gamma.append({
                "gamma": g, "alpha": round(a, 3), "c": round(c, 3),
                "predicted_mean_accepted_length": round(expected_tokens(a, g), 3),
                "measured_mean_accepted_length": None if r.mean_accepted_length is None else round(r.mean_accepted_length, 3),
                "predicted_speedup": round(predicted_speedup(a, g, c), 3),
                "predicted_speedup_verify_cost": None if cost is None else round(predicted_speedup(a, g, c, cost), 3),
                "measured_speedup": None if r.speedup_geomean is None else round(r.speedup_geomean, 3),
                "optimal_gamma": optimal_gamma(a, c),
            })
        # alpha and c pooled over the gammas run, weighted by runs (alpha barely depends on gamma)
        alpha = sum(p["alpha"] * r.runs for p, r in zip(per_gamma, rs)) / sum(r.runs for r in rs)
        c = sum(p["c"] * r.runs for p, r in zip(per_gamma, rs)) / sum(r.runs for r in rs)
        best = max(rs, key=lambda r: r.speedup_geomean or 0.0)
        out.append({
            "strategy": strategy, "temperature": temperature, "alpha": round(alpha, 3), "c": round(c, 3),
            "optimal_gamma": optimal_gamma(alpha, c) if c > 0 else None,
            "optimal_gamma_verify_cost": None if cost is None else optimal_gamma(alpha, c, verify_cost=cost),
            "best_measured_gamma": best.config.gamma, "per_gamma": per_gamma,
        })
    return out


# ---- writing -----------------------------------------------------------------------------------------------
def _f(x: float | None, fmt: str = "{:.2f}", suffix: str = "") -> str:
    return "–" if x is None else fmt.format(x) + suffix


def markdown(rows: Sequence[Row], meta: dict[str, Any], theory: list[dict[str, Any]],
             costs: dict[str, Any] | None = None) -> str:
    lines = [f"# verispec bench — {meta.get('started', '')}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k not in ("started",)]
    lines.append("")
    for temp in sorted({r.config.temperature for r in rows}):
        mode = "greedy" if temp == 0 else f"temperature {temp}"
        trs = [r for r in rows if r.config.temperature == temp]
        lines += [f"## {mode}: all prompts", ""]
        head = ("| config | runs | tok/s | speedup vs ar (median / geomean) | vs own plain | α | mean acc. len |"
                " c | P50 / P99 ms/token | TTFT ms |" + (" differ from ar |" if temp == 0 else ""))
        lines += [head, "|" + "---|" * (head.count("|") - 1)]
        for r in (r for r in trs if r.category == ALL):
            own = "–" if r.own_speedup_geomean is None else f"{r.own_speedup_median:.2f}× / {r.own_speedup_geomean:.2f}×"
            lines.append(
                f"| {r.config.label} | {r.runs} | {r.tokens_per_s:.2f} | "
                f"{_f(r.speedup_median, suffix='×')} / {_f(r.speedup_geomean, suffix='×')} | {own} | "
                f"{_f(r.alpha)} | {_f(r.mean_accepted_length)} | {_f(r.c)} | "
                f"{_f(r.latency_p50_ms, '{:.0f}')} / {_f(r.latency_p99_ms, '{:.0f}')} | {_f(r.ttft_ms, '{:.0f}')} |"
                + (f" {r.differ}/{r.runs} |" if temp == 0 else "")
            )
        cats = list(dict.fromkeys(r.category for r in trs if r.category != ALL))
        if len(cats) > 1:
            lines += ["", f"### {mode}: speedup vs ar (geomean) and α by category", ""]
            head = "| config | " + " | ".join(cats) + " |"
            lines += [head, "|" + "---|" * (len(cats) + 1)]
            labels = list(dict.fromkeys(r.config.label for r in trs))
            cell = {(r.config.label, r.category): r for r in trs}
            for label in labels:
                cs = []
                for cat in cats:
                    r = cell.get((label, cat))
                    cs.append("–" if r is None else _f(r.speedup_geomean, suffix="×") + (f" (α {r.alpha:.2f})" if r.alpha is not None else ""))
                lines.append(f"| {label} | " + " | ".join(cs) + " |")
        lines.append("")
    if theory:
        with_cost = any(g["predicted_speedup_verify_cost"] is not None for t in theory for g in t["per_gamma"])
        lines += ["## Theory beside the measurements", "",
                  "α here is the per-token acceptance of the theory's model, accepted ÷ (accepted + rejections) "
                  "(drafts after a rejection are never tested, so accepted ÷ drafted, the α above, understates it). "
                  "Predicted: mean accepted length (1−α^(γ+1))/(1−α); speedup E/(γc+1), which assumes a "
                  "verification forward costs one decoding step"
                  + ("; and E/(γc+v(γ+1)) with v the measured verification-cost curve below." if with_cost else "."), ""]
        head = "| strategy | T | γ | α | c | mean acc. len predicted / measured | speedup predicted / measured |"
        if with_cost:
            head = head.replace("speedup predicted /", "speedup predicted (flat / measured verify cost) /")
        lines += [head, "|---|---|---|---|---|---|---|"]
        for t in theory:
            for g in t["per_gamma"]:
                pred = f"{g['predicted_speedup']:.2f}×"
                if with_cost:
                    pred += f" / {_f(g['predicted_speedup_verify_cost'], suffix='×')}"
                lines.append(
                    f"| {t['strategy']} | {t['temperature']} | {g['gamma']} | {g['alpha']:.3f} | {g['c']:.3f} | "
                    f"{g['predicted_mean_accepted_length']:.2f} / {_f(g['measured_mean_accepted_length'])} | "
                    f"{pred} / {_f(g['measured_speedup'], suffix='×')} |"
                )
        lines.append("")
        for t in theory:
            optimum = (
                t["optimal_gamma"] if t["optimal_gamma"] is not None
                else "unbounded (c = 0: a longer draft costs nothing, so only the verification curve limits γ)"
            )
            if t.get("optimal_gamma_verify_cost") is not None:
                optimum = f"{optimum} (with the measured verification cost: {t['optimal_gamma_verify_cost']})"
            lines.append(
                f"- {t['strategy']}, T={t['temperature']}: α {t['alpha']:.3f}, c {t['c']:.3f} → theory's optimal γ "
                f"{optimum}; best measured γ {t['best_measured_gamma']} (of those run)"
            )
        lines.append("")
    if costs:
        lines += _costs_markdown(costs)
    return "\n".join(lines)


def _costs_markdown(costs: dict[str, Any]) -> list[str]:
    lines = ["## What a target forward costs", ""]
    curve = costs.get("verification_curve")
    if curve:
        lines += [f"Target forward over k new tokens on top of a {costs.get('context')}-token cache (median of "
                  f"{costs.get('reps')}):", "",
                  "| k | " + " | ".join(str(r["tokens"]) for r in curve) + " |",
                  "|---|" + "---|" * len(curve),
                  "| ms | " + " | ".join(f"{r['ms']:.1f}" for r in curve) + " |",
                  "| × one token | " + " | ".join(f"{r['relative_to_1']:.2f}" for r in curve) + " |", ""]
    bw = costs.get("bandwidth")
    if bw:
        lines.append(
            f"Memory-bandwidth limit of a plain decoding step: {bw['weight_bytes'] / 1e9:.2f} GB of weights per token "
            f"/ {bw['read_bandwidth_gb_s']} GB/s measured read bandwidth = {bw['limit_ms_per_token']} ms "
            f"({bw['limit_tokens_per_s']} tokens/s)"
            + (f"; measured step {bw['measured_step_ms']} ms = {bw['step_over_limit']}× the limit." if "measured_step_ms" in bw else ".")
        )
        lines.append("")
    return lines


def plots(rows: Sequence[Row], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    overall = [r for r in rows if r.category == ALL]
    temps = sorted({r.config.temperature for r in overall})

    # speedup vs gamma, one line per (system, strategy) and temperature
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[tuple[str, float], list[Row]] = defaultdict(list)
    for r in overall:
        if r.config.gamma and r.speedup_geomean is not None:
            name = r.config.label.split(" γ=")[0]
            series[(name, r.config.temperature)].append(r)
    for (name, temp), rs in sorted(series.items()):
        rs.sort(key=lambda r: r.config.gamma)
        ax.plot([r.config.gamma for r in rs], [r.speedup_geomean for r in rs], marker="o", label=f"{name}, T={temp}")
    for r in overall:
        if r.config.plain and r.config.system != "verispec" and r.speedup_geomean is not None:
            ax.axhline(r.speedup_geomean, ls=":", lw=1, color="gray")
            ax.annotate(f"{r.config.label}, T={r.config.temperature}", (0.02, r.speedup_geomean), xycoords=("axes fraction", "data"), fontsize=7, color="gray")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set(xlabel="γ (tokens proposed per round)", ylabel="speedup over our plain decoding (geomean)", title="Speedup vs γ")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    written.append(_save(fig, out / "speedup_vs_gamma.png"))

    # measured mean accepted length vs the prediction from measured (per-token) alpha
    fig, ax = plt.subplots(figsize=(5.5, 5))
    hi = 1.0
    for temp in temps:
        pts = [(expected_tokens(min(r.alpha_iid, 1.0), r.config.gamma), r.mean_accepted_length, r.config.label)
               for r in overall if r.config.temperature == temp and r.alpha_iid is not None and r.mean_accepted_length]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=f"T={temp}")
            for x, y, label in pts:
                ax.annotate(label, (x, y), fontsize=6)
            hi = max(hi, *(max(p[0], p[1]) for p in pts))
    ax.plot([1, hi], [1, hi], color="black", lw=0.8, label="measured = predicted")
    ax.set(xlabel="predicted (1−α^(γ+1))/(1−α), α = accepted/(accepted+rejections)", ylabel="measured mean accepted length", title="Mean accepted length vs theory")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    written.append(_save(fig, out / "accepted_length_vs_theory.png"))

    # acceptance by draft position
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in overall:
        if r.per_position:
            xs = [i + 1 for i, v in enumerate(r.per_position) if v is not None]
            ys = [v for v in r.per_position if v is not None]
            ax.plot(xs, ys, marker=".", label=f"{r.config.label}, T={r.config.temperature}")
    ax.set(xlabel="draft position", ylabel="acceptance rate at the position", ylim=(0, 1.05), title="Acceptance by draft position")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    written.append(_save(fig, out / "acceptance_by_position.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_report(out: Path, runs: Sequence[Run], configs: Sequence[Config], meta: dict[str, Any],
                 extra: dict[str, Any] | None = None, with_plots: bool = True) -> dict[str, Path]:
    """Write report.json, report.md and the plots into `out`; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(runs, configs)
    theory = theory_rows(rows, ((extra or {}).get("costs") or {}).get("verification_curve"))
    report = {"meta": meta, "summary": [r.to_dict() for r in rows], "theory": theory,
              "runs": [r.to_dict() for r in runs], **(extra or {})}
    paths = {"json": out / "report.json", "md": out / "report.md"}
    tmp = paths["json"].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    tmp.replace(paths["json"])
    paths["md"].write_text(markdown(rows, meta, theory, (extra or {}).get("costs")))
    if with_plots and rows:
        for p in plots(rows, out):
            paths[p.stem] = p
    return paths
