"""The gateway's teardown (router/gateway.py close_gateway, run by Serve's awaited `__del__` on
replica shutdown): the handshake warmer stops, KVRouter.close stops the KV-event subscribers
and closes the prefix index, the shared rate limiter closes its Redis connection, the engine
client releases its renderer; one part failing does not keep the others open."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
import random

from router.gateway import Gateway, close_gateway
from router.prefix_index import MemoryPrefixIndex
from router.ratelimit import RateLimiter
from router.routing.decider import PDDecider
from router.routing.service import KVRouter


class _Warmer:
    def __init__(self, fail: bool = False) -> None:
        self.stopped = False
        self.fail = fail

    async def stop(self) -> None:
        self.stopped = True
        if self.fail:
            raise RuntimeError("warmer broke")


class _Index(MemoryPrefixIndex):
    closed = False

    def close(self) -> None:
        self.closed = True


class _Subscriber:
    stopped = False

    def stop(self) -> None:
        self.stopped = True


class _SharedLimiter:
    closed = False

    async def close(self) -> None:
        self.closed = True


class _Hops:
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


class _EngineClient:
    shut = False

    def shutdown(self) -> None:
        self.shut = True


def _router() -> tuple[KVRouter, _Index, _Subscriber]:
    index = _Index()
    router = KVRouter(directories={}, index=index, weights={"load": 1.0}, decider=PDDecider(0),
                      rng=random.Random(0), subscribe=False)
    sub = _Subscriber()
    router._subscribers["interactive-prefill-p0"] = sub  # as _sync_subscribers leaves it
    return router, index, sub


def test_teardown_closes_router_index_subscribers_limiter_and_client():
    router, index, sub = _router()
    warmer, limiter, client, hops = _Warmer(), _SharedLimiter(), _EngineClient(), _Hops()
    asyncio.run(close_gateway(warmer, router, limiter, client, hops))
    assert warmer.stopped and sub.stopped and index.closed and limiter.closed and client.shut and hops.closed
    assert router._subscribers == {}


def test_one_part_failing_does_not_keep_the_others_open():
    router, index, sub = _router()
    warmer, client, hops = _Warmer(fail=True), _EngineClient(), _Hops()
    asyncio.run(close_gateway(warmer, router, RateLimiter({}), client, hops))  # in-memory limiter: nothing to close
    assert warmer.stopped and sub.stopped and index.closed and client.shut and hops.closed


def test_serve_runs_it_on_replica_shutdown():
    """Serve awaits an async `__del__` on graceful replica teardown (ray/serve/_private/replica.py)."""
    router, index, sub = _router()
    gateway = Gateway.func_or_class.__new__(Gateway.func_or_class)  # the class Serve instantiates, without __init__
    gateway.warmer, gateway.router, gateway.rate_limits = _Warmer(), router, _SharedLimiter()
    gateway.engine_client, gateway.backend = _EngineClient(), SimpleNamespace(hops=_Hops())
    assert asyncio.iscoroutinefunction(Gateway.func_or_class.__del__)
    asyncio.run(gateway.__del__())
    assert index.closed and gateway.rate_limits.closed and gateway.engine_client.shut and gateway.backend.hops.closed
