"""Per-tenant rate limits shared by every gateway replica, in Redis (auth.rate_limit_store redis).

The same token buckets as router/ratelimit.py (one minute's allowance, refilled continuously;
a request takes 1 request and prompt + max_tokens tokens from both buckets, or nothing), but
kept in Redis and updated by one Lua script per request, so N gateway replicas together allow
a tenant its limits, not N times them. The script reads Redis' own clock (TIME), so replicas'
clocks never disagree about a refill.

Redis unreachable (or refusing the credentials): each replica falls back to its own in-memory
buckets (router/ratelimit.RateLimiter) and says so once per outage in the log; a tenant then
gets up to N times its limits for as long as it lasts, never a failed request. The connection
settings (URL, password, user, TLS) are routing.index's: one Redis for the router's shared state.

Call order: `check(tenant, tokens)` once per request, after validation and before any engine
work (through `hook`); it raises the 429 or returns.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Mapping, Optional

if TYPE_CHECKING:  # the edge's hook type (router/openai/engine_client.py imports vLLM)
    from router.openai.engine_client import RateLimit as EdgeHook

import redis
import redis.asyncio

from router.ratelimit import RateLimit, RateLimiter, rate_limited, tenant_limits

log = logging.getLogger(__name__)

# KEYS: the requests bucket, the tokens bucket. ARGV: their capacities (0: no such limit),
# their costs, the refill period in seconds. Returns {0, "0"} when both had room (and takes
# from both), else {1 or 2: the bucket that refused, seconds until the request fits or "inf"}.
# Numbers go back as strings: Redis turns Lua numbers into integers.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local period = tonumber(ARGV[5])
local levels = {}
local refused, longest = 0, 0
for i = 1, 2 do
  local cap = tonumber(ARGV[i])
  if cap > 0 then
    local cost = tonumber(ARGV[i + 2])
    local rate = cap / period
    local saved = redis.call('HMGET', KEYS[i], 'level', 'at')
    local level = tonumber(saved[1]) or cap
    local at = tonumber(saved[2]) or now
    level = math.min(cap, level + math.max(0, now - at) * rate)
    levels[i] = level
    if cost > cap then
      return {i, 'inf'}
    end
    local wait = math.max(0, (cost - level) / rate)
    if wait > longest then
      refused, longest = i, wait
    end
  end
end
if refused > 0 then
  return {refused, tostring(longest)}
end
for i = 1, 2 do
  if levels[i] ~= nil then
    redis.call('HSET', KEYS[i], 'level', tostring(levels[i] - tonumber(ARGV[i + 2])), 'at', tostring(now))
    redis.call('PEXPIRE', KEYS[i], math.ceil(period * 2000))
  end
end
return {0, '0'}
"""
_KINDS = {1: "requests", 2: "tokens"}


class SharedRateLimiter:
    """`check(tenant, tokens)` against buckets in Redis; tenants without limits pass."""

    def __init__(self, limits: Mapping[str, RateLimit], client: redis.asyncio.Redis, *, where: str,
                 key_prefix: str = "tandem:", period_s: float = 60.0):
        self._limits = {t: lim for t, lim in limits.items()
                        if lim.requests_per_minute is not None or lim.tokens_per_minute is not None}
        self._client = client
        self._take = client.register_script(_TAKE)
        self._where = where  # host:port (redis_index.endpoint_of), for the log
        self._key_prefix = key_prefix
        self._period_s = period_s
        self._fallback = RateLimiter(self._limits)
        self._down = False

    @property
    def active(self) -> bool:
        return bool(self._limits)

    async def check(self, tenant: Optional[str], tokens: int) -> None:
        limit = self._limits.get(tenant) if tenant is not None else None
        if limit is None:
            return
        keys = [f"{self._key_prefix}rl:{tenant}:{kind}" for kind in ("requests", "tokens")]
        caps = [limit.requests_per_minute or 0, limit.tokens_per_minute or 0]
        try:
            refused, wait = await self._take(keys=keys, args=[*caps, 1, tokens, self._period_s])
        except redis.RedisError as exc:
            if not self._down:
                log.warning("Redis at %s is unreachable for rate limits (%s); each gateway replica limits "
                            "on its own until it is back", self._where, type(exc).__name__)
                self._down = True
            self._fallback.check(tenant, tokens)
            return
        if self._down:
            log.info("Redis at %s is back: rate limits are shared again", self._where)
            self._down = False
        refused = int(refused)
        if refused:
            kind = _KINDS[refused]
            wait_s = math.inf if wait in (b"inf", "inf") else float(wait)
            raise rate_limited(tenant, kind, caps[refused - 1], 1 if kind == "requests" else tokens, wait_s)

    def hook(self) -> EdgeHook:
        """The edge's `rate_limit` hook: (the tenant the edge authenticated, tokens)."""
        return self.check

    async def close(self) -> None:
        await self._client.aclose()


def rate_limiter_from_config(cfg) -> RateLimiter | SharedRateLimiter:
    """The limiter a ClusterConfig asks for (auth.rate_limit_store)."""
    limits = tenant_limits(cfg)
    if cfg.auth.rate_limit_store == "memory":
        return RateLimiter(limits)
    from router.prefix_index.redis_index import client_kwargs, endpoint_of, tls_of

    index = cfg.routing.index
    kwargs = client_kwargs(index.redis_url, password=index.resolve_redis_password(), username=index.redis_username,
                           tls=tls_of(index.redis_tls))
    return SharedRateLimiter(limits, redis.asyncio.Redis.from_url(index.redis_url, **kwargs),
                             where=endpoint_of(index.redis_url), key_prefix=index.key_prefix)
