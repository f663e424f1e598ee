"""The CLI end to end on tiny models, and its bad-input contract (exit code 2, one clear line)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.tiny_hf import make_tiny_hf_dir
from verispec.cli import main


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    target = make_tiny_hf_dir(root / "target", seed=0)
    draft = make_tiny_hf_dir(root / "draft", seed=1, noise_from=target)
    return target, draft


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "verispec.cli", *args], capture_output=True, text=True, timeout=300
    )


def run_inline(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """cli.main in this process (no interpreter start-up per case): exit code, stdout, stderr."""
    try:
        code = main(list(args))
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def gen_json(pair: tuple[Path, Path], capsys: pytest.CaptureFixture, *extra: str) -> dict:
    target, draft = pair
    code, out, err = run_inline(capsys, "generate", "def x ( a ) :", "--target", str(target), "--draft", str(draft),
                                "--dtype", "float32", "--max-new-tokens", "40", "--json", *extra)
    assert code == 0, err
    return json.loads(out)


def test_greedy_speculative_equals_plain(pair, capsys):
    # a fixed gamma: the default (auto) rightly decodes plainly here, where the draft is as large as the target
    spec = gen_json(pair, capsys, "--strategy", "draft", "--gamma", "3")
    plain = gen_json(pair, capsys, "--no-speculate")
    assert spec["token_ids"] == plain["token_ids"]
    assert len(spec["token_ids"]) > 0
    m = spec["metrics"]
    for key in ("alpha", "mean_accepted_length", "target_forwards", "draft_forwards", "tokens_per_s",
                "per_position_acceptance"):
        assert key in m
    assert 0.0 <= m["alpha"] <= 1.0
    assert len(m["per_position_acceptance"]) == 3
    # Fewer target forwards than tokens whenever anything was accepted.
    assert m["target_forwards"] <= len(spec["token_ids"]) + 1
    assert plain["metrics"]["target_forwards"] == len(plain["token_ids"]) + 1 or plain["finish_reason"] == "eos"


def test_penalties_and_logprobs_flags(pair, capsys):
    plain = gen_json(pair, capsys, "--no-speculate", "--frequency-penalty", "1.5", "--logit-bias", "7=-100",
                     "--logprobs", "2")
    spec = gen_json(pair, capsys, "--strategy", "draft", "--gamma", "3", "--frequency-penalty", "1.5",
                    "--logit-bias", "7=-100", "--logprobs", "2")
    assert spec["token_ids"] == plain["token_ids"] != gen_json(pair, capsys, "--no-speculate")["token_ids"]
    assert 7 not in spec["token_ids"]
    assert [e["id"] for e in spec["logprobs"]] == spec["token_ids"]
    assert all(len(e["top"]) == 2 and abs(e["logprob"] - f["logprob"]) < 1e-5
               for e, f in zip(spec["logprobs"], plain["logprobs"], strict=True))
    for bad, needle in ((["--logit-bias", "7"], "ID=BIAS"), (["--logit-bias", "99999=1"], "outside the vocabulary"),
                        (["--repetition-penalty", "0"], "repetition penalty")):
        code, _, err = run_inline(capsys, "generate", "x", "--target", str(pair[0]), "--no-speculate",
                                  "--dtype", "float32", *bad)
        assert code == 2 and needle in err and "Traceback" not in err, err


def test_regex_flag(pair, capsys):
    import re

    regex = r"(x|y|a)(\+(x|y|1|2)){2,6}"
    plain = gen_json(pair, capsys, "--no-speculate", "--regex", regex)
    spec = gen_json(pair, capsys, "--strategy", "draft", "--gamma", "3", "--regex", regex)
    assert spec["token_ids"] == plain["token_ids"] and spec["finish_reason"] == "eos"
    assert re.fullmatch(regex, spec["text"].replace(" ", "")), spec["text"]
    for bad, needle in ((["--regex", "(x"], "--regex: invalid regex"), (["--json-schema", "/nonexistent.json"],
                                                                       "cannot read"),
                        (["--json-schema", "{"], "not valid JSON")):
        code, _, err = run_inline(capsys, "generate", "x", "--target", str(pair[0]), "--no-speculate",
                                  "--dtype", "float32", *bad)
        assert code == 2 and needle in err and "Traceback" not in err, err


def test_seeded_sampling_is_reproducible(pair, capsys):
    a = gen_json(pair, capsys, "--temperature", "0.8", "--seed", "7", "--top-p", "0.95")
    b = gen_json(pair, capsys, "--temperature", "0.8", "--seed", "7", "--top-p", "0.95")
    assert a["token_ids"] == b["token_ids"]


def test_chat_and_stop_string(pair, capsys):
    out = gen_json(pair, capsys, "--chat")
    assert out["finish_reason"] in ("eos", "length")
    full = gen_json(pair, capsys)
    words = full["text"].split()
    if len(words) > 3:
        stop = words[3]
        cut = gen_json(pair, capsys, "--stop", stop)
        assert stop not in cut["text"]
        assert cut["finish_reason"] == "stop"
        assert full["text"].startswith(cut["text"])


def test_streaming_prints_text(pair):
    target, draft = pair
    proc = run("generate", "def x", "--target", str(target), "--draft", str(draft), "--max-new-tokens", "10")
    assert proc.returncode == 0, proc.stderr
    assert "tok/s" in proc.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["generate", ""], "prompt is empty"),
        (["generate", "   "], "prompt is empty"),
        (["generate", "hi", "--gamma", "0"], "gamma"),
        (["generate", "hi", "--temperature", "-1"], "temperature"),
        (["generate", "hi", "--temperature", "nan"], "temperature"),
        (["generate", "hi", "--top-p", "0"], "top-p"),
        (["generate", "hi", "--top-p", "1.5"], "top-p"),
        (["generate", "hi", "--max-new-tokens", "0"], "max-new-tokens"),
        (["generate", "hi", "--target", "/no/such/model"], "no model at"),
        (["generate", "hi", "--gamma", "two"], "gamma"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, needle, capsys):
    code, _, err = run_inline(capsys, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert needle in lines[0]


def test_bad_input_in_a_real_process():
    proc = run("generate", "hi", "--top-p", "2")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["verispec: error: top-p must be in (0, 1], got 2.0"]
    assert "Traceback" not in proc.stderr


def test_incompatible_pair_is_refused(pair, tmp_path, capsys):
    from tokenizers import Tokenizer

    target, draft = pair
    other = make_tiny_hf_dir(tmp_path / "other", seed=3)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["zzz"] = vocab.pop("print")  # same size, one token differs
    (other / "tokenizer.json").write_text(json.dumps(tok))
    Tokenizer.from_file(str(other / "tokenizer.json"))
    code, _, err = run_inline(capsys, "generate", "def x", "--target", str(target), "--draft", str(other),
                              "--max-new-tokens", "4")
    assert code == 2
    assert "incompatible pair" in err


def test_prompt_beyond_the_context_is_one_line(pair, capsys):
    target, draft = pair  # the tiny models have a 256-token context
    code, _, err = run_inline(capsys, "generate", "x " * 200, "--target", str(target), "--draft", str(draft),
                              "--max-new-tokens", "100")
    assert code == 2
    *before, last = err.strip().splitlines()
    assert last.startswith("verispec: error:") and "context" in last
    before = [line for line in before if not line.startswith("quantizing ")]  # the first run on these models
    assert len(before) <= 1 and all("fastest exact configuration" in line for line in before)  # the defaults' line


def test_defaults_chosen_for_the_machine_are_said_in_one_line(pair, capsys):
    """No --dtype: the precision is the machine's (w4a8 where the kernel runs), said once on stderr."""
    from verispec.models.kernels import available_isas

    target, draft = pair
    code, out, err = run_inline(capsys, "generate", "x y", "--target", str(target), "--draft", str(draft),
                                "--max-new-tokens", "4", "--json")
    assert code == 0
    said = [line for line in err.splitlines() if "fastest exact configuration" in line]
    assert len(said) == 1 and ("w4a8 target" if available_isas() else "bfloat16 target") in said[0]
    code, _, err = run_inline(capsys, "generate", "x y", "--target", str(target), "--draft", str(draft),
                              "--max-new-tokens", "4", "--json", "--dtype", "float32")
    assert code == 0 and "fastest exact configuration" not in err


@pytest.mark.parametrize("strategy, extra", [
    ("ngram", ["--ngram-max", "4", "--ngram-min", "1"]),
    ("layerskip", ["--layers", "1"]),
    ("lookahead", ["--window", "3", "--lookahead-ngram", "3", "--lookahead-candidates", "2"]),
    ("draft+ngram", []),
    ("auto", []),
    ("adaptive", []),
    ("draft", ["--draft-confidence", "0.5"]),
])
def test_every_strategy_from_the_cli_equals_plain(pair, capsys, strategy, extra):
    spec = gen_json(pair, capsys, "--strategy", strategy, "--gamma", "3", *extra)
    plain = gen_json(pair, capsys, "--strategy", "ar")
    assert spec["strategy"] == strategy
    assert spec["token_ids"] == plain["token_ids"]


@pytest.mark.parametrize("args, needle", [
    (["--strategy", "layerskip", "--layers", "0"], "--layers"),
    (["--strategy", "lookahead", "--window", "0"], "--window"),
    (["--strategy", "nope"], "unknown strategy"),
    (["--strategy", "adaptive", "--draft-confidence", "1.5"], "--draft-confidence"),
])
def test_bad_strategy_options(pair, capsys, args, needle):
    target, draft = pair
    code, _, err = run_inline(capsys, "generate", "hi", "--target", str(target), "--draft", str(draft), *args)
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1


def test_calibrate_layerskip_saves_a_choice_that_generate_uses(pair, capsys, tmp_path):
    target, _ = pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f ( x ) :", "category": "code"}\n{"prompt": "a b c a b", "category": "code"}\n')
    out = tmp_path / "cal.json"
    code, stdout, err = run_inline(capsys, "calibrate-layerskip", "--target", str(target), "--dtype", "float32",
                                   "--prompts", str(prompts), "--categories", "code", "--limit", "2",
                                   "--candidates", "1", "--max-new-tokens", "8", "--out", str(out))
    assert code == 0, err
    assert "best: 1 of" in stdout
    saved = json.loads(out.read_text())
    (entry,) = saved.values()
    assert entry["best_layers"] == 1 and entry["prompts"] == 2
    assert [r["layers"] for r in entry["results"]] == [1]
    code, _, err = run_inline(capsys, "calibrate-layerskip", "--target", str(target), "--candidates", "99",
                              "--prompts", str(prompts), "--categories", "code", "--out", str(out))
    assert code == 2 and "--candidates" in err


# ---- per-command and per-strategy flags ----------------------------------------------------------------------
@pytest.mark.parametrize("args, needle", [
    (["generate", "hi", "--window", "3"], "--window applies to the lookahead strategy only"),
    (["generate", "hi", "--strategy", "draft", "--lookahead-ngram", "4"], "--lookahead-ngram applies to the lookahead"),
    (["generate", "hi", "--strategy", "ngram", "--lookahead-candidates", "2"], "--lookahead-candidates applies to the lookahead"),
    (["generate", "hi", "--strategy", "draft", "--layers", "2"], "--layers applies to the layerskip strategy only"),
    (["generate", "hi", "--strategy", "draft", "--ngram-max", "4"], "--ngram-max applies to the ngram, draft+ngram, auto, tree+ngram and eagle+ngram"),
    (["generate", "hi", "--strategy", "lookahead", "--ngram-min", "2"], "--ngram-min applies to the ngram, draft+ngram, auto, tree+ngram and eagle+ngram"),
    (["generate", "hi", "--strategy", "ngram", "--draft-confidence", "0.5"],
     "--draft-confidence applies to the draft, adaptive, draft+ngram, auto, eagle and eagle+ngram strategies only"),
    (["generate", "hi", "--no-speculate", "--window", "3"], "(the strategy is ar)"),
    (["bench", "--strategies", "ar,draft", "--window", "3"], "(the strategies are ar, draft)"),
    (["serve", "--strategy", "ar", "--layers", "2"], "--layers applies to the layerskip strategy only"),
    (["serve", "--strategy", "ngram", "--draft-per-request"], "--draft-per-request applies to strategies with a draft"),
    (["serve", "--strategy", "nope"], "unknown strategy 'nope'"),
    (["theory", "--strategy", "draft"], "unrecognized arguments: --strategy"),
    (["calibrate-layerskip", "--draft", "x"], "unrecognized arguments: --draft"),
    (["calibrate-layerskip", "--window", "3"], "unrecognized arguments: --window"),
])
def test_a_flag_that_does_nothing_is_refused(capsys, args, needle):
    code, _, err = run_inline(capsys, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err


def test_strategy_flags_are_accepted_by_the_strategies_that_read_them(capsys, tmp_path):
    from verispec.cli import build_parser
    from verispec.cli.options import STRATEGY_FLAGS, strategy_options
    from verispec.strategies import STRATEGIES

    for flag, (field, readers) in STRATEGY_FLAGS.items():
        for strategy in readers:
            assert strategy in STRATEGIES
            value = {"--draft-confidence": "0.5", "--medusa-tree": "2,1", "--eagle-tree": "2,1"}.get(flag, "2")
            drafter = tmp_path / strategy  # a directory holding a drafter of the strategy's kind
            drafter.mkdir(exist_ok=True)
            kind = "eagle" if strategy.startswith("eagle") else strategy
            (drafter / "config.json").write_text(json.dumps({"kind": kind, "heads": 4}))
            extra = ["--drafter", str(drafter)] if strategy in ("eagle", "eagle+ngram", "medusa") and flag != "--drafter" \
                else []
            if flag == "--drafter":
                value = str(drafter)
            args = build_parser().parse_args(["generate", "hi", "--strategy", strategy, flag, value, *extra])
            want = (value,) if flag == "--drafter" else (2, 1) if flag in ("--medusa-tree", "--eagle-tree") \
                else float(value)
            assert getattr(strategy_options(args, [strategy]), field) == want
    args = build_parser().parse_args(["bench", "--strategies", "ar,lookahead", "--window", "3"])
    assert strategy_options(args, ["ar", "lookahead"]).lookahead_window == 3


def test_serve_help_lists_every_strategy():
    from verispec.strategies import STRATEGIES

    proc = run("serve", "--help")
    assert proc.returncode == 0, proc.stderr
    choices = proc.stdout.split("--strategy {", 1)[1].split("}", 1)[0].split(",")
    assert choices == list(STRATEGIES)
    for name in STRATEGIES:
        assert f"{name} (" in " ".join(proc.stdout.split())  # each with its one-line description


@pytest.mark.parametrize("extra", [[], ["--dtype", "w4a8"], ["--dtype", "float32"], ["--device", "cuda"]])
def test_serve_defaults_are_generates(capsys, monkeypatch, extra):
    """serve hands the server the strategy and gamma generate would use, for every precision and device."""
    import verispec.server
    from verispec.cli import build_parser
    from verispec.cli.options import gamma_of, resolve_dtype

    gen = build_parser().parse_args(["generate", "hi", *extra])
    resolve_dtype(gen)  # as generate does before it reads the gamma (the default depends on the precision)
    seen = {}

    def settings(**kw):
        seen.update(kw)
        raise ValueError("stop here")

    monkeypatch.setattr(verispec.server, "ServerSettings", settings)
    code, _, err = run_inline(capsys, "serve", *extra)
    assert code == 2 and "stop here" in err
    assert seen["strategy"] == gen.strategy and seen["gamma"] == gamma_of(gen)


@pytest.mark.parametrize("strategy", ["ar", "draft", "adaptive", "layerskip", "lookahead", "ngram", "draft+ngram", "auto"])
def test_serve_accepts_every_strategy(monkeypatch, capsys, strategy):
    import verispec.server
    from verispec.strategies import STRATEGIES

    assert strategy in STRATEGIES
    seen = {}

    def settings(**kw):
        seen.update(kw)
        raise ValueError("stop here")

    monkeypatch.setattr(verispec.server, "ServerSettings", settings)
    code, _, err = run_inline(capsys, "serve", "--strategy", strategy)
    assert code == 2 and "stop here" in err and seen["strategy"] == strategy


def test_draft_vocab_default_shrinks_the_draft_head_and_stays_exact(pair, capsys, monkeypatch):
    """With no --draft-vocab the machine's default (here patched to 16 of the tiny vocabulary's ids) cuts the
    draft's head, the defaults' line says so, and greedy output still equals plain decoding; 0 keeps it whole."""
    import verispec.cli.options as options
    import verispec.models.quant as quant

    cuts: list[tuple[int, int]] = []
    real = quant.truncate_head

    def spy(model, keep):
        out = real(model, keep)
        cuts.append((keep, model.lm_head(torch.zeros(1, model.lm_head.in_features)).shape[-1]))
        return out

    monkeypatch.setattr(quant, "truncate_head", spy)
    monkeypatch.setattr(options, "default_draft_vocab", lambda dtype, device: 16)
    target, draft = pair
    base = ["generate", "def x ( a ) :", "--target", str(target), "--draft", str(draft), "--max-new-tokens", "30",
            "--json"]
    code, out, err = run_inline(capsys, *base, "--strategy", "draft", "--gamma", "3")
    assert code == 0, err
    assert cuts == [(16, 16)] and "ids < 16" in err
    code, plain, err = run_inline(capsys, *base, "--strategy", "ar")
    assert code == 0, err
    assert json.loads(out)["token_ids"] == json.loads(plain)["token_ids"]
    code, _, err = run_inline(capsys, *base, "--strategy", "draft", "--draft-vocab", "0")
    assert code == 0 and cuts == [(16, 16)], err
    code, _, err = run_inline(capsys, *base, "--strategy", "draft", "--draft-vocab", "-1")
    assert code == 2 and "--draft-vocab must be >= 0" in err


def test_defaults_module():
    from verispec.defaults import DEFAULT_STRATEGY, default_draft_dtype, default_draft_vocab, default_gamma
    from verispec.strategies import STRATEGIES

    assert DEFAULT_STRATEGY in STRATEGIES
    assert default_gamma("bfloat16", "cpu") == 8 and default_gamma("float32", "cpu") == 8
    assert default_gamma("w4a8", "cpu", "avx2") == 4 and default_gamma("bfloat16", "cuda") == 4
    assert default_gamma("w4a8", "cpu", "avx512") == 6 and default_gamma("w4a8", "cpu") == 4
    assert default_draft_dtype("bfloat16", "cpu") == "int4" and default_draft_dtype("w8a8", "cpu") == "int4"
    assert default_draft_dtype("w4a8", "cpu") == "w4a8-4bit" and default_draft_dtype("float32", "cpu") == "float32"
    assert default_draft_dtype("bfloat16", "cuda") == "bfloat16"
    assert default_draft_vocab("w4a8-4bit", "cpu") == 65536
    assert default_draft_vocab("int4", "cpu") is None and default_draft_vocab("w4a8-4bit", "cuda") is None


def test_vllm_names_for_the_draft_and_gamma(pair, capsys):
    """--speculative-model and --num-speculative-tokens (vLLM's flags) are --draft and --gamma."""
    target, draft = pair
    ours = gen_json(pair, capsys, "--strategy", "draft", "--gamma", "3")
    code, out, err = run_inline(capsys, "generate", "def x ( a ) :", "--target", str(target), "--speculative-model",
                                str(draft), "--dtype", "float32", "--max-new-tokens", "40", "--json",
                                "--strategy", "draft", "--num-speculative-tokens", "3")
    assert code == 0, err
    theirs = json.loads(out)
    assert theirs["token_ids"] == ours["token_ids"]
    assert len(theirs["metrics"]["per_position_acceptance"]) == 3  # gamma 3 reached the round
