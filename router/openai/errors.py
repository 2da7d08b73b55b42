"""OpenAI-shaped errors and the FastAPI handlers that guarantee every failure uses them.

Clients (the openai SDK, aiperf, guidellm, Locust scripts) parse `{"error": {...}}` bodies
and branch on the HTTP status, so every failure path of the edge, including FastAPI's own
404/405/422 and unexpected exceptions, must produce that shape and never a stack trace.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping, Optional, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"


class OpenAIError(Exception):
    """An error that is reported to the client as an OpenAI error body.

    Raised anywhere in the edge (or by a backend) and turned into a response by the
    registered handler, or into an SSE error event in the middle of a stream.
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: Optional[str] = None,
        code: Optional[str] = None,
        headers: Optional[Mapping[str, str]] = None,
        details: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.details = dict(details) if details is not None else None

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        if self.details is not None:
            error["details"] = self.details
        return {"error": error}

    def response(self, request_id: Optional[str] = None) -> JSONResponse:
        headers = dict(self.headers)
        if request_id:
            headers[REQUEST_ID_HEADER] = request_id
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> OpenAIError:
    return OpenAIError(400, message, "invalid_request_error", param, code)


def not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        "invalid_request_error",
        "model",
        "model_not_found",
    )


def context_length_exceeded(
    max_model_len: int, prompt_tokens: int, max_tokens: int, param: str = "messages"
) -> OpenAIError:
    """400 that tells the client every number it needs to shorten its request."""
    noun = "messages" if param == "messages" else "prompt"
    return OpenAIError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, you "
        f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {noun}, "
        f"{max_tokens} in the completion). Please reduce the length of the {noun} or "
        f"completion.",
        "invalid_request_error",
        param,
        "context_length_exceeded",
    )


def service_unavailable(
    message: str = "The service is temporarily unavailable; please retry.",
    retry_after_s: Optional[int] = None,
    details: Optional[Mapping[str, Any]] = None,
) -> OpenAIError:
    headers = {"Retry-After": str(int(retry_after_s))} if retry_after_s is not None else None
    return OpenAIError(503, message, "service_unavailable", None, "service_unavailable", headers, details)


def too_many_requests(message: str, retry_after_s: int = 1) -> OpenAIError:
    """429 with Retry-After, so well-behaved clients (the openai SDK) back off and retry."""
    return OpenAIError(
        429,
        message,
        "rate_limit_error",
        None,
        "rate_limit_exceeded",
        {"Retry-After": str(max(0, int(retry_after_s)))},
    )


def payload_too_large(limit_bytes: int) -> OpenAIError:
    return OpenAIError(
        413,
        f"Request body is too large; the limit is {limit_bytes} bytes.",
        "invalid_request_error",
        None,
        "payload_too_large",
    )


def internal_error(request_id: Optional[str]) -> OpenAIError:
    """Generic 500: details stay in the server log, the client gets an id to quote."""
    suffix = f" (request id {request_id})" if request_id else ""
    return OpenAIError(
        500,
        f"The server had an error while processing your request{suffix}. Please retry.",
        "internal_error",
        None,
        "internal_error",
    )


def _param_path(loc: Iterable[Any]) -> str:
    """('messages', 0, 'content') -> 'messages[0].content' (OpenAI's own notation)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def from_validation_errors(errors: Sequence[Mapping[str, Any]]) -> OpenAIError:
    """Turn pydantic's error list into one 400 naming the first offending field.

    The first error is enough for a human; naming the field in `param` is what matters.
    """
    if not errors:
        return bad_request("Invalid request.")
    err = errors[0]
    loc = list(err.get("loc", ()))
    if loc and loc[0] == "body":  # FastAPI prefixes body fields with "body"
        loc = loc[1:]
    kind = err.get("type", "")
    param = _param_path(loc) or None
    if kind == "json_invalid":
        return malformed_json()
    if kind == "missing":
        return bad_request(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    if kind == "extra_forbidden":
        return bad_request(f"Unrecognized request argument supplied: {param}", param, "unknown_parameter")
    if kind == "value_error":
        cause = (err.get("ctx") or {}).get("error")
        text = str(cause) if cause is not None else str(err.get("msg", "invalid value"))
        return bad_request(f"Invalid value for '{param}': {text}", param, "invalid_value")
    msg = str(err.get("msg", "invalid value"))
    if kind.endswith("_type") and "input" in err:
        msg += f", got {_json_type(err['input'])}"
    if param is None:
        return bad_request(f"Invalid request body: {msg}.")
    return bad_request(f"Invalid value for '{param}': {msg}.", param, "invalid_value")


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value, for messages like "expected an integer, got a string"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def malformed_json(detail: str = "") -> OpenAIError:
    extra = f" ({detail})" if detail else ""
    return bad_request(
        "We could not parse the JSON body of your request. The body must be a valid JSON "
        f"object encoded as UTF-8{extra}."
    )


def request_id_of(request: Request) -> Optional[str]:
    """The edge request id the middleware stored on the request, if any."""
    return getattr(request.state, "request_id", None)


def install_exception_handlers(app: FastAPI) -> None:
    """Route every failure FastAPI/Starlette can produce into the OpenAI error shape."""

    async def on_openai_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, OpenAIError)
        return exc.response(request_id_of(request))

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return from_validation_errors(exc.errors()).response(request_id_of(request))  # 400, never 422

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        status = exc.status_code
        if status == 404:
            message = f"Unknown request URL: {request.method} {request.url.path}."
            code: Optional[str] = "unknown_url"
        elif status == 405:
            message = f"Method {request.method} is not allowed for {request.url.path}."
            code = "method_not_allowed"
        else:
            message = str(exc.detail)
            code = None
        kind = "invalid_request_error" if status < 500 else "internal_error"
        err = OpenAIError(status, message, kind, None, code, headers=exc.headers)
        return err.response(request_id_of(request))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        request_id = request_id_of(request)
        logger.error("unhandled error in request %s", request_id, exc_info=exc)
        return internal_error(request_id).response(request_id)

    app.add_exception_handler(OpenAIError, on_openai_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
