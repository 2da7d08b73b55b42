"""Pydantic models of the OpenAI requests the edge accepts, and the checks around them.

Validation is strict (no "10" for 10, no 1.0 for an int) because a request we silently
reinterpret is worse than a clear 400: load generators and SDKs send well-typed JSON, and
anything else is a client bug worth surfacing. Parameters OpenAI defines but tandem does
not implement are rejected by name instead of being ignored, so nobody benchmarks a
feature that is not there; their default values stay accepted, since SDKs send them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cluster.protocol import StructuredOutput
from router.openai import bounds
from router.openai.errors import OpenAIError, bad_request, from_validation_errors
from router.openai.params import ResponseFormat, StructuredOutputs, Tool, ToolChoice, structured_output_of

MAX_STOP_SEQUENCES = 4

# Parameter -> the values that mean "feature off"; anything else is a 400 naming it.
_UNSUPPORTED_COMMON: dict[str, tuple[Any, ...]] = {
    "logit_bias": (None, {}),
}
_UNSUPPORTED_COMPLETION: dict[str, tuple[Any, ...]] = {
    **_UNSUPPORTED_COMMON,
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
}
_UNSUPPORTED_CHAT: dict[str, tuple[Any, ...]] = {
    **_UNSUPPORTED_COMMON,
    # The deprecated forms of tools/tool_choice: use those instead.
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
}
MAX_LOGPROBS = 20  # vLLM's default max_logprobs per engine
# Integers the engine stores in fixed-width tensors: beyond these an engine step would fail
# (seed: a 64-bit torch generator, as vLLM's own server checks; top_k: int32).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1


def _same(value: Any, default: Any) -> bool:
    """Equality that does not confuse True with 1 or 0 with False."""
    if isinstance(value, bool) != isinstance(default, bool):
        return False
    return bool(value == default)


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    include_usage: Optional[bool] = False


class _Request(BaseModel):
    """Fields shared by both endpoints. `None` means "not given" (some clients send null)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = {}

    model: str
    max_tokens: Optional[int] = Field(default=None, gt=0)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    seed: Optional[int] = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: Optional[Union[str, list[str]]] = Field(default=None, json_schema_extra={"anyOf": [
        {"type": "string", "minLength": 1, "maxLength": bounds.MAX_STOP_CHARS},
        {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": bounds.MAX_STOP_CHARS},
         "maxItems": MAX_STOP_SEQUENCES},
        {"type": "null"}]})
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    n: Optional[int] = Field(default=None, json_schema_extra={"enum": [1, None]})
    user: Optional[str] = None
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    # vLLM extensions
    ignore_eos: Optional[bool] = False
    min_tokens: Optional[int] = Field(default=None, ge=0)
    return_token_ids: Optional[bool] = False
    stop_token_ids: Optional[list[int]] = Field(default=None, json_schema_extra={"anyOf": [
        {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": bounds.MAX_STOP_TOKEN_IDS},
        {"type": "null"}]})
    top_k: Optional[int] = Field(default=None, ge=-1, le=INT32_MAX)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: Optional[float] = Field(default=None, gt=0.0, le=2.0)
    structured_outputs: Optional[StructuredOutputs] = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: Optional[Union[str, list[str]]]) -> Optional[Union[str, list[str]]]:
        items = [value] if isinstance(value, str) else (value or [])
        if len(items) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
        if any(s == "" for s in items):
            raise ValueError("stop sequences must not be empty strings")
        if any(len(s) > bounds.MAX_STOP_CHARS for s in items):
            raise ValueError(f"a stop sequence may have at most {bounds.MAX_STOP_CHARS} characters")
        return value

    @field_validator("n")
    @classmethod
    def _check_n(cls, value: Optional[int]) -> Optional[int]:
        if value is not None and value != 1:
            # One prefill hands one sequence's KV to decode; send n requests (with seeds).
            raise ValueError("only n=1 is supported; send n separate requests instead")
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _check_stop_ids(cls, value: Optional[list[int]]) -> Optional[list[int]]:
        if value is not None and any(v < 0 for v in value):
            raise ValueError("token ids must be non-negative integers")
        if value is not None and len(value) > bounds.MAX_STOP_TOKEN_IDS:
            raise ValueError(f"at most {bounds.MAX_STOP_TOKEN_IDS} stop token ids are allowed")
        return value

    @model_validator(mode="after")
    def _check_stream_options(self) -> "_Request":
        if self.stream_options is not None and not self.stream:
            raise ValueError("'stream_options' is only allowed when 'stream' is true")
        return self

    # --- resolved values -------------------------------------------------------------
    @property
    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> Optional[int]:
        """The client's max_tokens, or None when the server should choose."""
        return self.max_tokens

    def num_logprobs(self) -> Optional[int]:
        """None: no logprobs; k: the sampled token's plus the k most likely."""
        raise NotImplementedError

    def structured_output(self) -> Optional[StructuredOutput]:
        return self.structured_outputs.constraint() if self.structured_outputs is not None else None


class CompletionRequest(_Request):
    """POST /v1/completions. One prompt per request: a string, token ids, or [string]."""

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = _UNSUPPORTED_COMPLETION
    DEFAULT_MAX_TOKENS: ClassVar[int] = 16  # OpenAI's default for completions

    # Checked by _check_prompt; the schema says the same for /openapi.json.
    prompt: Any = Field(json_schema_extra={"anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1},
    ]})
    logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def num_logprobs(self) -> Optional[int]:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, value: Any) -> Union[str, list[int]]:
        if isinstance(value, str):
            return value
        if not isinstance(value, list) or not value:
            raise ValueError("must be a string, a list of token ids, or a list with one string")
        if all(isinstance(v, str) for v in value):
            if len(value) != 1:
                raise ValueError(
                    f"got {len(value)} prompts; only one prompt per request is supported"
                )
            return value[0]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            if any(v < 0 for v in value):
                raise ValueError("token ids must be non-negative integers")
            return list(value)
        if all(isinstance(v, list) for v in value):
            raise ValueError(f"got {len(value)} prompts; only one prompt per request is supported")
        raise ValueError("must be a string, a list of token ids, or a list with one string")


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["text"]
    text: str


class CalledFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    name: str
    arguments: str  # JSON text, as the model produced it


class MessageToolCall(BaseModel):
    """A tool call of an earlier assistant turn, in OpenAI's shape (the chat template and
    vLLM's tool parser read these fields, so anything else is a 400 here, not a 500 there)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    id: str
    type: Literal["function"]
    function: CalledFunction


_TEXT_PART_SCHEMA = {"type": "object", "required": ["type", "text"], "additionalProperties": False,
                     "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}


class ChatMessage(BaseModel):
    """One conversation turn. Only text content; parts are joined the way vLLM joins them."""

    model_config = ConfigDict(strict=True, extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    # Required; null only on an assistant turn with tool_calls. Checked by _check_content.
    content: Any = Field(json_schema_extra={"anyOf": [
        {"type": "string"}, {"type": "null"}, {"type": "array", "items": _TEXT_PART_SCHEMA},
    ]})
    name: Optional[str] = None
    tool_calls: Optional[list[MessageToolCall]] = None  # an assistant turn that called tools
    tool_call_id: Optional[str] = None  # a tool turn: which call this answers

    @model_validator(mode="after")
    def _check_turn(self) -> "ChatMessage":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("'content' is required (it may be null only on an assistant turn with 'tool_calls')")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a 'tool' message needs the 'tool_call_id' it answers")
        return self

    @field_validator("content")
    @classmethod
    def _check_content(cls, value: Any) -> Union[None, str, list[TextPart]]:
        if value is None:
            return None
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            parts = []
            for i, part in enumerate(value):
                try:
                    parts.append(TextPart.model_validate(part))
                except ValidationError:
                    raise ValueError(
                        f"part {i} is not supported: only text parts "
                        '({"type": "text", "text": "..."}) are accepted'
                    ) from None
            return parts
        raise ValueError('must be a string or a list of {"type": "text", "text": ...} parts')

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(part.text for part in self.content)

    def for_template(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls is not None:
            out["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class ChatCompletionRequest(_Request):
    """POST /v1/chat/completions."""

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = _UNSUPPORTED_CHAT

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, gt=0)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_LOGPROBS)
    response_format: Optional[ResponseFormat] = None
    tools: Optional[list[Tool]] = Field(default=None, max_length=bounds.MAX_TOOLS)
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: Optional[bool] = None

    @model_validator(mode="after")
    def _check_extras(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("'top_logprobs' needs 'logprobs': true")
        choice = self.tool_choice
        if choice not in (None, "none") and not self.tools:
            raise ValueError("'tool_choice' needs 'tools'")
        if isinstance(choice, BaseModel) and choice.function.name not in {t.function.name for t in self.tools or []}:
            raise ValueError(f"'tool_choice' names function {choice.function.name!r}, which is not in 'tools'")
        if self.calls_tools() and (self.response_format is not None and self.response_format.type != "text"
                                   or self.structured_outputs is not None):
            raise ValueError("'tool_choice' cannot be combined with 'response_format' or 'structured_outputs'")
        structured_output_of(self.response_format, self.structured_outputs)  # both set: error
        return self

    def calls_tools(self) -> bool:
        """Tools are offered and the model may (auto) or must (required, named) call one."""
        return bool(self.tools) and self.tool_choice != "none"

    def num_logprobs(self) -> Optional[int]:
        return (self.top_logprobs or 0) if self.logprobs else None

    def structured_output(self) -> Optional[StructuredOutput]:
        return structured_output_of(self.response_format, self.structured_outputs)

    @model_validator(mode="after")
    def _check_token_aliases(self) -> "ChatCompletionRequest":
        a, b = self.max_tokens, self.max_completion_tokens
        if a is not None and b is not None and a != b:
            raise ValueError(
                "'max_tokens' and 'max_completion_tokens' are both set and differ; set one"
            )
        return self

    def requested_max_tokens(self) -> Optional[int]:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens


RequestT = TypeVar("RequestT", bound=_Request)


def parse_request(model_cls: type[RequestT], body: Any) -> RequestT:
    """Validate a decoded JSON body, raising `OpenAIError` (400) with the field named.

    Unknown and unsupported parameters are checked before pydantic so that their specific
    messages win over whatever else is wrong with the body.
    """
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    unsupported = model_cls.unsupported
    for key, value in body.items():
        if key in unsupported:
            if not any(_same(value, d) for d in unsupported[key]):
                raise OpenAIError(
                    400,
                    f"Unsupported parameter: '{key}' is not supported by this server yet.",
                    "invalid_request_error",
                    key,
                    "unsupported_parameter",
                )
        elif key not in model_cls.model_fields:
            raise bad_request(f"Unrecognized request argument supplied: {key}", key, "unknown_parameter")
    known = {k: v for k, v in body.items() if k not in unsupported}
    try:
        return model_cls.model_validate(known)
    except ValidationError as exc:
        errors = exc.errors()
        if errors and errors[0].get("type") == "value_error" and not errors[0].get("loc"):
            # model-level checks: name the parameter they are about
            raise _model_level_error(str((errors[0].get("ctx") or {}).get("error", ""))) from None
        raise from_validation_errors(errors) from None


def _model_level_error(message: str) -> OpenAIError:
    params = ("stream_options", "max_completion_tokens", "top_logprobs", "structured_outputs", "tool_choice",
              "response_format")
    named = sorted((message.find(f"'{p}'"), p) for p in params if f"'{p}'" in message)
    if named:  # the parameter named first is the one the message is about
        return bad_request(message, named[0][1], "invalid_value")
    return bad_request(message)
