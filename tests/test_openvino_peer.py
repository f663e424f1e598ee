"""The OpenVINO GenAI peer of `verispec bench`, against a stand-in runtime (openvino-genai is an optional extra and
the exported models take minutes to make): what it asks the runtime for, how it reads the streamed tokens back,
and the bench command around it. The real runtime ran on the real pair for benchmarks/results/."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from tests.test_bench import pair, prompts_file  # noqa: F401 (fixtures)
from tests.test_cli import run_inline
from verispec.bench.runner import Config, OpenVinoBackend
from verispec.cli.bench import build_configs, openvino_dir

EOS = 2


class Runtime:
    """openvino and openvino_genai as far as the peer uses them. Each pipeline streams max_new_tokens tokens
    (num_assistant_tokens + 1 at a time where it drafts), an end-of-sequence id after `eos_after` of them if set;
    a drafting pipeline's first `fail_sampled` sampled calls raise mid-stream, as openvino-genai 2026.4.1 does."""

    def __init__(self, eos_after: int | None = None, fail_sampled: int = 0) -> None:
        self.pipelines: list[tuple[str, dict]] = []
        self.calls: list[dict] = []
        runtime = self
        genai = types.ModuleType("openvino_genai")

        class StreamingStatus:
            RUNNING = 0

        class StreamerBase:
            pass

        class SchedulerConfig:
            enable_prefix_caching = False

        class TokenizedInputs:
            def __init__(self, input_ids, attention_mask) -> None:
                self.input_ids = input_ids

        class LLMPipeline:
            def __init__(self, path, device, **kwargs) -> None:
                runtime.pipelines.append((str(path), kwargs))
                self.fails = fail_sampled if ("draft_model" in kwargs or "prompt_lookup" in kwargs) else 0
                self.step = kwargs.get("draft_model") or kwargs.get("prompt_lookup")

            def get_generation_config(self):
                return types.SimpleNamespace(max_new_tokens=20, stop_token_ids=set(), do_sample=False, temperature=1.0,
                                             top_p=1.0, rng_seed=0, repetition_penalty=1.1, num_assistant_tokens=0,
                                             max_ngram_size=0)

            def generate(self, inputs, gen, streamer) -> None:
                runtime.calls.append(dict(vars(gen)))
                prompt = inputs.input_ids.data.reshape(-1).tolist()
                out = [10 + (sum(prompt) + i) % 40 for i in range(gen.max_new_tokens)]
                if eos_after is not None and eos_after < len(out):
                    out[eos_after:] = [EOS] + out[eos_after:][:-1]
                width = gen.num_assistant_tokens + 1 if self.step else 1
                for i in range(0, len(out), width):
                    chunk = out[i:i + width]
                    streamer.write(chunk if len(chunk) > 1 else chunk[0])
                    if gen.do_sample and self.fails:
                        self.fails -= 1
                        raise RuntimeError("Check 'content_length <= prompt_ids.size() + m_generated_ids.size()' failed")
                streamer.end()

        genai.StreamingStatus, genai.StreamerBase, genai.SchedulerConfig = StreamingStatus, StreamerBase, SchedulerConfig
        genai.TokenizedInputs, genai.LLMPipeline = TokenizedInputs, LLMPipeline
        genai.draft_model = lambda path, device, **props: ("draft", str(path), props)
        ov = types.ModuleType("openvino")
        ov.Tensor = lambda array: types.SimpleNamespace(data=np.asarray(array))
        self.modules = {"openvino_genai": genai, "openvino": ov}


@pytest.fixture()
def runtime(monkeypatch):
    def install(**kwargs) -> Runtime:
        r = Runtime(**kwargs)
        for name, module in r.modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        return r
    return install


def test_each_strategy_asks_for_its_pipeline_without_a_prefix_cache(runtime):
    rt = runtime()
    backend = OpenVinoBackend("T", "D", eos_ids=[EOS], threads=3, ngram_max=4)
    for strategy in ("ar", "speculative", "prompt_lookup", "ar"):
        backend.run(Config("openvino", strategy, 3, 0.0), [5, 6, 7], 8, seed=0)
    assert len(rt.pipelines) == 3  # one pipeline a strategy, reused
    (p0, ar), (p1, spec), (p2, lookup) = rt.pipelines
    assert p0 == p1 == p2 == "T"
    for kwargs in (ar, spec, lookup):
        assert kwargs["INFERENCE_NUM_THREADS"] == 3 and kwargs["scheduler_config"].enable_prefix_caching is False
    assert spec["draft_model"] == ("draft", "D", {"INFERENCE_NUM_THREADS": 3}) and "prompt_lookup" not in spec
    assert lookup["prompt_lookup"] is True and "draft_model" not in lookup and "draft_model" not in ar
    greedy, spec_call, lookup_call = rt.calls[:3]
    assert greedy["do_sample"] is False and greedy["stop_token_ids"] == {EOS} and greedy["repetition_penalty"] == 1.0
    assert greedy["max_new_tokens"] == 8 and greedy["num_assistant_tokens"] == 0
    assert spec_call["num_assistant_tokens"] == 3 and lookup_call["max_ngram_size"] == 4


def test_sampled_runs_are_plain_temperature_seeded_per_run(runtime):
    rt = runtime()
    backend = OpenVinoBackend("T", None, eos_ids=[EOS], threads=2)
    backend.run(Config("openvino", "ar", 0, 0.7), [5, 6], 4, seed=11)
    call = rt.calls[-1]
    assert call["do_sample"] is True and call["temperature"] == 0.7 and call["top_p"] == 1.0 and call["rng_seed"] == 11
    with pytest.raises(ValueError, match="exported draft"):
        backend.run(Config("openvino", "speculative", 2, 0.0), [5, 6], 4, seed=0)
    with pytest.raises(ValueError, match="unknown openvino strategy"):
        backend.run(Config("openvino", "assisted", 2, 0.0), [5, 6], 4, seed=0)


def test_streamed_tokens_stop_at_the_end_of_sequence_and_a_rounds_tokens_arrive_together(runtime):
    runtime(eos_after=5)
    backend = OpenVinoBackend("T", "D", eos_ids=[EOS, 3], threads=2)
    run = backend.run(Config("openvino", "speculative", 2, 0.0), [5, 6, 7], 12, seed=0)
    expected = [10 + (18 + i) % 40 for i in range(5)]
    assert run.token_ids == expected and run.finish_reason == "eos"  # the end-of-sequence id is not output
    assert sum(k for _, k in run.arrivals) == 5 and len(run.arrivals) <= 2  # rounds of 3, then 2 before the eos
    plain = backend.run(Config("openvino", "ar", 0, 0.0), [5, 6, 7], 4, seed=0)
    assert plain.finish_reason == "length" and plain.new_tokens == 4


def test_the_first_sampled_speculative_failure_is_run_again_and_a_second_is_reported(runtime):
    runtime(fail_sampled=1)
    backend = OpenVinoBackend("T", "D", eos_ids=[EOS], threads=2)
    run = backend.run(Config("openvino", "speculative", 2, 0.7), [5, 6, 7], 9, seed=1)
    assert run.new_tokens == 9  # the failed attempt's streamed token is not kept
    runtime(fail_sampled=2)
    backend = OpenVinoBackend("T", "D", eos_ids=[EOS], threads=2)
    with pytest.raises(RuntimeError, match="content_length"):
        backend.run(Config("openvino", "speculative", 2, 0.7), [5, 6, 7], 9, seed=1)
    runtime(fail_sampled=1)
    backend = OpenVinoBackend("T", "D", eos_ids=[EOS], threads=2)
    backend.run(Config("openvino", "prompt_lookup", 2, 0.0), [5, 6, 7], 9, seed=1)  # greedy: not retried, no failure


def test_configs_and_where_the_exports_are_looked_for(tmp_path):
    configs = build_configs(["auto"], [4], [0.0], ["openvino"])
    assert [c.label for c in configs if c.system == "openvino"] == \
           ["openvino ar", "openvino speculative γ=4", "openvino prompt_lookup γ=4"]
    assert [c.label for c in build_configs(["ngram"], [2], [0.0], ["openvino"]) if c.system == "openvino"] == \
           ["openvino ar", "openvino prompt_lookup γ=2"]  # no draft model: no speculative row
    assert openvino_dir("qwen2.5-coder-1.5b-instruct", str(tmp_path)) == tmp_path / "qwen2.5-coder-1.5b-instruct-int4"
    assert openvino_dir("/models/x.gguf", str(tmp_path)).name == "x-int4"


def test_bench_runs_the_openvino_peer_beside_ours(pair, prompts_file, runtime, tmp_path, capsys):  # noqa: F811
    target, draft = pair
    exports = tmp_path / "ov"
    for model in (target, draft):
        (exports / f"{model.name}-int4").mkdir(parents=True)
        (exports / f"{model.name}-int4" / "openvino_model.xml").write_text("<net/>")
    rt = runtime()
    out = tmp_path / "report"
    code, stdout, err = run_inline(
        capsys, "bench", "--target", str(target), "--draft", str(draft), "--dtype", "float32", "--strategies", "draft",
        "--gamma", "2", "--max-new-tokens", "6", "--prompts", str(prompts_file), "--peers", "openvino",
        "--openvino-dir", str(exports), "--out", str(out), "--no-warmup",
    )
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    labels = {r["config"] for r in report["summary"]}
    assert {"openvino ar", "openvino speculative γ=2", "openvino prompt_lookup γ=2"} <= labels
    assert {p for p, _ in rt.pipelines} == {str(exports / f"{target.name}-int4")}
    assert all(r["new_tokens"] == 6 for r in report["runs"] if r["system"] == "openvino")


def test_bench_says_why_it_skips_the_openvino_peer(pair, prompts_file, runtime, tmp_path, capsys):  # noqa: F811
    target, draft = pair
    runtime()
    code, _, err = run_inline(
        capsys, "bench", "--target", str(target), "--draft", str(draft), "--dtype", "float32", "--strategies", "draft",
        "--gamma", "2", "--max-new-tokens", "4", "--prompts", str(prompts_file), "--peers", "openvino",
        "--openvino-dir", str(tmp_path / "none"), "--out", str(tmp_path / "r"), "--no-warmup",
    )
    assert code == 0, err
    assert "openvino peer skipped: no exported model in" in err and "openvino_export.sh" in err
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert not any(r["system"] == "openvino" for r in report["runs"])
