"""The tokenizer read straight from tokenizer.json (no transformers at start-up) must tokenize exactly as
transformers' tokenizer of the same directory: same ids, same text back, same end-of-sequence and control tokens."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from verispec.models.tokenizer import Tokenizer

SPELLS = ["def f ( x ) : return x + 1", "print ( a ) <|im_end|> if a", "<|im_start|> user \n x", "", "x  y\n\n(",
          "naïve café 𝔘 ☃ 中文 ﬁ Å", "\t\tif x:\n\t\t\treturn None  # ok\r\n", "<|endoftext|><|im_end|>"]


def same_as_transformers(tok: Tokenizer, hf, texts: list[str]) -> None:
    assert tok.eos_ids == Tokenizer.from_hf(hf).eos_ids
    assert tok.controls == Tokenizer.from_hf(hf).controls
    assert len(tok) == len(hf)
    assert tok.vocab() == hf.get_vocab()
    for text in texts:
        ids = tok.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False), text
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
        if not any(c in text for c in tok.controls):
            continue
        plain = hf.encode(text, add_special_tokens=False, split_special_tokens=True)
        if any(i in tok.controls.values() for i in plain):
            with pytest.raises(ValueError, match="control token"):
                tok.encode(text, special=False)
        else:
            assert tok.encode(text, special=False) == plain, text


def test_tiny_directory_tokenizes_like_transformers(tmp_path: Path) -> None:
    """Against transformers' generic class, which reads tokenizer.json as it is (AutoTokenizer would rebuild this
    word-level file as a Qwen2 BPE tokenizer, because config.json says qwen2, and drop words)."""
    from transformers import PreTrainedTokenizerFast

    from tests.tiny_hf import make_tiny_hf_dir

    path = make_tiny_hf_dir(tmp_path)
    tok = Tokenizer.from_dir(path)
    assert "hf" not in tok.__dict__  # transformers' tokenizer is not built to encode or decode
    same_as_transformers(tok, PreTrainedTokenizerFast.from_pretrained(str(path)), SPELLS)
    messages = [{"role": "user", "content": "def f ( x )"}]
    assert tok.chat(messages) == tok.encode(tok.hf.apply_chat_template(messages, tokenize=False,
                                                                       add_generation_prompt=True))


def test_cleanup_of_spaces_goes_through_transformers(tmp_path: Path) -> None:
    """A non-BPE tokenizer that asks for transformers' space clean-up is loaded through transformers."""
    from tests.tiny_hf import make_tiny_hf_dir

    path = make_tiny_hf_dir(tmp_path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "clean_up_tokenization_spaces": True}))
    tok = Tokenizer.from_dir(path)
    assert tok.hf.backend_tokenizer is tok.backend  # transformers' tokenizer, wrapped
    assert tok.decode(tok.encode("x ( a )")) == tok.hf.decode(tok.encode("x ( a )"), skip_special_tokens=True)


@pytest.mark.slow
def test_real_tokenizers_tokenize_like_transformers() -> None:
    """Both packaged models' converted directories, over the suite's texts, a source file and odd characters,
    against AutoTokenizer (what loaded them before)."""
    from transformers import AutoTokenizer

    from verispec.bench.suite import load_prompts
    from verispec.models.load import resolve
    from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET

    texts = SPELLS + [m["content"] for p in load_prompts("suite") for m in p.messages]
    texts.append(inspect.getsource(json))
    for spec in (DEFAULT_TARGET, DEFAULT_DRAFT):
        path = resolve(spec, progress=False)
        tok = Tokenizer.from_dir(path)
        assert "hf" not in tok.__dict__
        same_as_transformers(tok, AutoTokenizer.from_pretrained(str(path)), texts)
