"""The edge's OpenAPI document (/openapi.json): the real request bodies and the error shape.

The routes read their bodies themselves (size limit, strict UTF-8, our own error order), so
FastAPI cannot see what they accept; this module writes it into the document from the same
pydantic models that validate the requests. Clients and schema-based fuzzers
(tests/integration/test_fuzz.py) rely on it describing exactly what the edge accepts.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from router.openai.protocol import ChatCompletionRequest, CompletionRequest

_REF = "#/components/schemas/{model}"

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string", "minLength": 1},
                "type": {"type": "string", "minLength": 1},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
                "details": {"type": "object"},
            },
        }
    },
}

_ERROR_RESPONSE = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
_ERRORS = {
    "400": {"description": "Invalid request (OpenAI error body naming `param`)", **_ERROR_RESPONSE},
    "401": {"description": "Missing or wrong API key", **_ERROR_RESPONSE},
    "403": {"description": "Tier not allowed for this key", **_ERROR_RESPONSE},
    "404": {"description": "Unknown model", **_ERROR_RESPONSE},
    "413": {"description": "Body over gateway.max_body_bytes", **_ERROR_RESPONSE},
    "429": {"description": "Rate limit or admission queue full; see Retry-After", **_ERROR_RESPONSE},
    "503": {"description": "Not ready or aborted; retry", **_ERROR_RESPONSE},
}


def body_of(model: type) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body is `model`."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}},
        }
    }


def generation_responses() -> dict[Any, Any]:
    ok = {
        "description": "The completion; an SSE stream of chunks when `stream` is true",
        # SSE: `data: {chunk}` events, the last one `data: [DONE]`.
        "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}},
    }
    return {200: ok, **_ERRORS}


def read_responses() -> dict[Any, Any]:
    return {200: {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
            **{k: v for k, v in _ERRORS.items() if k in ("401", "404")}}


def health_responses() -> dict[Any, Any]:
    return {"503": _ERRORS["503"]}


def install_openapi(app: FastAPI) -> None:
    """Replace FastAPI's generator with one that adds the request models and ErrorResponse."""
    cache: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if not cache:
            doc = get_openapi(title=app.title, version="1", routes=app.routes)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in (ChatCompletionRequest, CompletionRequest):
                schema = model.model_json_schema(ref_template=_REF)
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
            schemas["ErrorResponse"] = ERROR_SCHEMA
            # FastAPI's 422 never reaches a client: validation errors are 400s in OpenAI's shape.
            for operations in doc.get("paths", {}).values():
                for operation in operations.values():
                    if operation.get("responses", {}).pop("422", None) is not None:
                        operation["responses"].setdefault("400", _ERRORS["400"])
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            cache.update(doc)
        return cache

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override
