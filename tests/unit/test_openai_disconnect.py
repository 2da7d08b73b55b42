"""A client that goes away must not leave a decode running: the edge calls backend.abort.

TestClient and httpx's ASGITransport buffer whole responses, so they cannot hang up in the
middle; these tests drive the ASGI app directly and disconnect the way real servers
report it: an `http.disconnect` message (ASGI spec 2.3, what uvicorn speaks today) or a
failing `send` (spec 2.4).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Optional

import pytest
from starlette.requests import ClientDisconnect

from tests.support.fakes import FakeBackend
from tests.support.openai_helpers import MODEL, edge_app


class AsgiCall:
    """One HTTP request against an ASGI app, with a scripted disconnect."""

    def __init__(self, path: str, body: dict[str, Any], spec_version: str = "2.3") -> None:
        self.path = path
        self.body = json.dumps(body).encode()
        self.spec_version = spec_version
        self.messages: list[dict[str, Any]] = []
        self.disconnected = asyncio.Event()
        self.hang_up_after_body_parts: Optional[int] = None
        self._request_sent = False

    @property
    def body_parts(self) -> list[bytes]:
        return [m.get("body", b"") for m in self.messages if m["type"] == "http.response.body" and m.get("body")]

    async def receive(self) -> dict[str, Any]:
        if not self._request_sent:
            self._request_sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.disconnected.is_set() and self.spec_version == "2.4":
            raise OSError("connection reset by peer")
        self.messages.append(message)
        if self.hang_up_after_body_parts is not None and len(self.body_parts) >= self.hang_up_after_body_parts:
            self.disconnected.set()

    async def run(self, app: Any) -> None:
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": self.spec_version},
            "http_version": "1.1", "method": "POST", "scheme": "http", "path": self.path,
            "raw_path": self.path.encode(), "root_path": "", "query_string": b"",
            "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(self.body)).encode())],
            "client": ("127.0.0.1", 5000), "server": ("testserver", 80),
        }
        await app.built()  # vLLM's app state is built on the first call: not part of the script
        try:
            await asyncio.wait_for(app(scope, self.receive, self.send), timeout=10)
        except ClientDisconnect:  # spec 2.4: Starlette reports the failed send to the server
            assert self.spec_version == "2.4"


def _hanging_backend() -> FakeBackend:
    backend = FakeBackend()
    backend.hang_after = 2  # two tokens, then the "engine" stalls until cancelled
    return backend


def _hang_up_after_50_ms(call: AsgiCall, backend: FakeBackend) -> None:
    """Run the call on a built edge; the client goes away 50 ms in."""
    async def scenario() -> None:
        app = edge_app(backend)
        await app.built()
        asyncio.get_running_loop().call_later(0.05, call.disconnected.set)
        await call.run(app)

    asyncio.run(scenario())


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"model": MODEL, "prompt": "abcdef", "stream": True}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}),
])
def test_disconnect_mid_stream_aborts_the_request(spec_version: str, path: str, body: dict[str, Any]) -> None:
    backend = _hanging_backend()
    call = AsgiCall(path, body, spec_version)
    # The client reads events and leaves. Spec 2.4 servers report it only on the next send:
    # leave after one, so a send is still to come before the engine stalls.
    call.hang_up_after_body_parts = 2 if spec_version == "2.3" else 1

    async def scenario() -> None:
        await call.run(edge_app(backend))

    asyncio.run(scenario())
    (request,) = backend.requests
    assert backend.aborted == [request.request_id]
    assert backend.closed == [request.request_id]  # the engine stream was finalized too
    assert b"[DONE]" not in b"".join(call.body_parts)


def test_disconnect_while_waiting_for_a_non_streamed_answer_aborts() -> None:
    backend = _hanging_backend()
    call = AsgiCall("/v1/completions", {"model": MODEL, "prompt": "abcdef"})

    _hang_up_after_50_ms(call, backend)
    (request,) = backend.requests
    assert backend.aborted == [request.request_id]
    assert backend.closed == [request.request_id]
    # What vLLM's server writes to a socket nobody reads any more is vLLM's; the engine is free.


def test_disconnect_before_the_first_token_aborts() -> None:
    backend = FakeBackend()
    backend.hang_after = 0
    call = AsgiCall("/v1/completions", {"model": MODEL, "prompt": "abc", "stream": True})

    _hang_up_after_50_ms(call, backend)
    assert backend.aborted == [backend.requests[0].request_id]
    assert call.body_parts == []


@pytest.mark.parametrize("stream", [False, True])
def test_finished_requests_are_not_aborted(stream: bool) -> None:
    backend = FakeBackend()
    call = AsgiCall("/v1/completions", {"model": MODEL, "prompt": "abc", "stream": stream})
    asyncio.run(call.run(edge_app(backend)))
    assert backend.aborted == []
    assert backend.closed == [backend.requests[0].request_id]
    body = b"".join(call.body_parts)
    if stream:
        assert body.endswith(b"data: [DONE]\n\n")
    else:
        assert json.loads(body)["choices"][0]["finish_reason"] in ("stop", "length")
