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
    index = make_index("redis", redis_url=redis_server.url, prefix="t3:")
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
        pub.publish([stored(*hashes[:4])])
        wait_for(lambda: index.match(hashes) == {"interactive-prefill-p2": 4})
        decision = asyncio.run(router.route(request(PROMPT, "back"), "interactive"))
        assert decision.reason == "prefix_hit" and decision.predicted_hit_tokens == 16
    finally:
        sub.stop()
        pub.close()
