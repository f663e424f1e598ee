"""Drift watch: acceptance per strategy over a sliding window against a baseline, the warning and the ratio in
/metrics, and the fall back to plain decoding while speculation does not pay -- and back again after a probe.
The pure DriftWatch first, then a live server fed a stream whose acceptance drops (its draft is scrambled) and
recovers."""

from __future__ import annotations

import logging
import re
import time

import httpx
import pytest
import torch

from tests.test_server import MODEL, PROMPTS, _load, complete, dirs, live, reference, settings  # noqa: F401
from verispec.server import create_app
from verispec.server.drift import DriftWatch, RoundSample

GOOD = RoundSample(drafted=4, accepted=4, emitted=5, draft_s=0.01, target_s=0.04)  # tau 5 > cost 1 x (1 + 0.25)
BAD = RoundSample(drafted=4, accepted=0, emitted=1, draft_s=0.01, target_s=0.04)  # tau 1 < 1.25


D, A = ("draft", "completions"), ("auto", "completions")  # drift keys: (strategy, route)


def test_drift_watch_warns_falls_back_probes_and_resumes(caplog):
    w = DriftWatch(window=10, drop=0.05, probe_every=6, probe=3)
    for _ in range(10):
        w.record(D, GOOD)
    assert w.alpha(D) == 1.0 and w.snapshot()[D]["baseline"] == 1.0 and w.speculating(D)
    with caplog.at_level(logging.INFO, logger="verispec.drift"):
        for _ in range(10):
            w.record(D, BAD)
    assert w.ratio(D) == 0.0
    assert "alpha for draft (completions) fell" in caplog.text and "no longer pays for draft (completions)" in caplog.text
    assert not w.speculating(D) and w.snapshot()[D]["fallback"]
    for _ in range(5):
        w.plain_round(D)
    assert not w.speculating(D)
    w.plain_round(D)  # the 6th plain round starts a probe of 3 speculative rounds
    assert w.speculating(D)
    for _ in range(3):
        w.record(D, GOOD)
    assert w.speculating(D) and not w.snapshot()[D]["fallback"]  # it pays again: resumed
    # a probe that still does not pay keeps the fallback
    for _ in range(10):
        w.record(D, BAD)
    assert not w.speculating(D)
    for _ in range(6):
        w.plain_round(D)
    for _ in range(3):
        w.record(D, BAD)
    assert not w.speculating(D)


def test_a_config_baseline_is_used_and_a_mild_fall_only_warns(caplog):
    w = DriftWatch(window=4, drop=0.05, baselines={"auto": 0.9})
    with caplog.at_level(logging.WARNING, logger="verispec.drift"):
        for _ in range(4):
            w.record(A, RoundSample(4, 3, 4, 0.01, 0.04))  # alpha 0.75 < 0.9 x 0.95, tau 4 still pays
    assert w.ratio(A) == pytest.approx(0.75 / 0.9) and "fell" in caplog.text and w.speculating(A)
    with pytest.raises(ValueError):
        DriftWatch(window=0)


def test_routes_are_watched_apart():
    """Chat traffic the draft is bad at falls back alone; the completions route keeps drafting, and a config's
    baseline (per strategy) applies to both."""
    w = DriftWatch(window=5, baselines={"draft": 1.0})
    for _ in range(5):
        w.record(("draft", "chat"), BAD)
        w.record(D, GOOD)
    assert not w.speculating(("draft", "chat")) and w.speculating(D)
    snap = w.snapshot()
    assert snap[("draft", "chat")]["fallback"] and not snap[D]["fallback"]
    assert snap[("draft", "chat")]["baseline"] == snap[D]["baseline"] == 1.0


class Scramble(torch.nn.Module):
    """A draft embedding that can be switched to noise: the draft then guesses at random (acceptance drops).
    delay: seconds added to every forward (a target made expensive beside its draft, as a real pair's is)."""

    def __init__(self, inner: torch.nn.Module, delay: float = 0.0) -> None:
        super().__init__()
        self.inner, self.on, self.delay = inner, False, delay

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        x = self.inner(tokens)
        return torch.randn_like(x) * 5 if self.on else x


def _gauge(text: str, name: str, strategy: str = "draft", route: str = "completions") -> float | None:
    m = re.search(rf'^verispec_{name}{{route="{route}",strategy="{strategy}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def test_server_drift_warning_metric_and_fallback(dirs, caplog):  # noqa: F811
    models = _load((dirs[0], dirs[0]))  # the draft is the target, 10 ms cheaper a forward: it pays until scrambled
    scramble = models.draft.model.embed = Scramble(models.draft.model.embed)
    models.target.model.embed = Scramble(models.target.model.embed, delay=0.01)
    app = create_app(settings(drift_window=20, max_concurrency=2), models=models)
    prompts = PROMPTS * 3
    with caplog.at_level(logging.INFO, logger="verispec.drift"), live(app) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        for text in prompts[:6]:  # a draft that agrees: the baseline
            complete(client, text, 40)
        page = client.get("/metrics").text
        baseline = _gauge(page, "drift_alpha_baseline")
        assert baseline is not None and baseline > 0.9 and _gauge(page, "drift_fallback") == 0.0, page
        scramble.on = True  # traffic the draft is bad at
        seen = []  # (alpha ratio, fallback) after each request
        drafted = []
        for text in prompts[:6]:
            out = complete(client, text, 40)
            assert out["choices"][0]["token_ids"] == reference(models, models.target.tokenizer.encode(text), 40)
            page = client.get("/metrics").text
            seen.append((_gauge(page, "drift_alpha_ratio"), _gauge(page, "drift_fallback")))
            drafted.append(out["usage"]["speculative"]["draft_tokens"])
        assert any(ratio < 0.95 and fallback == 1.0 for ratio, fallback in seen), seen
        assert "alpha for draft (completions) fell" in caplog.text
        assert "no longer pays for draft (completions)" in caplog.text
        # 40 tokens drafted 3 at a time is ~120 drafts at acceptance 0; plainly, only the probes' rounds draft
        assert min(drafted) < 40, drafted
        scramble.on = False  # the draft is good again: a probe finds it and speculation resumes
        for text in prompts:  # (the gauge reads 0 during a probe too: wait for the probe's verdict)
            complete(client, text, 40)
            if "pays again for draft (completions)" in caplog.text:
                break
        assert "pays again for draft (completions)" in caplog.text
        assert _gauge(client.get("/metrics").text, "drift_fallback") == 0.0
        assert complete(client, prompts[1], 40)["usage"]["speculative"]["draft_tokens"] > 0
