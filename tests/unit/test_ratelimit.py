"""Per-tenant rate limits (router/ratelimit.py): the token bucket with an injected clock, the
tenant limiter's all-or-nothing take, and the edge: 429 in OpenAI's shape with Retry-After."""

from __future__ import annotations

import math

import pytest

from cluster.config import ClusterConfig
from router.auth import ApiKeyAuth
from router.openai.errors import OpenAIError
from router.ratelimit import RateLimit, RateLimiter, TenantLimiter, TokenBucket
from tests.support.fakes import FakeBackend
from tests.support.openai_helpers import MODEL, assert_openai_error, make_client


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bucket_bursts_to_capacity_then_refills_at_its_rate():
    clock = Clock()
    bucket = TokenBucket(60, period_s=60, clock=clock)  # 1 per second
    for _ in range(60):
        assert bucket.wait_s(1) == 0
        bucket.take(1)
    assert bucket.wait_s(1) == pytest.approx(1.0)
    assert bucket.wait_s(5) == pytest.approx(5.0)
    clock.now += 2.5
    assert bucket.wait_s(2) == 0
    assert bucket.wait_s(3) == pytest.approx(0.5)
    clock.now += 1000  # never above capacity, however long it idles
    assert bucket.level() == 60
    assert bucket.wait_s(61) == math.inf


def test_bucket_rejects_nonsense_sizes():
    with pytest.raises(ValueError, match="capacity"):
        TokenBucket(0)


def test_tenant_limiter_takes_from_both_buckets_or_neither():
    clock = Clock()
    limiter = TenantLimiter("acme", RateLimit(requests_per_minute=10, tokens_per_minute=100), clock)
    limiter.admit(90)
    with pytest.raises(OpenAIError) as exc:
        limiter.admit(20)  # tokens: 10 left, 20 asked
    err = exc.value
    assert err.status == 429 and err.type == "tokens" and err.code == "rate_limit_exceeded"
    assert err.headers["Retry-After"] == "6"  # 10 missing at 100/60 per second = 6 s
    assert "TPM" in err.message and "Limit 100" in err.message and "Requested 20" in err.message
    assert limiter.buckets["requests"].level() == 9  # the refused request took no request either
    limiter.admit(10)
    clock.now += 6
    limiter.admit(10)


def test_requests_per_minute_and_too_large_requests():
    clock = Clock()
    limiter = TenantLimiter("acme", RateLimit(requests_per_minute=2, tokens_per_minute=50), clock)
    limiter.admit(1)
    limiter.admit(1)
    with pytest.raises(OpenAIError) as exc:
        limiter.admit(1)
    assert exc.value.type == "requests" and exc.value.headers["Retry-After"] == "30"
    assert exc.value.headers["x-ratelimit-limit-requests"] == "2"
    clock.now += 60
    with pytest.raises(OpenAIError) as exc:
        limiter.admit(51)  # can never fit: say so instead of a retry that cannot help
    assert exc.value.status == 429 and "Request too large" in exc.value.message


def test_limiter_ignores_tenants_without_limits_and_open_requests():
    limiter = RateLimiter({"free": RateLimit(), "paid": RateLimit(requests_per_minute=1)}, Clock())
    assert limiter.active
    for _ in range(5):
        limiter.check("free", 10**9)
        limiter.check(None, 10**9)
    limiter.check("paid", 1)
    with pytest.raises(OpenAIError):
        limiter.check("paid", 1)
    assert not RateLimiter({"free": RateLimit()}).active


KEY_A, KEY_B = "sk-tenant-a-0123456789", "sk-tenant-b-0123456789"


def config(tmp_path, rate_limit):
    return ClusterConfig.model_validate({
        "model": {"path": str(tmp_path)},
        "auth": {
            "tenants": {"a": {"tier": "interactive", "rate_limit": rate_limit}, "b": {"tier": "interactive"}},
            "keys": [{"tenant": "a", "value": KEY_A}, {"tenant": "b", "value": KEY_B}],
        },
    })


def test_config_validates_limits(tmp_path):
    with pytest.raises(ValueError, match="requests_per_minute"):
        config(tmp_path, {"requests_per_minute": 0})
    with pytest.raises(ValueError, match="tokens_per_minute"):
        config(tmp_path, {"tokens_per_minute": "lots"})


def test_edge_answers_429_with_retry_after_per_tenant(tmp_path):
    clock = Clock()
    cfg = config(tmp_path, {"requests_per_minute": 2, "tokens_per_minute": 40})
    auth = ApiKeyAuth.from_config(cfg)
    limits = RateLimiter.from_config(cfg, clock)
    backend = FakeBackend()
    client = make_client(backend, authenticate=auth.caller, rate_limit=limits.hook())[0]
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 3}  # FakeTokenizer: 5 + 3 = 8 tokens
    a, b = {"Authorization": f"Bearer {KEY_A}"}, {"Authorization": f"Bearer {KEY_B}"}
    assert client.post("/v1/completions", json=body, headers=a).status_code == 200
    assert client.post("/v1/completions", json=body, headers=a).status_code == 200
    r = client.post("/v1/completions", json=body, headers=a)
    error = assert_openai_error(r, 429, code="rate_limit_exceeded", type_="requests", contains="RPM")
    assert int(r.headers["Retry-After"]) == 30 and "X-Request-Id" in r.headers
    assert KEY_A not in r.text and "'a'" in error["message"]
    for _ in range(5):  # tenant b has no limits, and a's are a's alone
        assert client.post("/v1/completions", json=body, headers=b).status_code == 200
    clock.now += 60
    big = {**body, "max_tokens": 40}
    assert_openai_error(client.post("/v1/completions", json=big, headers=a), 429, type_="tokens",
                        contains="Request too large")
    assert len(backend.requests) == 7  # refused requests reached no engine
    # Invalid requests are 400 before the limiter: they cost no tokens.
    assert_openai_error(client.post("/v1/completions", json={**body, "max_tokens": 0}, headers=a), 400)
