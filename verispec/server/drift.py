"""Drift watch: does speculation still pay on the traffic this server sees?

Per strategy and route (a key: ("draft", "chat"), ("auto", "completions"): chat and completion traffic differ in
how predictable they are), a sliding window of the last `window` speculative rounds (one per row and round): tokens drafted
and accepted, tokens emitted, the row's draft seconds and its share of the target forward. From it

    α = accepted / drafted,  τ = emitted / rounds (tokens per target forward),  c = draft s / target s,

and the average drafts per round γ̄. The baseline α is the one `verispec tune` measured for the strategy (a
`--config` file; the same for every route) or, failing that, the key's first full window of traffic. A fall of α below (1 - drop) × baseline logs
a warning once per excursion; /metrics shows α, the baseline and their ratio.

Speculation pays while a round's tokens are worth its cost: τ > cost(γ̄ + 1) × (1 + c), with cost(k) the
target's verification cost of k tokens relative to one (this machine's curve). When a full window says it does
not, the key's rows decode plainly (`fallback`); every `probe_every` plain rounds, `probe` rounds speculate
again to measure afresh, and speculation resumes when they pay.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from verispec.theory import VerifyCost, flat_cost

log = logging.getLogger("verispec.drift")

Key = tuple[str, str]  # (strategy, route)


def _name(key: Key) -> str:
    return f"{key[0]} ({key[1]})"


@dataclass(frozen=True)
class RoundSample:
    drafted: int
    accepted: int
    emitted: int
    draft_s: float
    target_s: float


def _add(a: RoundSample, b: RoundSample, sign: int) -> RoundSample:
    return RoundSample(a.drafted + sign * b.drafted, a.accepted + sign * b.accepted, a.emitted + sign * b.emitted,
                       a.draft_s + sign * b.draft_s, a.target_s + sign * b.target_s)


@dataclass
class _Watched:
    window: deque = field(default_factory=deque)
    # the window's sums, kept as samples come and go (read every round: not summed again each time)
    totals: RoundSample = RoundSample(0, 0, 0, 0.0, 0.0)
    baseline: float | None = None
    warned: bool = False
    fallback: bool = False
    plain_rounds: int = 0  # rounds decoded plainly since the fallback began or the last probe ended
    probing: int = 0  # speculative rounds left in the current probe


class DriftWatch:
    def __init__(self, *, window: int = 200, drop: float = 0.05, fall_back: bool = True,
                 baselines: dict[str, float] | None = None, verify_cost: VerifyCost = flat_cost,
                 probe_every: int = 100, probe: int = 20) -> None:
        if window < 1 or not 0 < drop < 1 or probe < 1 or probe_every < 1:
            raise ValueError("drift window, probe and probe interval must be >= 1, drop in (0, 1)")
        self.window, self.drop, self.fall_back = window, drop, fall_back
        self.verify_cost, self.probe_every, self.probe = verify_cost, probe_every, probe
        self.keys: dict[Key, _Watched] = {}
        self.baselines = dict(baselines or {})  # per strategy, for each of its routes

    def _get(self, key: Key) -> _Watched:
        if key not in self.keys:
            self.keys[key] = _Watched(baseline=self.baselines.get(key[0]))
        return self.keys[key]

    # ---- what the scheduler calls ------------------------------------------------------------------------
    def speculating(self, key: Key) -> bool:
        """Whether rows of this strategy and route draft in the next round."""
        s = self._get(key)
        return not s.fallback or s.probing > 0

    def plain_round(self, key: Key) -> None:
        """A round in which the key's rows decoded plainly because of a fallback: count towards a probe."""
        s = self._get(key)
        if s.fallback and s.probing == 0:
            s.plain_rounds += 1
            if s.plain_rounds >= self.probe_every:
                s.plain_rounds, s.probing = 0, self.probe
                s.window.clear()  # the probe measures afresh
                s.totals = RoundSample(0, 0, 0, 0.0, 0.0)
                log.info("speculation probe for %s: %d rounds", _name(key), self.probe)

    def record(self, key: Key, sample: RoundSample) -> None:
        """One row's speculative round."""
        s = self._get(key)
        s.window.append(sample)
        s.totals = _add(s.totals, sample, 1)
        if len(s.window) > self.window:
            s.totals = _add(s.totals, s.window.popleft(), -1)
        if s.probing:
            s.probing -= 1
            if s.probing == 0:
                self._check_alpha(key, s)
                self._end_probe(key, s)
            return
        if len(s.window) < self.window:
            return
        if s.baseline is None:
            s.baseline = self.alpha(key)
            log.info("drift baseline for %s: alpha %.3f over %d rounds", _name(key), s.baseline or 0.0, self.window)
        self._check_alpha(key, s)
        if self.fall_back and not s.fallback and not self.pays(key):
            s.fallback, s.plain_rounds = True, 0
            log.warning("speculation no longer pays for %s (tokens per forward %.2f, alpha %.3f): decoding plainly, "
                        "probing every %d rounds", _name(key), self.tokens_per_forward(key) or 0.0,
                        self.alpha(key) or 0.0, self.probe_every)

    def _end_probe(self, key: Key, s: _Watched) -> None:
        if self.pays(key):
            s.fallback = False
            log.warning("speculation pays again for %s (tokens per forward %.2f): resumed", _name(key),
                        self.tokens_per_forward(key) or 0.0)

    def _check_alpha(self, key: Key, s: _Watched) -> None:
        ratio = self.ratio(key)
        if ratio is None:
            return
        if ratio < 1 - self.drop and not s.warned:
            s.warned = True
            log.warning("alpha for %s fell to %.3f, %.0f%% below its baseline %.3f", _name(key),
                        self.alpha(key) or 0.0, 100 * (1 - ratio), s.baseline or 0.0)
        elif ratio >= 1 - self.drop:
            s.warned = False

    # ---- figures -----------------------------------------------------------------------------------------
    def _sums(self, key: Key) -> RoundSample | None:
        s = self._get(key)
        return s.totals if s.window else None

    def alpha(self, key: Key) -> float | None:
        t = self._sums(key)
        return t.accepted / t.drafted if t is not None and t.drafted else None

    def ratio(self, key: Key) -> float | None:
        alpha, baseline = self.alpha(key), self._get(key).baseline
        return alpha / baseline if alpha is not None and baseline else None

    def tokens_per_forward(self, key: Key) -> float | None:
        t = self._sums(key)
        return t.emitted / len(self._get(key).window) if t is not None else None

    def pays(self, key: Key) -> bool:
        """τ > cost(γ̄ + 1) × (1 + c) over the window (True while there is nothing to judge by)."""
        t, n = self._sums(key), len(self._get(key).window)
        if t is None or t.target_s <= 0:
            return True
        gamma = t.drafted / n
        c = t.draft_s / t.target_s
        return t.emitted / n > self.verify_cost(max(1, round(gamma + 1))) * (1 + c)

    def snapshot(self) -> dict[Key, dict[str, float | None | bool]]:
        return {key: {"alpha": self.alpha(key), "baseline": s.baseline, "ratio": self.ratio(key),
                      "tokens_per_forward": self.tokens_per_forward(key), "fallback": s.fallback and not s.probing}
                for key, s in self.keys.items()}
