"""Helpers shared by the OpenAI edge tests: the real edge (vLLM's app over tandem's engine
client and middleware) on the tiny test model, over a fake backend; SSE parsing; error-shape
assertions."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any, Callable, Mapping, Optional

import httpx
from fastapi.testclient import TestClient

from tests.conftest import TEST_STATE
from router.openai.context import Caller
from tests.support.fakes import FakeBackend

MODEL = "tiny-llama"
TIER = "interactive"
MAX_MODEL_LEN = 256


@functools.lru_cache(maxsize=1)
def vllm_setup() -> tuple[Any, Any]:
    """`vllm serve`'s arguments and VllmConfig for the tiny model (built once per process)."""
    from cluster.models import make_tiny_llama
    from router.openai.app import vllm_config_of, vllm_server_args

    model = make_tiny_llama(TEST_STATE / "models" / "tiny-llama")
    args = vllm_server_args(model_path=model, served_name=MODEL, dtype="float32", max_model_len=MAX_MODEL_LEN,
                            tool_parser="hermes")
    return args, vllm_config_of(args)


class _BuiltOnFirstCall:
    """vLLM's app state is built by a coroutine: build it on the test client's own loop."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._app: Any = None
        self._building: Any = None

    async def built(self) -> Any:
        if self._app is None:
            if self._building is None:  # concurrent first calls wait for one build
                self._building = asyncio.ensure_future(self._build())
            self._app = await self._building
        return self._app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await (await self.built())(scope, receive, send)


def edge_app(backend: Optional[FakeBackend] = None, *,
             authenticate: Optional[Callable[[Mapping[str, str]], Caller]] = None, rate_limit: Any = None,
             **edge_kwargs: Any) -> Any:
    """The edge as an ASGI app over `backend`, built on its first call; `edge_kwargs` go to
    build_openai_app (max_body_bytes, body_read_timeout_s, health_interval_s,
    allowed_hosts)."""
    from router.openai.app import build_openai_app
    from router.openai.engine_client import PDEngineClient

    backend = backend or FakeBackend()
    args, config = vllm_setup()
    client = PDEngineClient(config, backend, TIER, rate_limit=rate_limit)
    edge_kwargs.setdefault("health_interval_s", 0.0)
    return _BuiltOnFirstCall(lambda: build_openai_app(
        client, args, authenticate=authenticate or (lambda headers: Caller(TIER)), health_probe=backend.health,
        **edge_kwargs))


def make_client(backend: Optional[FakeBackend] = None, *, authenticate: Optional[Callable[[Mapping[str, str]], Caller]] = None,
                rate_limit: Any = None, **edge_kwargs: Any) -> tuple[TestClient, FakeBackend]:
    """A test client of `edge_app(backend, ...)` and the backend."""
    backend = backend or FakeBackend()
    app = edge_app(backend, authenticate=authenticate, rate_limit=rate_limit, **edge_kwargs)
    # raise_server_exceptions=False: we want to see the 500 the client would see.
    return TestClient(app, raise_server_exceptions=False), backend


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
    code: Optional[Any] = None,
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
