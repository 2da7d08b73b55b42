"""Per-tenant rate limits at the edge: requests and tokens per minute, as token buckets.

Each tenant (auth.tenants.<name>.rate_limit) gets one bucket per limit it sets; all keys of a
tenant share them (give a key its own tenant for a limit of its own). A bucket holds one
minute's allowance and refills continuously, so a tenant may burst up to its per-minute limit
and then gets its limit's rate. A request costs 1 request and `prompt tokens + max_tokens`
tokens (the most it can use, as OpenAI counts), taken from both buckets together or not at
all. Over a limit: 429 in OpenAI's shape (type "requests" or "tokens", code
"rate_limit_exceeded") with Retry-After, the seconds until the request would fit.

Here the buckets live in the gateway replica's memory: with N gateway replicas a tenant gets
up to N times its limits (Serve spreads requests across replicas). With
auth.rate_limit_store redis, router/ratelimit_shared.py keeps the same buckets in Redis for
all replicas and falls back to these while Redis is unreachable. Requests without keys (an
open API) are not limited; admission control (router/admission.py) still bounds the load.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Optional

if TYPE_CHECKING:  # the edge's hook type (router/openai/engine_client.py imports vLLM)
    from router.openai.engine_client import RateLimit as EdgeHook

from router.openai.errors import OpenAIError

Clock = Callable[[], float]


@dataclass(frozen=True)
class RateLimit:
    requests_per_minute: Optional[int] = None
    tokens_per_minute: Optional[int] = None


def tenant_limits(cfg) -> dict[str, RateLimit]:
    """auth.tenants.<name>.rate_limit of a ClusterConfig."""
    return {name: RateLimit(t.rate_limit.requests_per_minute, t.rate_limit.tokens_per_minute)
            for name, t in cfg.auth.tenants.items()}


class TokenBucket:
    """`capacity` units, refilled at `capacity` per `period_s`. Not thread-safe: one event loop."""

    def __init__(self, capacity: int, period_s: float = 60.0, clock: Clock = time.monotonic):
        if capacity < 1 or period_s <= 0:
            raise ValueError(f"a token bucket needs capacity >= 1 and period_s > 0 (got {capacity}, {period_s})")
        self.capacity = capacity
        self.rate = capacity / period_s
        self._clock = clock
        self._level = float(capacity)
        self._at = clock()

    def level(self) -> float:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
        self._at = now
        return self._level

    def wait_s(self, amount: int) -> float:
        """Seconds until `amount` is available (0: now); inf when it never fits."""
        if amount > self.capacity:
            return math.inf
        return max(0.0, (amount - self.level()) / self.rate)

    def take(self, amount: int) -> None:
        self._level = self.level() - amount


def rate_limited(tenant: str, kind: str, limit: int, cost: int, wait_s: float) -> OpenAIError:
    """429 as OpenAI sends it (type "requests" or "tokens", code rate_limit_exceeded), with
    Retry-After; `wait_s` inf: the request can never fit the limit."""
    per_min = "requests per min (RPM)" if kind == "requests" else "tokens per min (TPM)"
    if math.isinf(wait_s):
        message = (f"Request too large for tenant {tenant!r} on {per_min}: Limit {limit}, Requested {cost} "
                   "(prompt tokens + max_tokens). Reduce the prompt or max_tokens.")
    else:
        message = (f"Rate limit reached for tenant {tenant!r} on {per_min}: Limit {limit}, Requested {cost}. "
                   f"Please try again in {wait_s:.1f}s.")
    retry = max(1, math.ceil(wait_s)) if math.isfinite(wait_s) else 60
    headers = {"Retry-After": str(retry), f"x-ratelimit-limit-{kind}": str(limit)}
    return OpenAIError(429, message, kind, None, "rate_limit_exceeded", headers)



class TenantLimiter:
    """The buckets of one tenant."""

    def __init__(self, tenant: str, limit: RateLimit, clock: Clock = time.monotonic):
        self.tenant = tenant
        self.buckets: dict[str, TokenBucket] = {}
        if limit.requests_per_minute is not None:
            self.buckets["requests"] = TokenBucket(limit.requests_per_minute, clock=clock)
        if limit.tokens_per_minute is not None:
            self.buckets["tokens"] = TokenBucket(limit.tokens_per_minute, clock=clock)

    def admit(self, tokens: int) -> None:
        """Take 1 request and `tokens` tokens, or raise 429 and take nothing."""
        cost = {"requests": 1, "tokens": tokens}
        waits = {kind: bucket.wait_s(cost[kind]) for kind, bucket in self.buckets.items()}
        kind, wait = max(waits.items(), key=lambda kv: kv[1], default=("", 0.0))
        if wait > 0:
            raise rate_limited(self.tenant, kind, self.buckets[kind].capacity, cost[kind], wait)
        for kind, bucket in self.buckets.items():
            bucket.take(cost[kind])


class RateLimiter:
    """The edge's rate-limit hook: `check(tenant, tokens)`; tenants without limits pass."""

    def __init__(self, limits: Mapping[str, RateLimit], clock: Clock = time.monotonic):
        self._tenants = {
            tenant: TenantLimiter(tenant, limit, clock)
            for tenant, limit in limits.items()
            if limit.requests_per_minute is not None or limit.tokens_per_minute is not None
        }

    @classmethod
    def from_config(cls, cfg, clock: Clock = time.monotonic) -> "RateLimiter":
        """From a ClusterConfig: auth.tenants.<name>.rate_limit."""
        return cls(tenant_limits(cfg), clock)

    @property
    def active(self) -> bool:
        return bool(self._tenants)

    def check(self, tenant: Optional[str], tokens: int) -> None:
        limiter = self._tenants.get(tenant) if tenant is not None else None
        if limiter is not None:
            limiter.admit(tokens)

    def hook(self) -> EdgeHook:
        """The edge's `rate_limit` hook: (the tenant the edge authenticated, tokens)."""
        async def rate_limit(tenant: Optional[str], tokens: int) -> None:
            self.check(tenant, tokens)
        return rate_limit
