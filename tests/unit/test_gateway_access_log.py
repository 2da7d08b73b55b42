"""The direct gateway's access log (router/openai/server.py AccessLog): one line per request in
Serve's logger, with the status and the request id the client sent (or the edge made up), and
nothing from the request's headers or body."""

from __future__ import annotations

import logging

import pytest
from starlette.testclient import TestClient

from router.openai.server import AccessLog
from tests.support.fakes import FakeBackend
from tests.support.openai_helpers import MODEL, edge_app


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def lines():
    logger = logging.getLogger("ray.serve")
    handler, level = _Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)  # as the cluster sets Serve's logger: the access lines still come
    yield handler.records
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_every_request_leaves_one_line_with_its_status_and_the_clients_request_id(lines) -> None:
    client = TestClient(AccessLog(edge_app(FakeBackend())), raise_server_exceptions=False)
    secret = "sk-do-not-log-me"
    headers = {"X-Request-Id": "probe-123", "Authorization": f"Bearer {secret}"}
    assert client.post("/v1/completions", headers=headers,
                       json={"model": MODEL, "prompt": "hi there", "max_tokens": 2}).status_code == 200
    assert client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": -1}).status_code == 400
    assert client.get("/v1/models/nope").status_code == 404

    assert [r.getMessage().split()[:3] for r in lines] == [
        ["POST", "/v1/completions", "200"], ["POST", "/v1/completions", "400"], ["GET", "/v1/models/nope", "404"]]
    assert lines[0].request_id == "probe-123" and "request_id=probe-123" in lines[0].getMessage()
    assert lines[1].request_id.startswith("req-") and lines[1].request_id != lines[2].request_id
    assert all(r.serve_access_log and r.log_to_stderr is False for r in lines)
    assert not any(secret in r.getMessage() or secret in str(vars(r)) for r in lines)
