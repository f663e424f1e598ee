"""Tokenizer, chat template and incremental detokenization with stop strings."""

from __future__ import annotations

import filecmp
import json
import re
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any


class Tokenizer:
    """A Hugging Face tokenizer: its Rust backend encodes and decodes; transformers' tokenizer object is loaded
    only when a chat template must be rendered (importing transformers and building its tokenizer cost ~2 s of
    every start)."""

    def __init__(self, backend: Any, *, eos_token: str | None, unk_token: str | None,
                 load_hf: Callable[[], Any], file: Path | None = None) -> None:
        self.backend = backend  # a tokenizers.Tokenizer
        self.file = file  # the tokenizer.json it was read from, if any
        self._load_hf = load_hf
        self.unk_id = backend.token_to_id(unk_token) if unk_token else None
        eos = {backend.token_to_id(eos_token)} if eos_token else set()
        # Chat models end a turn with their own token (Qwen: <|im_end|>) besides the document end.
        for name in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>"):
            tid = backend.token_to_id(name)
            if tid is not None and tid != self.unk_id:
                eos.add(tid)
        eos.discard(None)
        self.eos_ids: tuple[int, ...] = tuple(sorted(eos))
        # What the tokenizer's post-processor puts before a text: Gemma's <bos> (its model needs it at the start);
        # nothing for Qwen or SmolLM2.
        plain = backend.encode("a", add_special_tokens=False).ids
        full = backend.encode("a", add_special_tokens=True).ids
        at = next((k for k in range(len(full) - len(plain) + 1) if full[k : k + len(plain)] == plain), 0)
        self.bos_ids: tuple[int, ...] = tuple(full[:at])

    @classmethod
    def from_hf(cls, hf: Any) -> "Tokenizer":
        """Wrap a loaded transformers fast tokenizer."""
        return cls(hf.backend_tokenizer, eos_token=hf.eos_token, unk_token=hf.unk_token, load_hf=lambda: hf)

    @classmethod
    def from_dir(cls, path: str | Path, like: "Tokenizer | None" = None) -> "Tokenizer":
        """A model directory's tokenizer: straight from its tokenizer.json where transformers would decode that
        file's output unchanged, else through transformers. `like`: a tokenizer already loaded whose backend is
        reused when its tokenizer.json has the same bytes (a pair of one family: 0.4 s of start-up)."""
        path = Path(path)

        def load_hf() -> Any:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(str(path))

        config = _read_json(path / "tokenizer_config.json")
        if (path / "tokenizer.json").is_file():
            from tokenizers import Tokenizer as Backend

            file = path / "tokenizer.json"
            same = like is not None and like.file is not None and filecmp.cmp(like.file, file, shallow=False)
            backend = like.backend if same else Backend.from_file(str(file))
            # transformers' decode cleans up spaces when asked, except for BPE models: only then does it differ
            if not config.get("clean_up_tokenization_spaces") or type(backend.model).__name__ == "BPE":
                special = _read_json(path / "special_tokens_map.json")
                return cls(backend, eos_token=_token(config, special, "eos_token"),
                           unk_token=_token(config, special, "unk_token"), load_hf=load_hf,
                           file=file)
        return cls.from_hf(load_hf())

    @cached_property
    def hf(self) -> Any:
        """transformers' tokenizer (for chat templates), loaded on first use."""
        return self._load_hf()

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, special: bool = True, bos: bool = True) -> list[int]:
        """Token ids of `text`. special=False: text that spells a control token (e.g. "<|im_end|>") is encoded as
        the plain text it is, never as that token (ValueError where this tokenizer cannot). bos: begin with the
        tokens this tokenizer puts before a text (`bos_ids`: Gemma's <bos>, none for Qwen), as a prompt does;
        False for a piece of text that is not a sequence's start."""
        ids = self._encode(text) if special or not self._spells_control(text) else self._plain(text)
        return [*self.bos_ids, *ids] if bos else ids

    def _encode(self, text: str, split_special: bool = False) -> list[int]:
        if not split_special:
            return self.backend.encode(text, add_special_tokens=False).ids
        self.backend.encode_special_tokens = True  # text that spells a control token stays text
        try:
            return self.backend.encode(text, add_special_tokens=False).ids
        finally:
            self.backend.encode_special_tokens = False

    @cached_property
    def controls(self) -> dict[str, int]:
        """The control tokens (special added tokens, <unk> aside) by their text: only a chat template inserts them."""
        return {t.content: i for i, t in self.backend.get_added_tokens_decoder().items()
                if t.special and i != self.unk_id}

    def _spells_control(self, text: str) -> bool:
        return any(c in text for c in self.controls)

    def _plain(self, text: str) -> list[int]:
        ids = self._encode(text, split_special=True)
        made = [i for i in ids if i in self.controls.values()]
        if made:
            name = next(c for c, i in self.controls.items() if i == made[0])
            raise ValueError(f"the text spells the control token {name!r}, which this tokenizer cannot encode as "
                             "plain text")
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=True)

    def token_text(self, token: int) -> str:
        """One token's text as a logprobs entry shows it (a control token by its name; part of a character
        as U+FFFD)."""
        return self.backend.decode([token], skip_special_tokens=False)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def chat(self, messages: str | list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation wrapped in the model's chat template, ready for the assistant turn.

        Only the template inserts control tokens: message text that spells one (a user writing "<|im_end|>" to
        forge a turn) is encoded as plain text (ValueError where the tokenizer or template cannot do that)."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if not self.has_chat_template:
            raise ValueError("this model has no chat template")
        text = self._render(messages)
        if not any(self._spells_control(m["content"]) for m in messages):
            return self._encode(text)  # the common case: exactly the template's tokens
        return self._chat_protected(messages, text)

    def _render(self, messages: list[dict[str, str]]) -> str:
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _chat_protected(self, messages: list[dict[str, str]], text: str) -> list[int]:
        """Render the template around placeholders, so its own control strings are known; they become control
        tokens and everything between them (template text and message text) is encoded as plain text."""
        marks = {f"\ue000{i}\ue001": m["content"] for i, m in enumerate(messages)}
        skeleton = self._render([{**m, "content": mark} for mark, m in zip(marks, messages)])
        parts = re.split("(" + "|".join(map(re.escape, marks)) + ")", skeleton)  # odd indices: placeholders
        if "".join(marks.get(p, p) for p in parts) != text:
            raise ValueError("a message spells a control token, and this chat template does not insert message "
                             "text verbatim, so it cannot be kept as plain text")
        controls = re.compile("|".join(map(re.escape, sorted(self.controls, key=len, reverse=True))))
        ids: list[int] = []
        run = ""  # plain text since the last control token
        for k, part in enumerate(parts):
            if k % 2:
                run += marks[part]
                continue
            at = 0
            for m in controls.finditer(part):
                ids += self._plain(run + part[at:m.start()])
                ids.append(self.controls[m.group()])
                run, at = "", m.end()
            run += part[at:]
        return ids + self._plain(run)

    def vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def _token(config: dict[str, Any], special: dict[str, Any], key: str) -> str | None:
    """A special token's text from tokenizer_config.json (or special_tokens_map.json): a string or {"content"}."""
    value = config.get(key, special.get(key))
    return value.get("content") if isinstance(value, dict) else value


class TextStream:
    """Turns new token ids into printable text deltas and finds stop strings.

    Text is decoded from the start each time (cheap at these lengths, and correct for byte-level BPE where
    one character can span tokens); a trailing partial character or a tail that may begin a stop string is
    held back until it resolves.
    """

    def __init__(self, tokenizer: Tokenizer, stop: list[str] | tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""  # final text so far (stop string excluded)
        self.sent = 0  # characters already returned by push()
        self.stopped = False

    def stop_fn(self, ids: list[int]) -> int | None:
        """For engine.stream: how many tokens to keep when a stop string appears, else None."""
        text = self.tokenizer.decode(ids)
        hits = [text.find(s) for s in self.stop]
        hits = [h for h in hits if h >= 0]
        if not hits:
            return None
        cut = min(hits)
        # The fewest tokens whose text covers everything before the stop string.
        for k in range(len(ids) + 1):
            if len(self.tokenizer.decode(ids[:k])) >= cut:
                return k
        return len(ids)

    def push(self, new_ids: list[int]) -> str:
        """Add tokens; return the text that is now safe to show."""
        self.ids.extend(new_ids)
        text = self.tokenizer.decode(self.ids)
        for s in self.stop:
            at = text.find(s)
            if at >= 0:
                text, self.stopped = text[:at], True
        self.text = text
        safe = len(text)
        if not self.stopped:
            while safe > self.sent and text[safe - 1] == "\ufffd":
                safe -= 1
            for s in self.stop:  # hold back a tail that could still grow into a stop string
                for k in range(min(len(s) - 1, safe), 0, -1):
                    if text[safe - k : safe] == s[:k]:
                        safe = min(safe, len(text) - k)
                        break
        delta = text[self.sent : safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return delta

    def flush(self) -> str:
        """Whatever was held back, at the end of generation."""
        delta = self.text[self.sent :]
        self.sent = len(self.text)
        return delta
