"""The edge's guards against hostile callers: a body-read deadline (408), /health from a cache
(one probe per interval whatever the call rate) with a liveness path, and the Host allow-list."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Optional

import pytest

from cluster.config import GatewayConfig
from router.openai.health import HealthCache
from cluster.config.services import default_allowed_hosts
from router.openai.hosts import HostAllowList
from tests.support.fakes import FakeBackend
from tests.support.openai_helpers import MODEL, assert_openai_error, edge_app, make_client


async def call(app: Any, path: str, body: Optional[bytes] = None, *, stall_after: Optional[int] = None,
               host: str = "127.0.0.1:8000") -> tuple[int, bytes, float]:
    """One request through the ASGI app; with `stall_after` the client sends that many bytes of
    the body, then nothing more (a slow sender). Returns (status, body, seconds)."""
    method = "GET" if body is None else "POST"
    headers = [(b"host", host.encode())]
    if body is not None:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "headers": headers,
             "client": ("127.0.0.1", 1234), "server": ("127.0.0.1", 8000)}
    sent = False
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            if stall_after is not None:
                return {"type": "http.request", "body": (body or b"")[:stall_after], "more_body": True}
            return {"type": "http.request", "body": body or b"", "more_body": False}
        await done.wait()  # the rest of the body never comes
        return {"type": "http.disconnect"}

    status, out = 0, bytearray()

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            out.extend(message.get("body", b""))
            if not message.get("more_body"):
                done.set()

    started = time.perf_counter()
    await app(scope, receive, send)
    return status, bytes(out), time.perf_counter() - started


def completion(text: str = "hello") -> bytes:
    return json.dumps({"model": MODEL, "prompt": text, "max_tokens": 3}).encode()


def test_a_slow_body_is_a_408_within_the_deadline_while_others_keep_their_latency() -> None:
    app = edge_app(FakeBackend(), body_read_timeout_s=0.5)

    async def main():
        await app.built()
        slow = asyncio.create_task(call(app, "/v1/completions", completion(), stall_after=5))
        await asyncio.sleep(0.05)
        fast = [await call(app, "/v1/completions", completion()) for _ in range(5)]
        return await slow, fast

    (status, body, seconds), fast = asyncio.run(main())
    assert status == 408, body
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout" and error["type"] == "invalid_request_error"
    assert 0.5 <= seconds < 1.5
    assert all(s == 200 for s, _, _ in fast), fast
    assert max(t for _, _, t in fast) < 0.3  # the slow sender holds nothing the others need


def test_a_body_within_the_deadline_is_served() -> None:
    client, _ = make_client(body_read_timeout_s=5)
    r = client.post("/v1/completions", content=completion(), headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


class CountingBackend(FakeBackend):
    def __init__(self, delay_s: float = 0.05) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.probes = 0

    async def health(self) -> dict[str, Any]:
        self.probes += 1
        await asyncio.sleep(self.delay_s)  # a probe takes time: concurrent callers share it
        return {"ready": True, "replicas": 1}


def test_concurrent_health_calls_make_at_most_one_probe_per_interval() -> None:
    backend = CountingBackend()
    # 2 s: 400 calls take ~0.3 s here, over 0.5 s on a loaded CI machine (seen: a second probe).
    app = edge_app(backend, health_interval_s=2.0)

    async def main():
        await app.built()  # vLLM's app built before the interval starts
        first = await asyncio.gather(*(call(app, "/health") for _ in range(200)))
        again = await asyncio.gather(*(call(app, "/health") for _ in range(200)))
        probes_in_interval = backend.probes
        await asyncio.sleep(2.1)
        later = await asyncio.gather(*(call(app, "/health") for _ in range(200)))
        return first + again + later, probes_in_interval

    results, probes_in_interval = asyncio.run(main())
    assert all(status == 200 for status, _, _ in results)
    assert json.loads(results[0][1]) == {"status": "ready", "replicas": 1}
    assert probes_in_interval == 1  # 400 calls within the interval: one probe
    assert backend.probes == 2  # the next interval: one more


def test_health_cache_survives_a_failing_probe_and_a_caller_that_leaves() -> None:
    now = [0.0]
    calls = []

    async def probe():
        calls.append(now[0])
        await asyncio.sleep(0.05)
        raise RuntimeError("engine down")

    cache = HealthCache(probe, interval_s=1.0, clock=lambda: now[0])

    async def main():
        leaver = asyncio.create_task(cache.get())
        await asyncio.sleep(0.01)
        leaver.cancel()  # one caller gone: the shared probe still finishes for the others
        answer = await cache.get()
        now[0] = 0.5
        cached = await cache.get()
        return answer, cached

    answer, cached = asyncio.run(main())
    assert answer == cached == {"ready": False, "reason": "health check failed"}
    assert calls == [0.0]


def test_livez_touches_no_engine() -> None:
    backend = CountingBackend()
    client, _ = make_client(backend)
    r = client.get("/livez")
    assert r.status_code == 200 and r.json() == {"status": "alive"}
    assert backend.probes == 0


def test_host_allow_list_refuses_a_rebound_name() -> None:
    allowed = default_allowed_hosts("127.0.0.1")
    client, _ = make_client(allowed_hosts=allowed)
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    for host in ("127.0.0.1:8000", "localhost:8000", "LOCALHOST", "[::1]:8000"):
        assert client.post("/v1/completions", json=body, headers={"host": host}).status_code == 200, host
    for host in ("evil.example:8000", "evil.example", "127.0.0.1.evil.example:8000", ""):
        r = client.post("/v1/completions", json=body, headers={"host": host})
        assert_openai_error(r, 421, code="host_not_allowed")
    # Probes carry no prompt and a kubelet sends the pod IP as Host.
    assert client.get("/livez", headers={"host": "10.1.2.3:8000"}).status_code == 200


def test_host_allow_list_entries_and_defaults() -> None:
    lst = HostAllowList(app=None, allowed=("api.example", "10.0.0.5:443"))  # type: ignore[arg-type]
    assert lst.allows("api.example:8443") and lst.allows("API.example")
    assert lst.allows("10.0.0.5:443") and not lst.allows("10.0.0.5:80")
    assert not lst.allows(None) and not lst.allows("")
    assert HostAllowList(app=None, allowed=("*",)).allows("anything")  # type: ignore[arg-type]
    assert default_allowed_hosts("0.0.0.0") is None  # every interface: names are the deployment's
    assert "gw.internal" in default_allowed_hosts("gw.internal")
    assert GatewayConfig().resolved_allowed_hosts() == default_allowed_hosts("127.0.0.1")
    assert GatewayConfig(allowed_hosts=("*",)).resolved_allowed_hosts() == ("*",)


@pytest.mark.parametrize("path", ["/v1/models", "/openapi.json"])
def test_host_allow_list_covers_every_path_but_probes(path) -> None:
    client, _ = make_client(allowed_hosts=("localhost",))
    assert client.get(path, headers={"host": "localhost:8000"}).status_code == 200
    assert client.get(path, headers={"host": "evil.example"}).status_code == 421


# -- readiness: a request before every pool is ready waits for it (bounded), then 503 ----------

def test_a_request_before_readiness_waits_for_it_and_is_served() -> None:
    backend = FakeBackend()
    backend.ready = False
    app = edge_app(backend, ready_wait_s=10, max_ready_waiters=4)

    async def main():
        edge = await app.built()
        waiting = asyncio.create_task(call(app, "/v1/completions", completion()))
        await asyncio.sleep(0.6)
        waiters_meanwhile = edge.ready_waiters
        health = await call(app, "/health")
        backend.ready = True  # the replacement pool answered
        return await waiting, waiters_meanwhile, health[0], edge.ready_waiters

    (status, body, seconds), waiters_meanwhile, health_status, waiters_after = asyncio.run(main())
    assert status == 200, body
    assert seconds >= 0.6  # it waited rather than got a 503
    assert waiters_meanwhile == 1 and health_status == 503  # /health says not ready meanwhile
    assert waiters_after == 0  # the waiter's place is given back


def test_the_wait_for_readiness_is_bounded_in_time_and_in_number() -> None:
    backend = FakeBackend()
    backend.ready = False
    app = edge_app(backend, ready_wait_s=0.8, max_ready_waiters=1)

    async def main():
        edge = await app.built()
        first = asyncio.create_task(call(app, "/v1/completions", completion()))
        await asyncio.sleep(0.1)
        second = await call(app, "/v1/completions", completion())  # no place left: 503 at once
        return await first, second, edge.ready_waiters

    (status, body, seconds), (full_status, full_body, full_seconds), waiters_after = asyncio.run(main())
    assert status == 503 and 0.8 <= seconds < 3.0, (status, seconds)
    error = json.loads(body)["error"]
    assert error["code"] == "model_loading" and "waited 0.8 s" in error["message"]
    assert full_status == 503 and full_seconds < 0.6  # at once: well under the 0.8 s wait
    assert json.loads(full_body)["error"]["code"] == "model_loading"
    assert waiters_after == 0


def test_the_gateway_config_waits_for_readiness_by_default() -> None:
    gateway = GatewayConfig()
    assert gateway.ready_wait_s >= 60 and gateway.max_ready_waiters > 0  # an engine's load, not a 503
