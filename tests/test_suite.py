"""The bench prompt suite: the packaged file is well-formed, and user files load or fail with clear errors."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from verispec.bench.suite import CATEGORIES, BenchPrompt, load_prompts

USER = {"role": "user", "content": "Hello there"}


@pytest.fixture(scope="module")
def suite() -> list[BenchPrompt]:
    return load_prompts()


def write(tmp_path: Path, lines: list[str], name: str = "prompts.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_suite_has_every_category(suite: list[BenchPrompt]) -> None:
    counts = Counter(p.category for p in suite)
    assert list(counts) == list(CATEGORIES)  # file order follows CATEGORIES
    assert all(counts[c] >= 8 for c in CATEGORIES), counts


def test_suite_entries_are_well_formed(suite: list[BenchPrompt]) -> None:
    assert len({p.id for p in suite}) == len(suite)
    for p in suite:
        assert p.id.startswith(p.category + "-")
        assert p.messages and p.messages[-1]["role"] == "user"
        assert all(m["role"] in ("system", "user", "assistant") and m["content"].strip() for m in p.messages)
    multi = [p for p in suite if p.category == "multi_turn"]
    assert all(any(m["role"] == "assistant" for m in p.messages) for p in multi)
    for p in suite:
        if p.category in ("code_completion", "code_edit"):
            assert "```python\n" in p.messages[-1]["content"], p.id


def test_suite_file_is_valid_jsonl() -> None:
    from importlib import resources

    raw = resources.files("verispec.bench").joinpath("data", "suite.jsonl").read_bytes()
    lines = raw.decode("utf-8").split("\n")
    assert lines[-1] == ""  # ends with a newline
    for line in lines[:-1]:
        obj = json.loads(line)
        assert set(obj) == {"id", "category", "messages"}


def test_category_filter_and_limit(suite: list[BenchPrompt]) -> None:
    got = load_prompts(categories=["rag", "qa"])
    assert {p.category for p in got} == {"rag", "qa"}
    assert got == [p for p in suite if p.category in ("qa", "rag")]  # file order kept
    limited = load_prompts(limit=2)
    assert Counter(p.category for p in limited) == {c: 2 for c in CATEGORIES}
    assert [p.id for p in load_prompts(categories=["math"], limit=3)] == ["math-01", "math-02", "math-03"]


def test_unknown_category_lists_available() -> None:
    with pytest.raises(ValueError, match="unknown category 'poetry'.*available: multi_turn, translation"):
        load_prompts(categories=["poetry", "qa"])


@pytest.mark.parametrize("limit", [0, -1, 1.5])
def test_bad_limit(limit: object) -> None:
    with pytest.raises(ValueError, match="limit"):
        load_prompts(limit=limit)  # type: ignore[arg-type]


def test_user_file_with_prompts(tmp_path: Path) -> None:
    path = write(tmp_path, [
        json.dumps({"prompt": "Explain recursion."}),
        "",
        "   ",
        json.dumps({"prompt": "Écris un poème.", "category": "poems"}, ensure_ascii=False),
        json.dumps({"prompt": "Another poem, please.", "category": "poems", "id": "p-x"}),
        json.dumps({"messages": [{"role": "system", "content": "Be brief."}, USER]}),
    ])
    got = load_prompts(str(path))
    assert [(p.id, p.category) for p in got] == [
        ("custom-1", "custom"), ("poems-4", "poems"), ("p-x", "poems"), ("custom-6", "custom")]
    assert got[0].messages == ({"role": "user", "content": "Explain recursion."},)
    assert got[1].messages[0]["content"] == "Écris un poème."
    assert got[3].messages[-1] == USER
    assert [p.id for p in load_prompts(path, categories=["poems"], limit=1)] == ["poems-4"]
    with pytest.raises(ValueError, match="available: custom, poems"):
        load_prompts(str(path), categories=["qa"])


def test_user_file_with_bom_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "win.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "one"}\r\n\r\n{"prompt": "two"}\r\n')
    assert [p.id for p in load_prompts(str(path))] == ["custom-1", "custom-3"]


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "unterminated', "invalid JSON"),
    ('["a list"]', "expected a JSON object"),
    ('{"category": "qa"}', "missing 'prompt' or 'messages'"),
    ('{"prompt": ""}', "empty prompt"),
    ('{"prompt": "   "}', "empty prompt"),
    ('{"prompt": 42}', "'prompt' must be a string"),
    ('{"prompt": "x", "messages": [{"role": "user", "content": "y"}]}', "not both"),
    ('{"prompt": "x", "category": 3}', "'category' must be a non-empty string"),
    ('{"prompt": "x", "id": ""}', "'id' must be a non-empty string"),
    ('{"messages": []}', "'messages' must be a non-empty list"),
    ('{"messages": "hello"}', "'messages' must be a non-empty list"),
    ('{"messages": ["hello"]}', r"messages\[0\] must be an object"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', "'role' must be one of"),
    ('{"messages": [{"content": "x"}]}', "'role' must be one of"),
    ('{"messages": [{"role": "user", "content": null}]}', "'content' must be a string"),
    ('{"messages": [{"role": "user", "content": ""}]}', "empty content"),
    ('{"messages": [{"role": "user", "content": "x", "name": "bob"}]}', "unexpected keys 'name'"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}',
     "last message must be the user's"),
])
def test_bad_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, [json.dumps({"prompt": "fine"}), "", line])
    with pytest.raises(ValueError, match=message) as e:
        load_prompts(str(path))
    assert f"{path}, line 3:" in str(e.value)


def test_duplicate_ids(tmp_path: Path) -> None:
    path = write(tmp_path, [json.dumps({"prompt": "a", "id": "x"}), json.dumps({"prompt": "b", "id": "x"})])
    with pytest.raises(ValueError, match=r"line 2: duplicate id 'x' \(first used on line 1\)"):
        load_prompts(str(path))
    # Default ids include the line number, so repeated prompts do not collide.
    path = write(tmp_path, [json.dumps({"prompt": "a"}), json.dumps({"prompt": "a"})])
    assert [p.id for p in load_prompts(str(path))] == ["custom-1", "custom-2"]


def test_empty_missing_and_unreadable_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty.jsonl: no prompts"):
        load_prompts(str(empty))
    with pytest.raises(ValueError, match="nope.jsonl: prompts file does not exist"):
        load_prompts(str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="is a directory"):
        load_prompts(str(tmp_path))
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes('{"prompt": "café"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.jsonl: not UTF-8"):
        load_prompts(str(latin))


def test_suite_renders_through_a_chat_template(tmp_path_factory: pytest.TempPathFactory,
                                               suite: list[BenchPrompt]) -> None:
    from tests.tiny_hf import make_tiny_hf_dir
    from verispec.models.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(make_tiny_hf_dir(tmp_path_factory.mktemp("tiny_hf")))
    for p in suite:
        messages = [dict(m) for m in p.messages]
        text = tok.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text.endswith("<|im_start|>assistant\n"), p.id
        assert all(m["content"] in text for m in messages), p.id
        ids = tok.chat(messages)
        assert len(ids) > 3 * len(messages), p.id
