"""Rate limits shared by gateway replicas through a real redis-server (router/ratelimit_shared.py):
two limiters (two replicas) on one Redis allow a tenant its limits once, not twice; both buckets
are taken together or not at all; Redis down costs sharing, not requests; and the edge answers
429 with Retry-After from the shared buckets."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.asyncio
from fastapi.testclient import TestClient

from cluster.config import ClusterConfig
from router.auth import ApiKeyAuth
from router.openai.errors import OpenAIError
from router.ratelimit import RateLimit, RateLimiter
from router.ratelimit_shared import SharedRateLimiter, rate_limiter_from_config
from tests.support.fakes import FakeBackend
from tests.support.openai_helpers import MODEL, assert_openai_error, edge_app
from tests.support.redis_server import RedisServer

LIMITS = {"acme": RateLimit(requests_per_minute=3, tokens_per_minute=100), "free": RateLimit()}


def replica(server: RedisServer, prefix: str = "test:") -> SharedRateLimiter:
    client = redis.asyncio.Redis.from_url(server.url, socket_timeout=0.25, socket_connect_timeout=0.25)
    return SharedRateLimiter(LIMITS, client, where=f"127.0.0.1:{server.port}", key_prefix=prefix)


async def refused(limiter: SharedRateLimiter, tenant: str, tokens: int) -> OpenAIError | None:
    try:
        await limiter.check(tenant, tokens)
    except OpenAIError as exc:
        return exc
    return None


def test_two_replicas_share_one_allowance(redis_server):
    async def main():
        a, b = replica(redis_server), replica(redis_server)
        assert [await refused(x, "acme", 10) for x in (a, b, a)] == [None, None, None]
        for limiter in (a, b):  # the 4th request is over 3 per minute, whichever replica gets it
            exc = await refused(limiter, "acme", 10)
            assert exc.status == 429 and exc.type == "requests" and exc.code == "rate_limit_exceeded"
            assert 1 <= int(exc.headers["Retry-After"]) <= 20  # one request refills in 20 s
            assert exc.headers["x-ratelimit-limit-requests"] == "3" and "'acme'" in exc.message
        for _ in range(10):  # no limits: never refused, nothing kept
            assert await refused(a, "free", 10**9) is None
            assert await refused(b, None, 10**9) is None
        keys = sorted(k.decode() for k in redis_server.client().keys("*"))
        assert keys == ["test:rl:acme:requests", "test:rl:acme:tokens"]
        await a.close()
        await b.close()

    asyncio.run(main())


def test_both_buckets_or_neither_and_too_large_says_so(redis_server):
    async def main():
        limiter = replica(redis_server)
        assert await refused(limiter, "acme", 90) is None
        exc = await refused(limiter, "acme", 20)  # 10 tokens left: refused on tokens...
        assert exc.type == "tokens" and exc.headers["x-ratelimit-limit-tokens"] == "100"
        assert await refused(limiter, "acme", 5) is None  # ...and took no request: 2 of 3 used
        exc = await refused(limiter, "acme", 101)  # never fits: no retry can help
        assert exc.type == "tokens" and "Request too large" in exc.message and exc.headers["Retry-After"] == "60"
        level = float(redis_server.client().hget("test:rl:acme:requests", "level"))
        assert 1 <= level < 1.1  # 3 - 2 taken, plus the refill of a few milliseconds
        await limiter.close()

    asyncio.run(main())


def test_redis_down_falls_back_to_the_replicas_own_buckets_and_recovers(redis_server, caplog):
    async def main():
        limiter = replica(redis_server)
        assert await refused(limiter, "acme", 1) is None
        redis_server.stop()
        with caplog.at_level(logging.WARNING, logger="router.ratelimit_shared"):
            results = [await refused(limiter, "acme", 1) for _ in range(4)]
        # Its own full buckets: 3 more pass, the 4th is refused; no request failed otherwise.
        assert results[:3] == [None, None, None] and results[3].status == 429
        warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(warnings) == 1  # once per outage, not per request
        redis_server.start()  # a fresh, empty Redis: shared buckets start full again
        assert await refused(limiter, "acme", 1) is None
        assert redis_server.client().exists("test:rl:acme:requests")
        await limiter.close()

    asyncio.run(main())


def test_config_picks_the_store_and_the_edge_answers_429(redis_server, tmp_path):
    key = "sk-acme-0123456789"
    base = {"model": {"path": str(tmp_path)},
            "auth": {"tenants": {"acme": {"tier": "interactive", "rate_limit": {"requests_per_minute": 2}}},
                     "keys": [{"tenant": "acme", "value": key}]}}
    assert isinstance(rate_limiter_from_config(ClusterConfig.model_validate(base)), RateLimiter)
    with pytest.raises(ValueError, match="routing.index.redis_url"):
        ClusterConfig.model_validate({**base, "auth": {**base["auth"], "rate_limit_store": "redis"}})
    cfg = ClusterConfig.model_validate({**base, "auth": {**base["auth"], "rate_limit_store": "redis"},
                                        "routing": {"index": {"redis_url": redis_server.url, "key_prefix": "edge:"}}})
    limiter = rate_limiter_from_config(cfg)
    assert isinstance(limiter, SharedRateLimiter) and limiter.active
    auth = ApiKeyAuth.from_config(cfg)
    app = edge_app(FakeBackend(), authenticate=auth.caller, rate_limit=limiter.hook())
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
    headers = {"Authorization": f"Bearer {key}"}
    with TestClient(app, raise_server_exceptions=False) as client:  # one event loop for the Redis client
        assert [client.post("/v1/completions", json=body, headers=headers).status_code for _ in range(2)] == [200, 200]
        r = client.post("/v1/completions", json=body, headers=headers)
        assert_openai_error(r, 429, code="rate_limit_exceeded", type_="requests", contains="RPM")
        assert int(r.headers["Retry-After"]) >= 1 and key not in r.text
    assert redis_server.client().exists("edge:rl:acme:requests")
