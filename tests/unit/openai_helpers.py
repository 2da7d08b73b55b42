"""Helpers shared by the OpenAI edge tests: clients, SSE parsing, error-shape assertions."""

from __future__ import annotations

import json
from typing import Any, Optional

import httpx
from fastapi.testclient import TestClient

from router.openai.app import build_openai_app
from tests.fakes import FakeBackend

MODEL = "tandem-test"


def make_client(backend: Optional[FakeBackend] = None, **app_kwargs: Any) -> tuple[TestClient, FakeBackend]:
    backend = backend or FakeBackend(model_id=MODEL)
    # raise_server_exceptions=False: we want to see the 500 the client would see.
    return TestClient(build_openai_app(backend, **app_kwargs), raise_server_exceptions=False), backend


def sse_events(response: httpx.Response) -> list[Any]:
    """Every `data:` payload of an SSE body, JSON-decoded except the literal [DONE]."""
    text = response.text
    assert text.endswith("\n\n"), text[-200:]
    events: list[Any] = []
    for block in text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def assert_openai_error(
    response: httpx.Response,
    status: int,
    param: Optional[str] = None,
    code: Optional[str] = None,
    type_: Optional[str] = None,
    contains: Optional[str] = None,
) -> dict[str, Any]:
    """The OpenAI error contract: status, JSON shape, no stack trace; returns `error`."""
    assert response.status_code == status, (response.status_code, response.text)
    assert "Traceback" not in response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) >= {"error"}, body
    error = body["error"]
    assert {"message", "type", "param", "code"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    if type_ is not None:
        assert error["type"] == type_, error
    if contains is not None:
        assert contains in error["message"], error
    return error
