"""Redis stopped under load: no request fails, routing falls back to load only, and the
prefix index recovers when Redis returns.

The session cluster's gateway keeps the in-memory index (switching every integration test to
Redis would put a bounded thread hop to Redis on every routing decision of every test, on a
loaded 2-core machine, where a slow answer already means load-only routing and would make
test_kv_router's affinity checks flaky). So this test builds the same request path as the
gateway in the test process: a KVRouter over a Redis PrefixIndex (a real redis-server this
test owns and stops) following the real engines' KV events, and a DisaggregatedBackend over
the real Serve handles of the interactive pools (real prefill, NIXL, decode).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid

from vllm import SamplingParams
import redis

from cluster.protocol import EngineRequest, finish_reason
from cluster.types import PoolId, TierPools
from router.pd.path import DisaggregatedBackend
from router.prefix_index import make_index
from router.routing.decider import PDDecider
from router.routing.directory import pool_directory
from router.routing.service import KVRouter
from tests.support.redis_server import RedisServer


TIER = "interactive"
BLOCK = 128  # vLLM's CPU block size: prefixes of whole blocks are hashed and indexed
CONCURRENCY = 4
DOWN_S = 6


def tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(5, 250) for _ in range(n))


def engine_request(prompt: tuple[int, ...]) -> EngineRequest:
    return EngineRequest(f"faults-redis-{uuid.uuid4()}", prompt,
                         SamplingParams(max_tokens=6, temperature=0, ignore_eos=True), tier=TIER)


async def complete(backend: DisaggregatedBackend, prompt: tuple[int, ...]) -> str:
    finish = None
    async for chunk in backend.generate(engine_request(prompt)):
        finish = finish_reason(chunk) or finish
    return finish


async def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s} s")
        await asyncio.sleep(0.25)


def test_redis_stopped_under_load_fails_nothing_and_routing_recovers(base_url):
    from ray import serve

    server = RedisServer()
    server.start()
    router = None
    try:
        dirs = {(TIER, pool): pool_directory(PoolId(TIER, pool)) for pool in ("prefill", "decode")}
        handles = TierPools(prefill=serve.get_deployment_handle(f"{TIER}-prefill", app_name="tandem"),
                            decode=serve.get_deployment_handle(f"{TIER}-decode", app_name="tandem"))
        router = KVRouter(directories=dirs, index=make_index("redis", redis_url=server.url, prefix="faults:"),
                          weights={"prefix": 1.0, "load": 0.5, "kv_usage": 0.1}, decider=PDDecider(0))
        backend = DisaggregatedBackend(pools={TIER: handles}, prefill_timeout_s=30,
                                       router=router)
        asyncio.run(scenario(backend, router, handles, server))
    finally:
        if router is not None:
            router.close()
        server.stop()


async def scenario(backend, router, handles, server) -> None:
    rng = random.Random(time.time_ns())
    client = redis.Redis.from_url(server.url)

    # This process's Serve routers publish the replicas (and their KV-event endpoints) once
    # the handles are in use.
    await handles.prefill.stats.remote()
    await handles.decode.stats.remote()

    async def workers_known() -> bool:
        return all(len([r for r in router.workers(TIER, pool) if r.block_size]) == n
                   for pool, n in (("prefill", 2), ("decode", 1)))

    await wait_until(workers_known, 60, "the Serve routers did not publish both pools")

    async def prefix_hit(prefix: tuple[int, ...]) -> bool:
        await complete(backend, prefix + tokens(rng, 20))  # stores the prefix's blocks → KV events → Redis
        decision = await router.route(engine_request(prefix + tokens(rng, 20)), TIER)
        return decision.reason == "prefix_hit"

    shared = tokens(rng, 3 * BLOCK)
    await wait_until(lambda: prefix_hit(shared), 60, "no prefix hit through Redis before the outage")
    assert client.dbsize() > 0

    # Closed-loop load throughout; Redis is stopped for DOWN_S in the middle of it.
    finishes: list[str] = []
    served = {"before": 0, "down": 0, "after": 0}  # requests finished in each phase
    phase = ["before"]
    stop = asyncio.Event()

    async def client_loop(i: int) -> None:
        while not stop.is_set():
            prompt = (shared if i % 2 else tokens(rng, 2 * BLOCK)) + tokens(rng, 30)
            finishes.append(await complete(backend, prompt))
            served[phase[0]] += 1

    load = asyncio.ensure_future(asyncio.gather(*(client_loop(i) for i in range(CONCURRENCY))))
    while served["before"] < 2 * CONCURRENCY:
        await asyncio.sleep(0.1)
    server.stop()
    phase[0], stopped_at = "down", time.monotonic()
    reasons_down: list[str] = []
    while time.monotonic() - stopped_at < DOWN_S:
        reasons_down.append((await router.route(engine_request(shared + tokens(rng, 20)), TIER)).reason)
        await asyncio.sleep(0.3)
    server.start()  # back, empty (no persistence)
    restarted_at = time.monotonic()
    phase[0], down_s = "after", restarted_at - stopped_at
    while served["after"] < 2 * CONCURRENCY:
        await asyncio.sleep(0.1)
    stop.set()
    await load

    assert finishes == ["length"] * len(finishes)  # 0 failed requests
    assert served["down"] > 0 and reasons_down and set(reasons_down) == {"index_unavailable"}, reasons_down

    # Back: new KV events land in the fresh Redis, and prefix routing works again.
    fresh = tokens(rng, 3 * BLOCK)
    await wait_until(lambda: prefix_hit(fresh), 60, "routing did not find prefixes through Redis again")
    print(f"\n{len(finishes)} requests ({served}), 0 failed; Redis down {down_s:.1f} s, {served['down']} served "
          f"meanwhile, {len(reasons_down)} routing probes all index_unavailable (load only); prefix hits "
          f"again {time.monotonic() - restarted_at:.1f} s after Redis returned ({client.dbsize()} keys)")
