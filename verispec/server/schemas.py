"""OpenAI request shapes (pydantic), their validation, and the OpenAI error envelope.

Requests are strict: a number sent as a string, an unknown field or a value out of range is a 400 with
`{"error": {"message", "type", "param", "code"}}`, never a silent coercion. JSON `null` for an optional field
means its default, as the official client sends it. Fields OpenAI defines but verispec does not implement
(tools, echo, best_of, ...) are accepted only at their neutral value, and otherwise refused as "not supported by
verispec", so a client never gets something other than what it asked for without being told.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationInfo, field_validator, model_validator,
)
from pydantic_core import PydanticCustomError

from verispec.grammar import GrammarSpec


Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]


def _not_supported(*neutral: Any, why: str = "") -> Any:
    """The type of an OpenAI field verispec does not implement: null or one of its `neutral` values (which
    change nothing) is accepted and dropped, anything else is a `not_supported` error naming the field."""

    def check(value: Any, info: ValidationInfo) -> None:
        if value is None or any(value == n and isinstance(value, bool) == isinstance(n, bool) for n in neutral):
            return None
        only = f"; only {' or '.join(repr(n) for n in neutral)} is accepted" if neutral else ""
        raise PydanticCustomError("not_supported", "{field} is not supported by verispec{only}{why}",
                                  {"field": info.field_name, "only": only, "why": f" ({why})" if why else ""})

    return Annotated[Any, BeforeValidator(check)]


_NoTools = _not_supported([], why="no tool or function calling")
_NoToolChoice = _not_supported("none", why="no tool or function calling")
_Absent = _not_supported()


class _Body(BaseModel):
    """A request object: unknown fields are refused; JSON null for an optional field means its default."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items() if v is not None or k not in fields or fields[k].is_required()}


class StreamOptions(_Body):
    include_usage: Bool = False


class JsonSchema(_Body):
    name: Str = "schema"
    description: Str | None = None
    schema_: dict[Str, Any] = Field(default_factory=dict, alias="schema")
    strict: Bool | None = None


class ResponseFormat(_Body):
    """OpenAI's response_format: text, json_object, json_schema; and (extension) regex."""

    type: Literal["text", "json_object", "json_schema", "regex"]
    json_schema: JsonSchema | None = None
    regex: Str | None = None

    @model_validator(mode="after")
    def _fields(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs a json_schema object")
        if self.type == "regex" and not self.regex:
            raise ValueError("type regex needs a regex")
        return self

    def grammar(self) -> GrammarSpec | None:
        if self.type == "json_schema":
            assert self.json_schema is not None
            return GrammarSpec("json_schema", json.dumps(self.json_schema.schema_))
        if self.type == "json_object":
            return GrammarSpec("json_object")
        if self.type == "regex":
            return GrammarSpec("regex", self.regex or "")
        return None


class _Sampling(_Body):
    """Fields shared by both endpoints."""

    model: Str | None = None
    max_tokens: Int | None = None
    temperature: Float = 1.0  # OpenAI's default: sampling, not greedy
    top_p: Float = 1.0
    top_k: Int = 0  # extension; 0 or -1 = off
    seed: Int | None = None
    stop: Str | list[Str] | None = Field(default=None, validate_default=True)
    stream: Bool = False
    stream_options: StreamOptions | None = None
    user: Str | None = None  # accepted and ignored, as are the two below: identifiers that change no output
    metadata: dict[Str, Str] | None = None
    safety_identifier: Str | None = None
    return_token_ids: Bool = False  # extension: token ids beside the text (what `verispec generate --json` shows)
    strategy: Str | None = None  # extension: the drafting strategy for this request (default: the server's)
    ignore_eos: Bool = False  # extension (vLLM's): decode max_tokens tokens, past the end of sequence (load tests)
    # applied to the target at every verified position (sampling.Penalties): exact under speculation
    presence_penalty: Float = 0.0
    frequency_penalty: Float = 0.0
    repetition_penalty: Float = 1.0  # extension (vLLM's): > 1 discourages tokens of the prompt and the output
    logit_bias: dict[Str, Float] | None = None  # token id (as a string, as OpenAI sends it) -> -100 .. 100
    # the output follows a JSON schema, any JSON object or (extension) a regex; an extension on completions
    response_format: ResponseFormat | None = None
    n: Int = 1  # choices: n sequences of the one prompt, seeded seed, seed + 1, ... where a seed is given
    # OpenAI's, not implemented: accepted at their neutral value only.
    service_tier: _not_supported("auto", "default") = None

    @field_validator("n")
    @classmethod
    def _n(cls, v: int) -> int:
        if not 1 <= v <= 8:
            raise ValueError("must be in [1, 8]")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _penalty(cls, v: float) -> float:
        if not math.isfinite(v) or not -2.0 <= v <= 2.0:
            raise ValueError("must be a number in [-2, 2]")
        return v

    @field_validator("repetition_penalty")
    @classmethod
    def _repetition(cls, v: float) -> float:
        if not math.isfinite(v) or not 0.0 < v <= 10.0:
            raise ValueError("must be a number in (0, 10]")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return None
        if len(v) > 1024:
            raise ValueError("at most 1024 entries")
        for key, bias in v.items():
            if not key.isascii() or not key.isdigit():
                raise ValueError(f"keys must be token ids written as decimal strings, got {key[:20]!r}")
            if not math.isfinite(bias) or not -100.0 <= bias <= 100.0:
                raise ValueError(f"biases must be numbers in [-100, 100], got {bias} for token {key}")
        return v

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
        return v  # one below the probabilities' dtype keeps the top token alone (sampling.logits_to_probs)

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


TokenIds = list[Int]


class CompletionRequest(_Sampling):
    prompt: Str | TokenIds | list[Str] | list[TokenIds]
    logprobs: Int | None = None  # the sampled tokens' log-probabilities and this many alternatives (0 .. 5)
    echo: _not_supported(False) = None
    best_of: _not_supported(1, why="one choice per request") = None
    suffix: _not_supported("") = None

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v <= 5:
            raise ValueError("must be in [0, 5]")
        return v

    def top_logprobs_wanted(self) -> int | None:
        """None: no logprobs; k: each token's and its k most likely alternatives'."""
        return self.logprobs

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

    def text_length(self) -> int:
        """Characters of text to tokenize (0 for token ids)."""
        return len(self.prompt) if isinstance(self.prompt, str) else 0


class TextPart(_Body):
    type: Literal["text"]
    text: Str

    @field_validator("type", mode="before")
    @classmethod
    def _text_only(cls, v: Any) -> Any:
        if v in ("image_url", "input_audio", "file", "refusal"):
            raise PydanticCustomError("not_supported", "content parts of type {kind!r} are not supported by "
                                      "verispec (text only)", {"kind": v})
        return v


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: Str | list[TextPart] | None = None
    name: Str | None = None
    # What the official client echoes back in an assistant message: accepted empty.
    refusal: _Absent = None
    annotations: _not_supported([]) = None
    audio: _Absent = None
    tool_calls: _NoTools = None
    function_call: _Absent = None

    @field_validator("role", mode="before")
    @classmethod
    def _no_tool_role(cls, v: Any) -> Any:
        if v in ("tool", "function"):
            raise PydanticCustomError("not_supported", "messages of role {role!r} are not supported by verispec "
                                      "(no tool or function calling)", {"role": v})
        return v

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatRequest(_Sampling):
    messages: list[Message]
    max_completion_tokens: Int | None = None  # the newer name for max_tokens
    logprobs: Bool = False  # the sampled tokens' log-probabilities (the target's)
    top_logprobs: Int | None = None  # with logprobs: this many most likely alternatives per token (0 .. 20)
    tools: _NoTools = None
    tool_choice: _NoToolChoice = None
    parallel_tool_calls: _not_supported(True, False) = None  # inert without tools
    functions: _NoTools = None
    function_call: _NoToolChoice = None
    modalities: _not_supported(["text"]) = None
    audio: _Absent = None
    prediction: _Absent = None
    reasoning_effort: _Absent = None
    verbosity: _Absent = None
    web_search_options: _Absent = None
    store: _not_supported(False) = None
    prompt_cache_key: Str | None = None  # accepted and ignored

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
        if self.top_logprobs is not None:
            if not 0 <= self.top_logprobs <= 20:
                raise ValueError("top_logprobs must be in [0, 20]")
            if not self.logprobs:
                raise ValueError("top_logprobs needs logprobs: true")
        if self.max_completion_tokens is not None:
            if self.max_completion_tokens < 1:
                raise ValueError("max_completion_tokens must be at least 1")
            self.max_tokens = self.max_completion_tokens
        return self

    def top_logprobs_wanted(self) -> int | None:
        """None: no logprobs; k: each token's and its k most likely alternatives'."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def chat_messages(self) -> list[dict[str, str]]:
        role = {"developer": "system"}
        return [{"role": role.get(m.role, m.role), "content": m.text()} for m in self.messages]

    def text_length(self) -> int:
        """Characters of message text to tokenize (the template adds a few more)."""
        return sum(len(m.text()) for m in self.messages)


# ---- errors ------------------------------------------------------------------------------------------------


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """The OpenAI error envelope."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class APIError(Exception):
    """Raised by handlers; turned into `error_body` with `status` (and `headers`, e.g. Connection: close)."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def validation_error_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """A pydantic/FastAPI error list -> one OpenAI envelope, naming the offending field.

    A "not supported" error is reported first (a union's other branches would only say "not a string"). Only the
    field path and pydantic's message are used: never the input value (it may be huge) and never anything about
    the server.
    """
    if not errors:
        return error_body("invalid request")
    first = min(errors, key=lambda e: e.get("type") != "not_supported")
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    # Drop pydantic's union-branch labels (e.g. "str", "list[int]", "function-after[...]") from the path.
    loc = [x for x in loc if not any(c in x for c in "[]") and x not in ("str", "int", "float", "bool")]
    param = ".".join(loc) or None
    kind = first.get("type", "")
    if kind == "json_invalid":
        reason = str((first.get("ctx") or {}).get("error", ""))
        if reason.startswith("EOF while parsing a value at line 1 column 0"):
            return error_body("the request body is empty; send a JSON object", code="invalid_json")
        return error_body(f"the request body is not valid JSON: {reason}" if reason else
                          "the request body is not valid JSON", code="invalid_json")
    if param is None and kind in ("model_attributes_type", "dict_type", "model_type"):
        return error_body("the request body must be a JSON object", code="invalid_type")
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "not_supported":
        return error_body(msg, param=param, code="unsupported_parameter")
    code = "invalid_type" if kind.endswith(("_type", "_parsing")) else "invalid_value"
    if kind == "extra_forbidden":
        msg, code = "unknown field (not an OpenAI parameter of this endpoint nor a verispec extension)", "unknown_field"
    elif kind == "missing":
        msg, code = "field required", "missing_field"
    return error_body(f"{param}: {msg}" if param else msg, param=param, code=code)
