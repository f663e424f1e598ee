"""`verispec tune`: measure the strategies, gammas and precisions that apply on the user's prompts, within a time
budget, and keep the fastest as a config file that `generate`, `bench`, `serve` and `audit` read with `--config`.

Every candidate runs on the same prompts, interleaved prompt by prompt (drift in the machine's load hits all of
them alike); the budget is checked between prompts, so each candidate is measured on as many prompts as the
others. Beside each measurement stands the theory's prediction from what was measured for it (α, c) and this
machine's verification-cost curve: tokens/s of plain decoding × E[tokens per round] / (γ c + cost(γ + 1)).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from verispec.bench.runner import Config, Run
from verispec.theory import VerifyCost, predicted_speedup

CONFIG_VERSION = 1
# keys of a config file that a command's options take (bench reads strategy and gamma as its lists)
CONFIG_KEYS = ("target", "draft", "dtype", "draft_dtype", "strategy", "gamma", "drift_baseline")
# a config's "options": the chosen strategy's own flags as tune was given them, by their option names (drafter,
# eagle_tree, draft_confidence, ...), so that a config choosing `eagle+ngram` names its drafter


@dataclass(frozen=True)
class Candidate:
    """One configuration to measure: a strategy and gamma (a bench Config) on the models of one precision."""

    config: Config
    dtype: str = ""  # the target's precision ("": the one loaded, in tests)
    draft_dtype: str | None = None  # None: no draft model runs (plain decoding, or a strategy without one)


@dataclass
class Measured:
    """One candidate's runs summed over the prompts."""

    strategy: str
    gamma: int  # 0: plain decoding
    dtype: str = ""
    draft_dtype: str | None = None
    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    c: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.strategy + (f" γ={self.gamma}" if self.gamma else "")

    @property
    def precision(self) -> str:
        return self.dtype + (f" + {self.draft_dtype} draft" if self.draft_dtype else "")

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_c(self) -> float | None:
        return sum(self.c) / len(self.c) if self.c else None

    def add(self, run: Run) -> None:
        self.tokens += run.new_tokens
        self.seconds += run.seconds
        self.drafted += run.drafted or 0
        self.accepted += run.accepted or 0
        self.rounds += run.rounds or 0
        if run.c is not None:
            self.c.append(run.c)

    def predicted(self, plain_tokens_per_s: float, verify_cost: VerifyCost) -> float | None:
        """The theory's tokens/s for a fixed-γ chain with this α and c (None where it does not apply: plain
        decoding, or a strategy whose drafts per round vary)."""
        if self.gamma == 0 or self.alpha is None or self.strategy not in ("draft", "ngram", "draft+ngram",
                                                                          "layerskip", "eagle", "medusa"):
            return None
        alpha = min(self.alpha, 1 - 1e-9)
        return plain_tokens_per_s * predicted_speedup(alpha, self.gamma, self.mean_c or 0.0, verify_cost)


def candidates(strategies: Sequence[str], gammas: Sequence[int], precisions: Sequence[tuple[str, str | None]] = (("", None),),
               needs_draft: Callable[[str], bool] = lambda s: True) -> list[Candidate]:
    """Plain decoding on each target precision, then every drafting strategy at every gamma on every precision
    pair (target, draft); a strategy without a draft model once per target precision. Greedy (temperature 0)
    unless the caller replaces it."""
    out = [Candidate(Config("verispec", "ar", 0, 0.0), d) for d in dict.fromkeys(d for d, _ in precisions)]
    for dtype, draft_dtype in precisions:
        out += [Candidate(Config("verispec", s, g, 0.0), dtype, draft_dtype if needs_draft(s) else None)
                for s in strategies if s != "ar" for g in gammas]
    return list(dict.fromkeys(out))


def measure(candidates: Sequence[Candidate], prompts: Sequence[list[int]], run: Callable[[Candidate, list[int]], Run],
            budget_s: float, on_prompt: Callable[[int], None] | None = None) -> tuple[list[Measured], int]:
    """Run every candidate on prompt 0, then prompt 1, ... while the budget lasts (at least one prompt). Returns
    the sums per candidate and the number of prompts measured."""
    sums = [Measured(c.config.strategy, c.config.gamma, c.dtype, c.draft_dtype) for c in candidates]
    start, done = time.perf_counter(), 0
    for prompt in prompts:
        t0 = time.perf_counter()
        for candidate, total in zip(candidates, sums):
            total.add(run(candidate, prompt))
        done += 1
        if on_prompt is not None:
            on_prompt(done)
        per_prompt = time.perf_counter() - t0
        if time.perf_counter() - start + per_prompt > budget_s:
            break
    return sums, done


def best(measured: Sequence[Measured]) -> Measured:
    return max(measured, key=lambda m: m.tokens_per_s)


def table(measured: Sequence[Measured], cost_of: Callable[[str], VerifyCost]) -> str:
    """Markdown: each candidate's measured tokens/s, speedup over plain decoding on the same target precision, α,
    c and the theory's prediction (from that precision's verification-cost curve, `cost_of(dtype)`); a precision
    column where more than one was measured."""
    plain = {m.dtype: m.tokens_per_s for m in measured if m.gamma == 0}
    several = len({m.dtype for m in measured}) > 1 or len({m.draft_dtype for m in measured if m.draft_dtype}) > 1
    chosen = best(measured)
    head = "| candidate |" + (" precision |" if several else "") + " tok/s | × plain | α | c | theory tok/s |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for m in sorted(measured, key=lambda m: -m.tokens_per_s):
        base = plain.get(m.dtype, math.nan)
        pred = m.predicted(base, cost_of(m.dtype))
        alpha = "-" if m.alpha is None else f"{m.alpha:.3f}"
        c = "-" if m.mean_c is None else f"{m.mean_c:.3f}"
        mark = " ← chosen" if m is chosen else ""
        precision = f" {m.precision} |" if several else ""
        lines.append(f"| {m.label}{mark} |{precision} {m.tokens_per_s:.2f} | {m.tokens_per_s / base:.2f} | {alpha} | "
                     f"{c} | {'-' if pred is None else f'{pred:.2f}'} |")
    return "\n".join(lines)


def config_dict(chosen: Measured, models: dict[str, Any], measured: Sequence[Measured], prompts: int,
                machine: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """What `--config` reads (the CONFIG_KEYS: models' target and draft, the chosen candidate's precisions; the
    `options` of its strategy), and how it was chosen."""
    return {
        "verispec_config": CONFIG_VERSION,
        "target": models["target"], "draft": models["draft"],
        "dtype": chosen.dtype or models.get("dtype"), "draft_dtype": chosen.draft_dtype,
        "strategy": chosen.strategy,
        "gamma": chosen.gamma or None,
        # what `serve --config` judges acceptance drift against (verispec.server.drift)
        "drift_baseline": {chosen.strategy: round(chosen.alpha, 4)} if chosen.alpha is not None else None,
        "options": options or None,
        "chosen": {"tokens_per_s": round(chosen.tokens_per_s, 3), "prompts": prompts, "machine": machine,
                   "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")},
        "measured": [{**{k: v for k, v in asdict(m).items() if k != "c"}, "tokens_per_s": round(m.tokens_per_s, 3),
                      "alpha": m.alpha, "c": m.mean_c} for m in measured],
    }


def read_config(path: str | Path) -> dict[str, Any]:
    """The option values a config file sets (CONFIG_KEYS that are not null, then its strategy's "options"). Raises
    ValueError for a file that is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"cannot read the config {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"the config {path} is not JSON: {e}") from None
    if not isinstance(data, dict) or data.get("verispec_config") != CONFIG_VERSION:
        raise ValueError(f"{path} is not a verispec config (written by `verispec tune`)")
    options = data.get("options") or {}
    if not isinstance(options, dict):
        raise ValueError(f"the config {path}: \"options\" must be an object of option names and values")
    return {**{k: data[k] for k in CONFIG_KEYS if data.get(k) is not None},
            **{k: v for k, v in options.items() if v is not None and k not in CONFIG_KEYS}}
