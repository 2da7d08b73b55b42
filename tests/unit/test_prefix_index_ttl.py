"""Redis index keys expire (routing.index.key_ttl_s, issue 16): every key gets the TTL when
written and a new BlockStored refreshes it, so entries nobody removes do not stay for ever.
Against a real redis-server."""

from __future__ import annotations

import time

import pytest

from cluster.config import RoutingIndexConfig
from router.prefix_index import BlockRemoved, BlockStored, make_index


def test_every_key_gets_the_ttl_and_a_store_refreshes_it(redis_server):
    index = make_index("redis", redis_url=redis_server.url, prefix="ttl1:", key_ttl_s=100)
    client = redis_server.client()
    index.apply([BlockStored("w1", (1, 2))])
    keys = sorted(k.decode() for k in client.keys("ttl1:*"))
    assert keys == ["ttl1:b:1", "ttl1:b:2", "ttl1:w:w1"]
    assert all(90 < client.ttl(k) <= 100 for k in keys)
    client.expire("ttl1:b:1", 5)
    index.apply([BlockStored("w2", (1,))])  # another worker stores the same block: refreshed
    assert client.ttl("ttl1:b:1") > 90
    index.apply([BlockRemoved("w1", (2,))])
    assert index.match([1, 2]) == {"w1": 1, "w2": 1}


def test_entries_nobody_removes_expire(redis_server):
    index = make_index("redis", redis_url=redis_server.url, prefix="ttl2:", key_ttl_s=1)
    index.apply([BlockStored("gone", (7, 8))])  # a worker that vanished without BlockRemoved
    assert index.match([7, 8]) == {"gone": 2}
    deadline = time.monotonic() + 5
    while index.match([7, 8]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert index.match([7, 8]) == {}
    assert redis_server.client().keys("ttl2:*") == []


def test_no_ttl_keeps_keys_and_the_default_is_an_hour(redis_server):
    index = make_index("redis", redis_url=redis_server.url, prefix="ttl3:", key_ttl_s=None)
    index.apply([BlockStored("w", (3,))])
    assert redis_server.client().ttl("ttl3:b:3") == -1  # no expiry
    assert RoutingIndexConfig().key_ttl_s == 3600
    with pytest.raises(ValueError):
        RoutingIndexConfig(key_ttl_s=0)
