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

from router.openai.errors import OpenAIError, bad_request, from_validation_errors

MAX_STOP_SEQUENCES = 4

# Parameter -> the values that mean "feature off"; anything else is a 400 naming it.
_UNSUPPORTED_COMMON: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
}
_UNSUPPORTED_COMPLETION: dict[str, tuple[Any, ...]] = {
    **_UNSUPPORTED_COMMON,
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
}
_UNSUPPORTED_CHAT: dict[str, tuple[Any, ...]] = {
    **_UNSUPPORTED_COMMON,
    "top_logprobs": (None, 0),
    "response_format": (None, {"type": "text"}),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "parallel_tool_calls": (None, True),
}


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
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    n: Optional[int] = None
    user: Optional[str] = None
    # vLLM extensions
    ignore_eos: Optional[bool] = False
    min_tokens: Optional[int] = Field(default=None, ge=0)
    return_token_ids: Optional[bool] = False

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: Optional[Union[str, list[str]]]) -> Optional[Union[str, list[str]]]:
        items = [value] if isinstance(value, str) else (value or [])
        if len(items) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
        if any(s == "" for s in items):
            raise ValueError("stop sequences must not be empty strings")
        return value

    @field_validator("n")
    @classmethod
    def _check_n(cls, value: Optional[int]) -> Optional[int]:
        if value is not None and value != 1:
            raise ValueError("only n=1 is supported")
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


class CompletionRequest(_Request):
    """POST /v1/completions. One prompt per request: a string, token ids, or [string]."""

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = _UNSUPPORTED_COMPLETION
    DEFAULT_MAX_TOKENS: ClassVar[int] = 16  # OpenAI's default for completions

    prompt: Any

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


class ChatMessage(BaseModel):
    """One conversation turn. Only text content; parts are joined the way vLLM joins them."""

    model_config = ConfigDict(strict=True, extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: Any
    name: Optional[str] = None

    @field_validator("content")
    @classmethod
    def _check_content(cls, value: Any) -> Union[str, list[TextPart]]:
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
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)

    def for_template(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        return out


class ChatCompletionRequest(_Request):
    """POST /v1/chat/completions."""

    unsupported: ClassVar[dict[str, tuple[Any, ...]]] = _UNSUPPORTED_CHAT

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, gt=0)

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
    for param in ("stream_options", "max_completion_tokens"):
        if f"'{param}'" in message:
            return bad_request(message, param, "invalid_value")
    return bad_request(message)
