"""OpenAI-shaped errors that tandem's own code raises: admission's 429, the edge's guards (body
size, malformed JSON, no healthy pool), the P/D path's refusals.

Clients (the openai SDK, aiperf, guidellm, Locust scripts) parse `{"error": {...}}` bodies and
branch on the HTTP status. Everything else about errors (validation, unknown routes, the
context length, unexpected exceptions) is vLLM's own server's (router/openai/app.py builds the
edge on it), so those answers are vLLM's, word for word.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from fastapi import Request
from fastapi.responses import JSONResponse

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


def malformed_json(detail: str = "") -> OpenAIError:
    extra = f" ({detail})" if detail else ""
    return bad_request(
        "We could not parse the JSON body of your request. The body must be a valid JSON "
        f"object encoded as UTF-8{extra}."
    )


def request_id_of(request: Request) -> Optional[str]:
    """The edge request id the middleware stored on the request, if any."""
    return getattr(request.state, "request_id", None)
