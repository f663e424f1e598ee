"""`verispec tune` on the tiny pair: it measures every candidate on the same prompts, keeps the fastest measured,
writes a config that `generate`, `bench` and `serve` read with `--config` (flags beside it win), and refuses files
that are not one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_cli import gen_json, pair, run_inline  # noqa: F401 - pair is a fixture
from verispec.bench.runner import Config, Run
from verispec.theory import flat_cost
from verispec.tune import Candidate, best, candidates, measure, read_config, table


def _run(config: Config, tokens: int, seconds: float, drafted: int = 0, accepted: int = 0) -> Run:
    return Run("p", "c", config, 0, [1] * tokens, seconds, [], rounds=tokens, drafted=drafted, accepted=accepted,
               c=0.1 if drafted else None)


def test_measure_runs_every_candidate_on_the_same_prompts_within_the_budget():
    configs = [Candidate(Config("verispec", "ar", 0, 0.0)), Candidate(Config("verispec", "draft", 4, 0.0))]
    calls = []

    def run(candidate, prompt):
        config = candidate.config
        calls.append((config.strategy, prompt[0]))
        return _run(config, 10, 0.5 if config.plain else 0.25, 20, 15)

    sums, done = measure(configs, [[1], [2], [3]], run, budget_s=1e9)
    assert done == 3 and calls == [(s, p) for p in (1, 2, 3) for s in ("ar", "draft")]
    assert best(sums).strategy == "draft" and sums[1].tokens_per_s == pytest.approx(40.0)
    assert sums[1].alpha == pytest.approx(0.75)
    _, done = measure(configs, [[1], [2], [3]], run, budget_s=0.0)
    assert done == 1  # at least one prompt, then the budget stops it
    text = table(sums, lambda dtype: flat_cost)
    assert "draft γ=4 ← chosen" in text and "| ar |" in text and "precision" not in text


def test_candidates_span_the_precisions():
    got = candidates(["draft", "ngram"], [2], [("w4a8", "w4a8-4bit"), ("w4a8", "int8"), ("bfloat16", "int4")],
                     needs_draft=lambda s: s == "draft")
    assert [(c.config.strategy, c.dtype, c.draft_dtype) for c in got] == [
        ("ar", "w4a8", None), ("ar", "bfloat16", None),
        ("draft", "w4a8", "w4a8-4bit"), ("ngram", "w4a8", None), ("draft", "w4a8", "int8"),
        ("draft", "bfloat16", "int4"), ("ngram", "bfloat16", None)]


def test_tune_writes_a_config_that_the_commands_read(pair, capsys, tmp_path):  # noqa: F811
    target, draft = pair
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p, "category": "code"})
                                 for p in ("def x ( a ) :", "for a in b :")) + "\n")
    out = tmp_path / "tuned.json"
    code, stdout, err = run_inline(capsys, "tune", "--target", str(target), "--draft", str(draft), "--dtype", "float32",
                                   "--draft-dtype", "float32", "--strategies", "draft,ngram", "--gamma", "2,3",
                                   "--prompts", str(prompts), "--limit", "2", "--max-new-tokens", "12",
                                   "--budget", "10m", "--out", str(out))
    assert code == 0, err
    data = json.loads(out.read_text())
    fastest = max(data["measured"], key=lambda m: m["tokens_per_s"])
    assert (data["strategy"], data["gamma"] or 0) == (fastest["strategy"], fastest["gamma"])
    assert len(data["measured"]) == 5 and data["chosen"]["prompts"] == 2
    assert "← chosen" in stdout and str(out) in stdout
    values = read_config(out)
    assert values["strategy"] == data["strategy"] and values["dtype"] == "float32"
    # generate reads it (the target and draft come from the config too); a flag beside it wins
    code, stdout, err = run_inline(capsys, "generate", "def x ( a ) :", "--config", str(out), "--json",
                                   "--max-new-tokens", "8")
    assert code == 0, err
    assert json.loads(stdout)["strategy"] == data["strategy"]
    code, stdout, err = run_inline(capsys, "generate", "def x ( a ) :", "--config", str(out), "--json",
                                   "--max-new-tokens", "8", "--strategy", "ar")
    assert code == 0 and json.loads(stdout)["strategy"] == "ar", err


def test_tune_measures_precisions(pair, capsys, tmp_path, monkeypatch):  # noqa: F811
    """Two target precisions and two draft precisions: plain decoding on each target precision, the draft on each
    pair; the config names the precisions of the fastest measured, and the speedups are over plain decoding on
    the same target precision. Each precision is loaded once."""
    import verispec.cli.tune as tune_cli

    loaded: list[str] = []
    for name in ("load_target", "load_draft"):
        real = getattr(tune_cli, name)
        monkeypatch.setattr(tune_cli, name,
                            lambda *a, _real=real, _name=name, **k: loaded.append(_name) or _real(*a, **k))
    target, draft = pair
    out = tmp_path / "tuned.json"
    code, stdout, err = run_inline(capsys, "tune", "--target", str(target), "--draft", str(draft),
                                   "--dtypes", "float32,bfloat16", "--draft-dtypes", "float32,bfloat16",
                                   "--strategies", "draft", "--gamma", "2", "--prompts", "suite", "--categories",
                                   "code_completion", "--max-new-tokens", "8", "--budget", "10m", "--out", str(out))
    assert code == 0, err
    data = json.loads(out.read_text())
    got = {(m["strategy"], m["dtype"], m["draft_dtype"]) for m in data["measured"]}
    assert got == {("ar", "float32", None), ("ar", "bfloat16", None)} | {
        ("draft", d, dd) for d in ("float32", "bfloat16") for dd in ("float32", "bfloat16")}
    fastest = max(data["measured"], key=lambda m: m["tokens_per_s"])
    assert (data["dtype"], data["draft_dtype"]) == (fastest["dtype"], fastest["draft_dtype"])
    assert "| precision |" in stdout and "float32 + bfloat16 draft" in stdout
    assert sorted(loaded) == ["load_draft"] * 2 + ["load_target"] * 2
    code, _, err = run_inline(capsys, "tune", "--target", str(target), "--dtypes", "float32,fp7", "--out",
                              str(out))
    assert code == 2 and "'fp7' is not a precision" in err


def test_a_bad_config_is_one_line(pair, capsys, tmp_path):  # noqa: F811
    bad = tmp_path / "bad.json"
    for text, needle in (("{", "not JSON"), ('{"strategy": "draft"}', "not a verispec config")):
        bad.write_text(text)
        code, _, err = run_inline(capsys, "generate", "x", "--config", str(bad))
        assert code == 2 and needle in err and "Traceback" not in err, err
    code, _, err = run_inline(capsys, "generate", "x", "--config", str(tmp_path / "missing.json"))
    assert code == 2 and "cannot read the config" in err


def test_a_config_that_chose_a_drafter_names_it(pair, capsys, tmp_path, monkeypatch):  # noqa: F811
    """A config that chose `eagle+ngram` keeps the flags that strategy read (its drafter, as an absolute path; its
    confidence stop), so `generate --config` runs it with nothing else given; a --strategy beside the config that
    reads no drafter runs without it, and a --drafter beside it replaces the config's."""
    import shutil

    import verispec.tune as tune_lib
    from verispec.cli.tune import _default_strategies

    target, _ = pair
    drafter = tmp_path / "drafter"
    code, _, err = run_inline(capsys, "train-drafter", "--target", str(target), "--dtype", "float32", "--out",
                              str(drafter), "--tokens", "2048", "--seq-len", "32", "--batch", "2", "--budget", "1s")
    assert code == 0, err
    assert _default_strategies([str(drafter)]).split(",")[-2:] == ["eagle", "eagle+ngram"]
    # an untrained drafter may lose to plain decoding: the choice itself is test_measure's; here, what is written
    monkeypatch.setattr(tune_lib, "best", lambda measured: next(m for m in measured if m.strategy != "ar"))
    out = tmp_path / "tuned.json"
    monkeypatch.chdir(tmp_path)
    code, stdout, err = run_inline(capsys, "tune", "--target", str(target), "--dtype", "float32", "--strategies",
                                   "eagle+ngram", "--drafter", "drafter", "--draft-confidence", "0.3", "--gamma", "3",
                                   "--prompts", "suite", "--categories", "code_completion", "--max-new-tokens", "12",
                                   "--out", str(out))
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["strategy"] == "eagle+ngram"
    assert data["options"] == {"drafter": [str(drafter.resolve())], "draft_confidence": 0.3}
    monkeypatch.chdir(Path(__file__).parent)  # the drafter's path must not depend on where the config is used
    prompt = ["def x ( a ) :", "--max-new-tokens", "16", "--json"]
    code, stdout, err = run_inline(capsys, "generate", *prompt, "--config", str(out))
    assert code == 0, err
    tuned = json.loads(stdout)
    assert tuned["strategy"] == "eagle+ngram"
    assert f"float32 target, eagle+ngram, gamma 3, drafter {drafter.resolve()}, from {out}" in err  # what runs
    code, stdout, err = run_inline(capsys, "generate", *prompt, "--config", str(out), "--strategy", "ar")
    assert code == 0, err  # the config's drafter is not refused beside a strategy that reads none
    assert f"verispec: float32 target, ar, from {out}" in err
    assert json.loads(stdout)["token_ids"] == tuned["token_ids"]
    moved = tmp_path / "moved"
    shutil.move(drafter, moved)
    code, _, err = run_inline(capsys, "generate", *prompt, "--config", str(out))
    assert code == 2 and "drafter" in err and "Traceback" not in err
    code, stdout, err = run_inline(capsys, "generate", *prompt, "--config", str(out), "--drafter", str(moved))
    assert code == 0, err  # the command line's drafter replaces the config's, not joins it
    assert json.loads(stdout)["token_ids"] == tuned["token_ids"]
    out.write_text(json.dumps({**data, "options": ["drafter"]}))
    code, _, err = run_inline(capsys, "generate", *prompt, "--config", str(out))
    assert code == 2 and "options" in err and len(err.strip().splitlines()) == 1


def test_commands_find_the_drafter_train_drafter_left_for_the_target(pair, capsys, tmp_path, monkeypatch):  # noqa: F811
    """Without --drafter, tune also tries the drafter `train-drafter` left at its default place for --target (a user
    who trained one need not find its directory), and a config that chose it names it; a --strategies list that
    runs no drafter leaves it out; generate finds it as tune does."""
    import shutil

    import verispec.tune as tune_lib

    target, draft = pair
    shutil.copytree(target, tmp_path / "t")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    code, _, err = run_inline(capsys, "train-drafter", "--target", "t", "--dtype", "float32", "--tokens", "2048",
                              "--seq-len", "32", "--batch", "2", "--budget", "1s")
    assert code == 0, err
    drafter = tmp_path / "cache" / "drafters" / "t-eagle"
    assert (drafter / "config.json").is_file()
    monkeypatch.setattr(tune_lib, "best", lambda measured: next(m for m in measured if m.strategy == "eagle+ngram"))
    common = ["tune", "--target", "t", "--draft", str(draft), "--dtype", "float32", "--gamma", "2", "--categories",
              "code_completion", "--max-new-tokens", "8"]
    code, _, err = run_inline(capsys, *common, "--out", "tuned.json")
    assert code == 0, err
    assert f"the drafter train-drafter made for t: {drafter}" in err
    data = json.loads((tmp_path / "tuned.json").read_text())
    assert {m["strategy"] for m in data["measured"]} >= {"auto", "eagle", "eagle+ngram"}
    assert data["options"]["drafter"] == [str(drafter.resolve())]
    monkeypatch.setattr(tune_lib, "best", lambda measured: measured[0])
    code, _, err = run_inline(capsys, *common, "--strategies", "ngram", "--out", "plain.json")
    assert code == 0 and "train-drafter made" not in err, err
    assert {m["strategy"] for m in json.loads((tmp_path / "plain.json").read_text())["measured"]} == {"ar", "ngram"}
    code, stdout, err = run_inline(capsys, "generate", "def x ( a ) :", "--target", "t", "--dtype", "float32",
                                   "--strategy", "eagle+ngram", "--max-new-tokens", "8", "--json")
    assert code == 0 and f"train-drafter made for t: {drafter}" in err, err  # generate finds it too
    assert json.loads(stdout)["strategy"] == "eagle+ngram"
