"""`verispec tune`: measure the strategies and gammas that apply on the user's prompts, within a time budget, and
keep the fastest as a config file that `generate`, `bench`, `serve` and `audit` read with `--config`.

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


@dataclass
class Measured:
    """One candidate's runs summed over the prompts."""

    strategy: str
    gamma: int  # 0: plain decoding
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


def candidates(strategies: Sequence[str], gammas: Sequence[int]) -> list[Config]:
    """Plain decoding, then every drafting strategy at every gamma (greedy: tuned at temperature 0 unless asked)."""
    out = [Config("verispec", "ar", 0, 0.0)]
    out += [Config("verispec", s, g, 0.0) for s in strategies if s != "ar" for g in gammas]
    return out


def measure(configs: Sequence[Config], prompts: Sequence[list[int]], run: Callable[[Config, list[int]], Run],
            budget_s: float, on_prompt: Callable[[int], None] | None = None) -> tuple[list[Measured], int]:
    """Run every config on prompt 0, then prompt 1, ... while the budget lasts (at least one prompt). Returns the
    sums per config and the number of prompts measured."""
    sums = [Measured(c.strategy, c.gamma) for c in configs]
    start, done = time.perf_counter(), 0
    for prompt in prompts:
        t0 = time.perf_counter()
        for config, total in zip(configs, sums):
            total.add(run(config, prompt))
        done += 1
        if on_prompt is not None:
            on_prompt(done)
        per_prompt = time.perf_counter() - t0
        if time.perf_counter() - start + per_prompt > budget_s:
            break
    return sums, done


def best(measured: Sequence[Measured]) -> Measured:
    return max(measured, key=lambda m: m.tokens_per_s)


def table(measured: Sequence[Measured], verify_cost: VerifyCost) -> str:
    """Markdown: each candidate's measured tokens/s, speedup, α, c and the theory's prediction."""
    plain = next((m for m in measured if m.gamma == 0), None)
    base = plain.tokens_per_s if plain else math.nan
    chosen = best(measured)
    lines = ["| candidate | tok/s | × plain | α | c | theory tok/s |", "|---|---|---|---|---|---|"]
    for m in sorted(measured, key=lambda m: -m.tokens_per_s):
        pred = m.predicted(base, verify_cost)
        alpha = "-" if m.alpha is None else f"{m.alpha:.3f}"
        c = "-" if m.mean_c is None else f"{m.mean_c:.3f}"
        mark = " ← chosen" if m is chosen else ""
        lines.append(f"| {m.label}{mark} | {m.tokens_per_s:.2f} | {m.tokens_per_s / base:.2f} | {alpha} | {c} | "
                     f"{'-' if pred is None else f'{pred:.2f}'} |")
    return "\n".join(lines)


def config_dict(chosen: Measured, models: dict[str, Any], measured: Sequence[Measured], prompts: int,
                machine: str) -> dict[str, Any]:
    """What `--config` reads (the CONFIG_KEYS), and how it was chosen."""
    return {
        "verispec_config": CONFIG_VERSION,
        **{k: models[k] for k in ("target", "draft", "dtype", "draft_dtype")},
        "strategy": chosen.strategy,
        "gamma": chosen.gamma or None,
        # what `serve --config` judges acceptance drift against (verispec.server.drift)
        "drift_baseline": {chosen.strategy: round(chosen.alpha, 4)} if chosen.alpha is not None else None,
        "chosen": {"tokens_per_s": round(chosen.tokens_per_s, 3), "prompts": prompts, "machine": machine,
                   "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")},
        "measured": [{**{k: v for k, v in asdict(m).items() if k != "c"}, "tokens_per_s": round(m.tokens_per_s, 3),
                      "alpha": m.alpha, "c": m.mean_c} for m in measured],
    }


def read_config(path: str | Path) -> dict[str, Any]:
    """The option values a config file sets (CONFIG_KEYS that are not null). Raises ValueError for a file that is
    not one."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"cannot read the config {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"the config {path} is not JSON: {e}") from None
    if not isinstance(data, dict) or data.get("verispec_config") != CONFIG_VERSION:
        raise ValueError(f"{path} is not a verispec config (written by `verispec tune`)")
    return {k: data[k] for k in CONFIG_KEYS if data.get(k) is not None}
