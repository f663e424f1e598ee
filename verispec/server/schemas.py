"""OpenAI request shapes (pydantic), their validation, and the OpenAI error envelope.

Requests are strict: a number sent as a string, an unknown field or a value out of range is a 400 with
`{"error": {"message", "type", "param", "code"}}`, never a silent coercion. Fields OpenAI defines but
verispec does not implement (penalties, logprobs, echo, n > 1) are accepted only at their neutral value, so
a client never gets something other than what it asked for without being told.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: Bool = False


class _Sampling(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="forbid")

    model: Str | None = None
    max_tokens: Int | None = None
    temperature: Float = 1.0  # OpenAI's default: sampling, not greedy
    top_p: Float = 1.0
    top_k: Int = 0  # extension; 0 or -1 = off
    seed: Int | None = None
    stop: Str | list[Str] | None = Field(default=None, validate_default=True)
    stream: Bool = False
    stream_options: StreamOptions | None = None
    n: Int = 1
    user: Str | None = None
    return_token_ids: Bool = False  # extension: token ids beside the text (what `verispec generate --json` shows)
    strategy: Str | None = None  # extension: the drafting strategy for this request (default: the server's)
    # Accepted only at their neutral values:
    presence_penalty: Float = 0.0
    frequency_penalty: Float = 0.0
    logprobs: Any = None
    logit_bias: dict[str, float] | None = None

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v: float) -> float:
        if not math.isfinite(v) or not 0.0 <= v <= 2.0:
            raise ValueError("must be a finite number in [0, 2]")
        return v

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, v: float) -> float:
        if not math.isfinite(v) or not 0.0 < v <= 1.0:
            raise ValueError("must be in (0, 1]")
        return v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v < -1:
            raise ValueError("must be >= 0 (0 or -1 disables it)")
        return max(v, 0)

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError("must be at least 1")
        return v

    @field_validator("seed")
    @classmethod
    def _seed(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v < 2**63:
            raise ValueError("must be in [0, 2^63)")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        return [s for s in stops if s]

    @field_validator("n")
    @classmethod
    def _n(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n = 1 is supported")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, v: float) -> float:
        if v != 0.0:
            raise ValueError("penalties are not supported (they would change the target's distribution); use 0")
        return v

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v: Any) -> Any:
        if v not in (None, False, 0):
            raise ValueError("logprobs are not supported")
        return None

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, v: dict | None) -> None:
        if v:
            raise ValueError("logit_bias is not supported")
        return None


TokenIds = list[Int]


class CompletionRequest(_Sampling):
    prompt: Str | TokenIds | list[Str] | list[TokenIds]
    echo: Bool = False
    best_of: Int | None = None
    suffix: Str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> str | list[int]:
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError("exactly one prompt per request is supported")
            v = v[0]
        if (isinstance(v, str) and not v.strip()) or (isinstance(v, list) and not v):
            raise ValueError("the prompt is empty")
        return v

    @model_validator(mode="after")
    def _unsupported(self) -> "CompletionRequest":
        if self.echo:
            raise ValueError("echo is not supported")
        if self.best_of not in (None, 1):
            raise ValueError("best_of must be 1")
        if self.suffix:
            raise ValueError("suffix is not supported")
        return self


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: Str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: Str | list[TextPart] | None = None
    name: Str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatRequest(_Sampling):
    messages: list[Message]
    max_completion_tokens: Int | None = None  # the newer name for max_tokens

    @field_validator("messages")
    @classmethod
    def _messages(cls, v: list[Message]) -> list[Message]:
        if not v:
            raise ValueError("messages is empty")
        if not any(m.text().strip() for m in v):
            raise ValueError("every message is empty")
        return v

    @model_validator(mode="after")
    def _one_limit(self) -> "ChatRequest":
        if self.max_completion_tokens is not None:
            if self.max_completion_tokens < 1:
                raise ValueError("max_completion_tokens must be at least 1")
            self.max_tokens = self.max_completion_tokens
        return self

    def chat_messages(self) -> list[dict[str, str]]:
        role = {"developer": "system"}
        return [{"role": role.get(m.role, m.role), "content": m.text()} for m in self.messages]


# ---- errors ------------------------------------------------------------------------------------------------


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The OpenAI error envelope."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class APIError(Exception):
    """Raised by handlers; turned into `error_body` with `status`."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def validation_error_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """A pydantic/FastAPI error list -> one OpenAI envelope, naming the first offending field.

    Only the field path and pydantic's message are used: never the input value (it may be huge) and never
    anything about the server.
    """
    if not errors:
        return error_body("invalid request")
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    # Drop pydantic's union-branch labels (e.g. "str", "list[int]", "function-after[...]") from the path.
    loc = [x for x in loc if not any(c in x for c in "[]") and x not in ("str", "int", "float", "bool")]
    param = ".".join(loc) or None
    kind = first.get("type", "")
    if kind == "json_invalid":
        return error_body("the request body is not valid JSON", param=None, code="invalid_json")
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        msg, code = "unknown field", "unknown_field"
    elif kind == "missing":
        msg, code = "field required", "missing_field"
    elif kind.endswith("_type") or kind.endswith("_parsing"):
        code = "invalid_type"
    else:
        code = "invalid_value"
    if param is None and kind in ("model_attributes_type", "dict_type", "model_type"):
        return error_body("the request body must be a JSON object", code="invalid_type")
    return error_body(f"{param}: {msg}" if param else msg, param=param, code=code)
