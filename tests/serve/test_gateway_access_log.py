"""The gateway's access log reaches its replica's Serve log file, in a real Serve replica: the
line an operator greps by the X-Request-Id a client was given (router/openai/server.py
AccessLog). In process, tests/unit/test_gateway_access_log.py checks the line itself; here, that
nothing in a replica (Serve's set-up, vLLM's imports) keeps it from the file."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx

from tests.support.serve_graph import MODEL_NAME


def _serve_logs() -> Path:
    import ray

    node = ray._private.worker.global_worker.node  # no public API names the session folder
    return Path(node.get_session_dir_path()) / "logs" / "serve"


def test_a_requests_id_reaches_the_gateway_replicas_log_file(graph):
    marker = f"access-probe-{uuid.uuid4().hex[:12]}"
    answer = httpx.post(f"{graph.url}/v1/completions", headers={"X-Request-Id": marker}, timeout=60,
                        json={"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2})
    assert answer.status_code == 200, answer.text
    deadline = time.monotonic() + 20  # a replica's records reach its file through a buffer
    lines: list[str] = []
    while not lines and time.monotonic() < deadline:
        time.sleep(0.5)
        lines = [line for path in _serve_logs().glob("replica_*Gateway*.log")
                 for line in path.read_text(errors="replace").splitlines() if marker in line]
    assert lines, f"no line with {marker} in {sorted(p.name for p in _serve_logs().iterdir())}"
    assert "POST /v1/completions 200" in lines[0], lines
