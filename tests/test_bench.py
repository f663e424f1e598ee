"""The bench's statistics, run order, report schema, and the command end to end on tiny models."""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from tests.test_cli import run_inline
from tests.tiny_hf import make_tiny_hf_dir
from verispec.bench.report import ALL, summarize, theory_rows, write_report
from verispec.bench.runner import Config, Run, run_bench
from verispec.bench.stats import geomean, median, percentile, schedule
from verispec.bench.suite import BenchPrompt
from verispec.theory import expected_tokens


# ---- statistics ---------------------------------------------------------------------------------------------
def test_geomean_known_values():
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert geomean([1.0, 2.0, 4.0]) == pytest.approx(2.0)
    assert geomean([3.0]) == pytest.approx(3.0)
    assert geomean([]) is None
    with pytest.raises(ValueError):
        geomean([1.0, 0.0])


def test_percentile_matches_numpy():
    rng = random.Random(0)
    for n in (1, 2, 3, 10, 101, 1000):
        xs = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 1, 50, 90, 99, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert median([1, 2, 3, 4]) == 2.5
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_schedule_interleaves_and_rotates():
    n_prompts, n_configs, repeats = 4, 3, 2
    order = schedule(n_prompts, n_configs, repeats)
    assert len(order) == n_prompts * n_configs * repeats
    blocks = [order[i : i + n_configs] for i in range(0, len(order), n_configs)]
    for b in blocks:  # a block is one prompt and repeat, every configuration once, back to back
        assert len({(p, r) for p, r, _ in b}) == 1
        assert sorted(c for _, _, c in b) == list(range(n_configs))
    # repeats are the outer loop: all prompts once before any runs twice
    assert [b[0][:2] for b in blocks] == [(p, r) for r in range(repeats) for p in range(n_prompts)]
    # the first configuration rotates, so over n_configs blocks each one starts once
    assert sorted(b[0][2] for b in blocks[:n_configs]) == list(range(n_configs))
    assert schedule(2, 3, 1) == [(0, 0, 0), (0, 0, 1), (0, 0, 2), (1, 0, 1), (1, 0, 2), (1, 0, 0)]


# ---- summaries from synthetic runs --------------------------------------------------------------------------
AR = Config("verispec", "ar", 0, 0.0)
D2 = Config("verispec", "draft", 2, 0.0)
HF_AR = Config("hf", "ar", 0, 0.0)
HF_AS = Config("hf", "assisted", 2, 0.0)


def _run(config: Config, prompt: str, seconds: float, tokens: list[int], *, cat: str = "code", drafted=None,
         accepted=None, rounds=None, per_pos=((), ()), c=None, rejections=None) -> Run:
    n = len(tokens)
    arrivals = [(seconds * (i + 1) / n, 1) for i in range(n)]
    return Run(prompt_id=prompt, category=cat, config=config, rep=0, token_ids=tokens, seconds=seconds,
               arrivals=arrivals, rounds=rounds, drafted=drafted, accepted=accepted,
               drafted_per_position=list(per_pos[0]), accepted_per_position=list(per_pos[1]), c=c,
               rejections=rejections)


def test_token_latencies_spread_a_gap_over_the_tokens_it_brought():
    r = Run("p", "c", AR, 0, [1] * 6, 1.0, arrivals=[(0.1, 2), (0.3, 1), (0.6, 3)])
    assert r.ttft == 0.1
    assert r.token_latencies() == pytest.approx([0.2, 0.1, 0.1, 0.1])


def test_summary_ratios_pooling_and_differences():
    toks = list(range(10))
    runs = [
        _run(AR, "a", 10.0, toks), _run(AR, "b", 10.0, toks, cat="chat"),
        # prompt a: 2x faster, same output; prompt b: 0.5x, a different output
        _run(D2, "a", 5.0, toks, drafted=8, accepted=6, rounds=4, per_pos=((4, 4), (4, 2)), c=0.2),
        _run(D2, "b", 20.0, toks[:-1] + [99], cat="chat", drafted=4, accepted=1, rounds=2, per_pos=((2, 2), (1, 0)), c=0.4),
        _run(HF_AR, "a", 20.0, toks), _run(HF_AR, "b", 40.0, toks, cat="chat"),
        _run(HF_AS, "a", 10.0, toks, rounds=5), _run(HF_AS, "b", 10.0, toks, cat="chat", rounds=5),
    ]
    rows = {(r.config.label, r.category): r for r in summarize(runs, [AR, D2, HF_AR, HF_AS])}
    d = rows[("draft γ=2", ALL)]
    assert d.runs == 2
    assert d.speedup_geomean == pytest.approx(1.0)  # sqrt(2 * 0.5)
    assert d.speedup_median == pytest.approx(1.25)
    assert d.alpha == pytest.approx(7 / 12)  # pooled: (6 + 1) / (8 + 4)
    assert d.mean_accepted_length == pytest.approx(20 / 6)
    assert d.per_position == pytest.approx([5 / 6, 2 / 6])
    assert d.tokens_per_s == pytest.approx(20 / 25)
    assert d.c == pytest.approx(0.3)
    assert d.differ == 1
    assert rows[("draft γ=2", "code")].speedup_geomean == pytest.approx(2.0)
    assert rows[("draft γ=2", "chat")].differ == 1
    assert rows[("ar", ALL)].speedup_geomean == pytest.approx(1.0)
    hf = rows[("hf assisted γ=2", ALL)]
    assert hf.own_speedup_geomean == pytest.approx(math.sqrt(2 * 4))  # over hf's own plain decoding
    assert hf.speedup_geomean == pytest.approx(1.0)  # over ours
    assert hf.alpha is None and hf.mean_accepted_length == pytest.approx(2.0)
    assert rows[("ar", ALL)].latency_p50_ms == pytest.approx(1000.0)


def test_theory_rows_predict_from_measured_alpha():
    runs = [_run(AR, "a", 10.0, list(range(12)))]
    for g, secs in ((2, 6.0), (4, 4.0)):
        cfg = Config("verispec", "draft", g, 0.0)
        # 8g accepted and 2g rejections: per-token alpha 0.8 (while accepted / drafted is 0.8 only by design)
        runs.append(_run(cfg, "a", secs, list(range(12)), drafted=10 * g, accepted=8 * g, rounds=4, c=0.25,
                         rejections=2 * g))
    (t,) = theory_rows(summarize(runs, [AR] + [r.config for r in runs[1:]]))
    assert t["strategy"] == "draft" and t["best_measured_gamma"] == 4
    g2 = t["per_gamma"][0]
    assert g2["alpha"] == pytest.approx(0.8)
    assert g2["predicted_mean_accepted_length"] == pytest.approx(expected_tokens(0.8, 2), abs=1e-3)
    assert t["optimal_gamma"] >= 2
    assert g2["predicted_speedup_verify_cost"] is None and t["optimal_gamma_verify_cost"] is None


def test_theory_alpha_is_per_token_not_per_draft():
    """A chain stops testing at its first rejection: with gamma 4, rounds accepting 2 then rejecting leave
    drafts 4 and 5 untested. accepted / drafted = 0.5, but the i.i.d. model's alpha is 2 / 3 (2 accepted per
    rejection), and only that alpha predicts the measured 3 tokens per round."""
    cfg = Config("verispec", "draft", 4, 0.0)
    runs = [_run(AR, "a", 10.0, list(range(30))),
            _run(cfg, "a", 5.0, list(range(30)), drafted=40, accepted=20, rounds=10, rejections=10,
                 per_pos=((10,) * 4, (10, 10, 0, 0)), c=0.1)]
    (row,) = [r for r in summarize(runs, [AR, cfg]) if r.config == cfg and r.category == ALL]
    assert row.alpha == pytest.approx(0.5) and row.alpha_iid == pytest.approx(2 / 3)
    (t,) = theory_rows([row])
    assert t["per_gamma"][0]["alpha"] == pytest.approx(2 / 3, abs=1e-3)
    # older records without a rejection count: estimated from the per-position counts, exact for a fixed gamma
    runs[1].rejections = None
    (old,) = [r for r in summarize(runs, [AR, cfg]) if r.config == cfg and r.category == ALL]
    assert old.alpha_iid == pytest.approx(2 / 3)


def test_theory_with_measured_verification_cost():
    cfg = Config("verispec", "draft", 8, 0.0)
    runs = [_run(AR, "a", 10.0, list(range(30))),
            _run(cfg, "a", 5.0, list(range(30)), drafted=80, accepted=72, rounds=10, rejections=3, c=0.1)]
    curve = [{"tokens": 1, "relative_to_1": 1.0}, {"tokens": 8, "relative_to_1": 1.5},
             {"tokens": 16, "relative_to_1": 2.0}]
    (t,) = theory_rows(summarize(runs, [AR, cfg]), curve)
    (g8,) = t["per_gamma"]
    a = 72 / 75
    assert g8["predicted_speedup"] == pytest.approx(expected_tokens(a, 8) / (8 * 0.1 + 1.0), abs=1e-3)
    v9 = 1.5 + 0.5 / 8  # 9 tokens: between the measured 8 and 16
    assert g8["predicted_speedup_verify_cost"] == pytest.approx(expected_tokens(a, 8) / (8 * 0.1 + v9), abs=1e-3)
    assert t["optimal_gamma_verify_cost"] < t["optimal_gamma"]  # a costlier wide forward calls for shorter drafts


def test_verification_curve_takes_the_sizes_in_turn():
    """The curve's sizes are timed round-robin after one warm-up each, so a drift in the machine's speed during
    the measurement reaches every size alike; no forward moves the cache off the context it was filled to."""
    import torch

    from verispec.bench.costs import verification_curve

    class Cache:
        def __init__(self) -> None:
            self.length = 0

        def commit(self, n: int) -> None:
            self.length += n

    class Model:
        vocab_size, device = 50, torch.device("cpu")

        def __init__(self) -> None:
            self.calls: list[tuple[int, int]] = []  # (tokens, cache length) of each forward
            self.cache = Cache()

        def new_cache(self, capacity: int) -> Cache:
            assert capacity >= 10 + 4 + 1
            return self.cache

        def forward(self, x: torch.Tensor, cache: Cache, last_n: int | None = None) -> torch.Tensor:
            self.calls.append((x.shape[1], cache.length))
            return torch.zeros(1, x.shape[1] if last_n is None else last_n, self.vocab_size)

    model = Model()
    curve = verification_curve(model, context=10, sizes=(1, 2, 4), reps=3)
    sizes = [k for k, _ in model.calls]
    assert sizes == [10] + [1, 2, 4] + [1, 2, 4] * 3  # the prefill, one warm-up each, then the sizes in turn
    assert all(length == 10 for _, length in model.calls[1:])
    assert [row["tokens"] for row in curve] == [1, 2, 4] and curve[0]["relative_to_1"] == 1.0


def test_bandwidth_limit_pairs_each_step_with_a_read(tiny_target, monkeypatch):
    """With a step to time, the step and the buffer's read take turns and the ratio is the median of each pair's:
    steps at 2x, 2x and 3x their pairs' limits read 2.0, where the medians' ratio would read 3.0 and the best read
    6.0."""
    from verispec.bench import costs
    from verispec.models.base import weight_bytes_per_token

    calls: list[str] = []
    step = costs.decoding_step(tiny_target, context=8)
    nbytes = weight_bytes_per_token(tiny_target)

    def counted() -> None:
        calls.append("step")
        step()

    out = costs.bandwidth_limit(tiny_target, step=counted, reps=3, size_mb=1)
    assert calls == ["step"] * 3
    assert set(out) >= {"read_bandwidth_gb_s", "limit_ms_per_token", "measured_step_ms", "step_over_limit"}
    assert out["step_over_limit"] > 0 and out["weight_bytes"] == nbytes

    # the pairing itself: the memory's speed moves between pairs (reads of 1, 4 and 2 ms)
    buf = 2**20  # size_mb=1
    reads = iter([1e-3, 4e-3, 2e-3])
    steps = iter([times * nbytes * r / buf for times, r in ((2, 1e-3), (2, 4e-3), (3, 2e-3))])
    order: list[str] = []

    def fake_timed(fn, device) -> float:
        is_step = fn is counted
        order.append("step" if is_step else "read")
        return next(steps) if is_step else next(reads)

    monkeypatch.setattr(costs, "_timed", fake_timed)
    out = costs.bandwidth_limit(tiny_target, step=counted, reps=3, size_mb=1)
    assert order == ["step", "read"] * 3
    assert out["step_over_limit"] == 2.0


def test_report_schema(tmp_path: Path):
    runs = [_run(AR, "a", 10.0, [1, 2]), _run(D2, "a", 5.0, [1, 2], drafted=2, accepted=1, rounds=1, c=0.2)]
    paths = write_report(tmp_path, runs, [AR, D2], {"started": "now"})
    report = json.loads(paths["json"].read_text())
    assert set(report) >= {"meta", "summary", "theory", "runs"}
    row = next(r for r in report["summary"] if r["config"] == "draft γ=2" and r["category"] == ALL)
    for key in ("tokens_per_s", "alpha", "mean_accepted_length", "per_position_acceptance", "speedup_median",
                "speedup_geomean", "latency_p50_ms", "latency_p99_ms", "ttft_ms", "differ_from_ar", "c"):
        assert key in row
    assert len(report["runs"]) == 2 and report["runs"][1]["token_ids"] == [1, 2]
    for name in ("speedup_vs_gamma", "accepted_length_vs_theory", "acceptance_by_position"):
        assert paths[name].stat().st_size > 1000
    assert "| draft γ=2 |" in paths["md"].read_text()


def test_interrupt_keeps_what_was_measured():
    class Backend:
        calls = 0

        def run(self, config, prompt, max_new_tokens, seed):
            Backend.calls += 1
            if Backend.calls > 3:
                raise KeyboardInterrupt
            return _run(config, "x", 1.0, [1])

    prompts = [BenchPrompt(id=f"p{i}", category="c", messages=({"role": "user", "content": "x"},)) for i in range(3)]
    out = run_bench(prompts, lambda p: [1], [AR, D2], {"verispec": Backend()}, max_new_tokens=4, warmup=False,
                    progress=False)
    assert out.interrupted and len(out.runs) == 3
    assert [(r.prompt_id, r.config.label) for r in out.runs] == [("p0", "ar"), ("p0", "draft γ=2"), ("p1", "draft γ=2")]


# ---- the command on tiny models -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    target = make_tiny_hf_dir(root / "target", seed=0)
    return target, make_tiny_hf_dir(root / "draft", seed=1, noise_from=target)


@pytest.fixture()
def prompts_file(tmp_path: Path) -> Path:
    lines = [{"prompt": "def x ( a ) :", "category": "code"}, {"prompt": "if a + 1 :", "category": "code"},
             {"prompt": "print ( y )", "category": "chat"}]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_bench_command_end_to_end(pair, prompts_file, tmp_path, capsys):
    target, draft = pair
    out = tmp_path / "report"
    code, stdout, err = run_inline(
        capsys, "bench", "--target", str(target), "--draft", str(draft), "--dtype", "float32",
        "--strategies", "draft", "--gamma", "1,3", "--temperature", "0,1", "--max-new-tokens", "12",
        "--prompts", str(prompts_file), "--peers", "hf", "--out", str(out),
    )
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    labels = {(r["config"], r["temperature"]) for r in report["summary"]}
    for t in (0.0, 1.0):
        assert {("ar", t), ("draft γ=1", t), ("draft γ=3", t), ("hf ar", t), ("hf assisted γ=1", t)} <= labels
    assert len(report["runs"]) == 2 * 6 * 3  # 2 temperatures x 6 configurations x 3 prompts
    assert len((out / "runs.jsonl").read_text().splitlines()) == len(report["runs"])
    for row in report["summary"]:
        if row["system"] == "verispec" and row["temperature"] == 0:
            assert row["differ_from_ar"] == 0, row  # greedy speculation reproduces plain decoding
        if row["strategy"] == "draft":
            assert 0 <= row["alpha"] <= 1
    assert {r["category"] for r in report["summary"]} == {"code", "chat", ALL}
    assert "## greedy: all prompts" in stdout and "## temperature 1.0: all prompts" in stdout
    assert (out / "speedup_vs_gamma.png").exists()
    # the theory command reads the report back
    code, stdout, _ = run_inline(capsys, "theory", "--report", str(out))
    assert code == 0 and "draft, T=0.0: measured per-token alpha" in stdout
    # --rerender rebuilds the same report from the recorded runs alone
    (out / "report.json").unlink()
    (out / "report.md").unlink()
    code, stdout, err = run_inline(capsys, "bench", "--rerender", str(out))
    assert code == 0, err
    again = json.loads((out / "report.json").read_text())
    timing = ("tokens_per_s", "speedup", "own_speedup", "latency", "ttft", "c")  # runs.jsonl rounds seconds
    assert len(again["summary"]) == len(report["summary"])
    for a, b in zip(again["summary"], report["summary"]):
        assert {k: v for k, v in a.items() if not k.startswith(timing)} == \
               {k: v for k, v in b.items() if not k.startswith(timing)}
        assert a["tokens_per_s"] == pytest.approx(b["tokens_per_s"], rel=0.02)
    assert "## greedy: all prompts" in stdout
    # results folders keep these files gzipped: theory and --rerender read them so
    for name in ("report.json", "runs.jsonl"):
        (out / (name + ".gz")).write_bytes(gzip.compress((out / name).read_bytes()))
        (out / name).unlink()
    code, stdout, _ = run_inline(capsys, "theory", "--report", str(out))
    assert code == 0 and "draft, T=0.0: measured per-token alpha" in stdout
    (out / "report.md").unlink()
    code, _, err = run_inline(capsys, "bench", "--rerender", str(out))
    assert code == 0, err
    assert len(json.loads((out / "report.json").read_text())["runs"]) == len(report["runs"])
    code, _, err = run_inline(capsys, "bench", "--rerender", str(tmp_path / "nothing-here"))
    assert code == 2 and "no recorded runs" in err and len(err.strip().splitlines()) == 1


def test_bench_synthetic_on_random_weights(pair, prompts_file, tmp_path, capsys):
    """random:DIR + --synthetic: the GPU speed mode. Acceptance follows the error rate asked for, and greedy
    output still equals plain decoding."""
    target, draft = pair
    out = tmp_path / "report"
    code, _, err = run_inline(
        capsys, "bench", "--target", f"random:{target}", "--draft", f"random:{draft}", "--dtype", "float32",
        "--strategies", "draft", "--gamma", "4", "--max-new-tokens", "60", "--synthetic", "0",
        "--prompts", str(prompts_file), "--out", str(out), "--no-warmup",
    )
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    row = next(r for r in report["summary"] if r["config"] == "draft γ=4" and r["category"] == ALL)
    assert row["alpha"] == 1.0 and row["differ_from_ar"] == 0
    assert "synthetic" in report["meta"]


@pytest.mark.parametrize("flags, message", [
    (["--synthetic", "0.2", "--temperature", "0.7"], "greedy only"),
    (["--synthetic", "2"], "error rate in [0, 1]"),
    (["--synthetic", "0.2", "--peers", "hf"], "drop --peers"),
    (["--device", "tpu"], "--device must be"),
    (["--gamma", "0"], "--gamma and --peer-gamma values must be >= 1"),
    (["--peers", "llama.cpp", "--peer-gamma", "0"], "--gamma and --peer-gamma values must be >= 1"),
    (["--peers", "llama.cpp", "--peer-strategies", "ar,lookup"], "unknown peer configuration 'lookup'"),
    (["--peer-strategies", "ar"], "give --peers too"),
    (["--peers", "llama.cpp", "--peer-gamma", "2,openvino:4"], "names 'openvino', which is not among --peers"),
    (["--peers", "llama.cpp", "--peer-gamma", "llama.cpp:x"], "'llama.cpp:x' is not a gamma"),
    (["--peers", "llama.cpp", "--peer-gamma", "llama.cpp:0"], "--gamma and --peer-gamma values must be >= 1"),
    (["--gamma", "a,b"], "--gamma: 'a' is not a gamma"),
    (["--gamma", "4,eagle:2"], "--gamma names 'eagle', which is not among --strategies (ar, draft)"),
    (["--gamma", "draft:x"], "'draft:x' is not a gamma"),
    (["--gamma", "draft:0"], "--gamma and --peer-gamma values must be >= 1"),
    (["--strategies", "draft,ngram", "--gamma", "ngram:3"], "--gamma gives no gamma for draft"),
    (["--temperature", "3"], "in [0, 2]"),
    (["--temperature", "nan"], "in [0, 2]"),
    (["--peers", "vllm"], "unknown peer 'vllm'"),
    (["--strategies", "magic"], "unknown strategy 'magic'"),
    (["--prompts", "/nonexistent/p.jsonl"], "does not exist"),
    (["--repeats", "0"], "must be >= 1"),
])
def test_bench_bad_input_is_one_line(pair, flags, message, tmp_path, capsys):
    target, draft = pair
    code, _, err = run_inline(capsys, "bench", "--target", str(target), "--draft", str(draft), "--out",
                              str(tmp_path / "r"), *flags)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
