"""No secret in any log line of a real run: requests carrying credentials (a bearer key, an
Azure-style api-key header, a cookie) go through the real cluster (gateway, engines) on good
and bad paths, then every file of the Ray session's logs is searched for the key material. A
marker request id in the same requests must show up in those logs, so the search provably read
the logs this run wrote (the gateway's access log names the client's X-Request-Id).

The shared integration cluster has an open API (no keys configured: other tests send none),
so the gateway ignores the key here; tests/unit/test_secrets_not_logged.py covers a gateway
with keys, rate limits and a Redis password configured, in process."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx

from tests.support.integration_cluster import MODEL_NAME


def _session_logs() -> Path:
    """The logs folder of the Ray session the test cluster runs in (this driver is connected)."""
    import ray

    node = ray._private.worker.global_worker.node  # no public API names the session folder
    return Path(node.get_session_dir_path()) / "logs"


def _files_containing(logs: Path, needles: list[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {n: [] for n in needles}
    encoded = [(n, n.encode()) for n in needles]
    for path in logs.rglob("*"):
        if not path.is_file():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        for needle, raw in encoded:
            if raw in data:
                found[needle].append(str(path))
    return found


def test_credentials_never_reach_the_logs(base_url):
    secret = f"sk-secret-{uuid.uuid4().hex}"
    cookie_secret = f"session-{uuid.uuid4().hex}"
    marker = f"log-probe-{uuid.uuid4().hex[:12]}"
    headers = {"Authorization": f"Bearer {secret}", "api-key": secret, "Cookie": f"session={cookie_secret}",
               "X-Request-Id": marker}
    ok_body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2}
    with httpx.Client(base_url=base_url, headers=headers, timeout=120) as client:
        assert client.post("/v1/completions", json=ok_body).status_code == 200
        with client.stream("POST", "/v1/chat/completions", json={
            "model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True,
        }) as stream:
            assert stream.status_code == 200
            assert "[DONE]" in "".join(stream.iter_text())
        assert client.post("/v1/completions", json={**ok_body, "max_tokens": -1}).status_code == 400
        assert client.post("/v1/completions", content=b"{not json").status_code == 400
        assert client.post("/v1/completions", json={**ok_body, "model": "gpt-x"}).status_code == 404
        assert client.get("/v1/models/nope").status_code == 404
        assert client.get("/v1/models").status_code == 200

    logs = _session_logs()
    deadline = time.monotonic() + 30  # replica logs reach the files asynchronously
    while True:
        found = _files_containing(logs, [marker, secret, cookie_secret])
        if found[marker] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert found[marker], (f"the marker request id never reached {logs}: the search would prove nothing "
                           "(is the gateway's access log, router/openai/server.py AccessLog, off?)")
    assert not found[secret], f"API key material logged in {found[secret]}"
    assert not found[cookie_secret], f"cookie logged in {found[cookie_secret]}"
