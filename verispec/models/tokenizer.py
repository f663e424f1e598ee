"""Tokenizer, chat template and incremental detokenization with stop strings."""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Any


class Tokenizer:
    """A thin wrapper over a Hugging Face fast tokenizer loaded from a model directory."""

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        eos = {hf.eos_token_id} if hf.eos_token_id is not None else set()
        # Chat models end a turn with their own token (Qwen: <|im_end|>) besides the document end.
        for name in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>"):
            tid = hf.convert_tokens_to_ids(name)
            if isinstance(tid, int) and tid != hf.unk_token_id and tid is not None:
                eos.add(tid)
        self.eos_ids: tuple[int, ...] = tuple(sorted(eos))

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path)))

    def __len__(self) -> int:
        return len(self.hf)

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of `text`. special=False: text that spells a control token (e.g. "<|im_end|>") is encoded as
        the plain text it is, never as that token (ValueError where this tokenizer cannot)."""
        if special or not self._spells_control(text):
            return self.hf.encode(text, add_special_tokens=False)
        return self._plain(text)

    @cached_property
    def controls(self) -> dict[str, int]:
        """The control tokens (special added tokens, <unk> aside) by their text: only a chat template inserts them."""
        return {t.content: i for i, t in self.hf.added_tokens_decoder.items()
                if t.special and i != self.hf.unk_token_id}

    def _spells_control(self, text: str) -> bool:
        return any(c in text for c in self.controls)

    def _plain(self, text: str) -> list[int]:
        ids = self.hf.encode(text, add_special_tokens=False, split_special_tokens=True)
        made = [i for i in ids if i in self.controls.values()]
        if made:
            name = next(c for c, i in self.controls.items() if i == made[0])
            raise ValueError(f"the text spells the control token {name!r}, which this tokenizer cannot encode as "
                             "plain text")
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

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
            return self.hf.encode(text, add_special_tokens=False)  # the common case: exactly the template's tokens
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
        return self.hf.get_vocab()


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
