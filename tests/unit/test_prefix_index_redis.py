"""The Redis PrefixIndex against a real redis-server (started here on a free port): the same
semantics as the in-process index, and Redis going away mid-run: routing falls back to load
only without an error, and recovers when Redis is back."""

from __future__ import annotations

import asyncio
import time

import pytest

from cluster.hashing import BlockHasher
from router.kv_events import KVEventSubscriber
from router.prefix_index import BlockStored, IndexUnavailable, make_index
from router.prefix_index.redis_index import RedisPrefixIndex
from cluster.engine.fake_kv_events import KVEventPublisher
from tests.support.fakes import stored
from tests.unit.test_prefix_index import check_index_semantics, wait_for
from tests.unit.test_routing import PROMPT, kv_router, request


def test_redis_index_has_the_same_semantics(redis_server):
    check_index_semantics(make_index("redis", redis_url=redis_server.url, prefix="t1:"))


def test_two_gateways_share_one_redis_index(redis_server):
    writer = make_index("redis", redis_url=redis_server.url, prefix="t2:")
    reader = make_index("redis", redis_url=redis_server.url, prefix="t2:")
    writer.apply([BlockStored("w", (1, 2))])
    assert reader.match([1, 2]) == {"w": 2}


def test_redis_going_away_falls_back_to_load_and_recovers(redis_server):
    # Redis going away refuses connections at once; the 2 s timeout (0.25 s by default) only
    # keeps a call to the live server from timing out on a loaded CI machine (seen once).
    index = RedisPrefixIndex(redis_server.url, prefix="t3:", timeout_s=2.0)
    router = kv_router(index)
    hashes = tuple(BlockHasher(4).hashes(PROMPT))
    pub = KVEventPublisher()
    kinds: list[str] = []
    sub = KVEventSubscriber("interactive-prefill-p2", pub.endpoint, pub.replay_endpoint, index, on_event=kinds.append)
    sub.start()
    try:
        while "batch" not in kinds:
            pub.publish([])
            time.sleep(0.02)
        pub.publish([stored(*hashes)])
        wait_for(lambda: index.match(hashes) == {"interactive-prefill-p2": 10})
        decision = asyncio.run(router.route(request(PROMPT), "interactive"))
        assert decision.reason == "prefix_hit" and decision.prefill.worker.replica_id == "p2"

        redis_server.stop()
        with pytest.raises(IndexUnavailable):
            index.match(hashes)
        for i in range(3):  # every request still gets a route, on load alone
            decision = asyncio.run(router.route(request(PROMPT, f"down{i}"), "interactive"))
            assert decision.reason == "index_unavailable"
            assert decision.prefill is not None and decision.decode is not None
        pub.publish([stored(99)])  # events while Redis is down cannot be stored...
        wait_for(lambda: "index_down" in kinds)

        redis_server.start()  # ...back, empty (no persistence): rebuilt from new events
        # A batch whose write fails while Redis restarts is dropped (in production the engine's
        # next events refill the index): publish until one lands.
        deadline = time.monotonic() + 30
        while matches_or_none(index, hashes) != {"interactive-prefill-p2": 4}:
            assert time.monotonic() < deadline, f"the index was not refilled after Redis came back: {kinds[-5:]}"
            pub.publish([stored(*hashes[:4])])
            time.sleep(0.2)
        decision = asyncio.run(router.route(request(PROMPT, "back"), "interactive"))
        assert decision.reason == "prefix_hit" and decision.predicted_hit_tokens == 16
    finally:
        sub.stop()
        pub.close()


def matches_or_none(index, hashes):
    try:
        return index.match(hashes)
    except IndexUnavailable:
        return None

