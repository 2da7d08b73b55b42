"""PrefixIndex (in-process backend) and the KV-event subscriber: apply/match with synthetic
events, eviction, worker removal, sequence gaps repaired by replay or by a reset."""

from __future__ import annotations

import time

import pytest

from router.kv_events import KVEventSubscriber, decode_batch
from router.prefix_index import AllBlocksCleared, BlockRemoved, BlockStored, MemoryPrefixIndex
from cluster.engine.fake_kv_events import KVEventPublisher
from tests.support.fakes import removed, stored


def check_index_semantics(index) -> None:
    """The behaviour every backend must have (the Redis suite runs it too)."""
    index.apply([BlockStored("a", (1, 2, 3)), BlockStored("b", (1, 2)), BlockStored("c", (1, 3))])
    assert index.match([1, 2, 3, 4]) == {"a": 3, "b": 2, "c": 1}  # c has a hole at block 2
    assert index.match([9, 1, 2]) == {}  # a prefix cache only reuses an unbroken prefix
    assert index.match([]) == {}
    index.apply([BlockRemoved("a", (2,))])  # eviction
    assert index.match([1, 2, 3]) == {"a": 1, "b": 2, "c": 1}
    index.apply([AllBlocksCleared("b")])
    assert index.match([1, 2, 3]) == {"a": 1, "c": 1}
    index.remove_worker("a")
    assert index.match([1, 2, 3]) == {"c": 1}
    index.apply([BlockStored("c", (2,)), BlockRemoved("c", (99,))])  # removing unknown: no-op
    assert index.match([1, 2, 3]) == {"c": 3}


def test_memory_index_apply_match_evict_remove():
    check_index_semantics(MemoryPrefixIndex())


def test_memory_index_forgets_blocks_nobody_holds():
    index = MemoryPrefixIndex()
    index.apply([BlockStored("a", (1, 2)), BlockStored("b", (2,))])
    index.remove_worker("a")
    index.apply([BlockRemoved("b", (2,))])
    assert index.num_blocks() == 0


def test_decode_batch_reads_vllm_wire_format():
    import msgspec

    payload = msgspec.msgpack.encode([1.0, [stored(1, 2), removed(2), {"type": "AllBlocksCleared"}], None])
    assert decode_batch("w", payload) == [BlockStored("w", (1, 2)), BlockRemoved("w", (2,)), AllBlocksCleared("w")]
    # Byte hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0) land on the same integers.
    raw = (5).to_bytes(32, "big")
    payload = msgspec.msgpack.encode([1.0, [stored(raw)], None])
    assert decode_batch("w", payload) == [BlockStored("w", (5,))]


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached")
        time.sleep(0.02)


@pytest.fixture
def stream():
    """A fake publisher, a memory index and a subscriber that has joined the stream."""
    pub = KVEventPublisher()
    index = MemoryPrefixIndex()
    kinds: list[str] = []
    sub = KVEventSubscriber("w", pub.endpoint, pub.replay_endpoint, index, on_event=kinds.append)
    index.apply([BlockStored("w", (777,))])  # stale entry from an earlier life of the index
    sub.start()
    while "batch" not in kinds:  # ZMQ drops what is sent before the SUB has connected
        pub.publish([])
        time.sleep(0.02)
    yield pub, index, kinds
    sub.stop()
    pub.close()


def test_subscriber_joining_resets_stale_entries(stream):
    pub, index, kinds = stream
    assert index.match([777]) == {}


def test_subscriber_applies_in_order(stream):
    pub, index, kinds = stream
    pub.publish([stored(1, 2)])
    pub.publish([stored(3), removed(2)])
    wait_for(lambda: index.match([1]) == {"w": 1} and index.match([3]) == {"w": 1})
    assert index.match([1, 2]) == {"w": 1}


def test_subscriber_repairs_a_gap_by_replay(stream):
    pub, index, kinds = stream
    pub.publish([stored(1)])
    pub.publish([stored(2)], drop=True)  # lost on the wire, still in the replay buffer
    pub.publish([stored(3)])
    wait_for(lambda: index.match([3]) == {"w": 1})
    assert index.match([1]) == {"w": 1} and index.match([2]) == {"w": 1}
    assert "gap" in kinds and "replayed" in kinds and "reset" not in kinds


def test_subscriber_resets_worker_when_gap_cannot_be_replayed(stream):
    pub, index, kinds = stream
    pub.publish([stored(1)])
    wait_for(lambda: index.match([1]) == {"w": 1})
    pub.publish([removed(1)], drop=True)  # lost, and gone from the buffer too
    pub.forget()
    pub.publish([stored(5)])
    wait_for(lambda: index.match([5]) == {"w": 1})
    assert index.match([1]) == {}  # the stale block is not trusted any more
    assert "reset" in kinds


def test_subscriber_stops():
    pub = KVEventPublisher()
    index = MemoryPrefixIndex()
    kinds: list[str] = []
    sub = KVEventSubscriber("w", pub.endpoint, None, index, on_event=kinds.append)
    sub.start()
    while "batch" not in kinds:
        pub.publish([])
        time.sleep(0.02)
    sub.stop()
    assert not sub._thread.is_alive()  # stop() joined the thread
    assert not sub.crashed  # stopped on purpose: nothing to restart
    pub.publish([stored(1)])
    time.sleep(POLL_S)
    assert index.match([1]) == {}  # nobody applies events any more
    sub.stop()  # idempotent
    pub.close()


POLL_S = 0.3


def test_a_malformed_payload_is_counted_skipped_and_the_entries_rebuilt(stream):
    pub, index, kinds = stream
    pub.publish([stored(1)])
    pub.publish_payload(b"\xc1 not msgpack")  # in the replay buffer as garbage too
    pub.publish([stored(3)])
    wait_for(lambda: index.match([3]) == {"w": 1})
    assert "malformed" in kinds and "rebuild" in kinds
    # Events before the unreadable batch cannot be trusted (it may have removed them): gone.
    assert index.match([1]) == {}
    pub.publish([removed(3), stored(4)])
    wait_for(lambda: index.match([4]) == {"w": 1})
    assert index.match([3]) == {}  # the subscriber carries on in order after the bad frame


@pytest.mark.parametrize("frames", [[b"only-one-part"], [b"", b"short", b"x"], [b"", (5).to_bytes(8, "big")],
                                    [b"", (10**9).to_bytes(8, "big"), b"\xc1 garbage with a far-off seq"]])
def test_a_malformed_message_rebuilds_the_entries_from_the_replay(stream, frames):
    pub, index, kinds = stream
    pub.publish([stored(1)])
    wait_for(lambda: index.match([1]) == {"w": 1})
    kinds.clear()  # joining the stream may have had a gap of its own
    pub.publish([stored(2)], drop=True)  # lost on the wire, in the buffer
    pub.send_raw(frames)
    wait_for(lambda: index.match([1, 2]) == {"w": 2})  # the rebuild replayed the buffer
    assert "malformed" in kinds and "rebuild" in kinds
    pub.publish([stored(3)])
    wait_for(lambda: index.match([1, 2, 3]) == {"w": 3})
    assert "gap" not in kinds  # the rebuild left the subscriber at the right seq


@pytest.mark.parametrize("payload", [
    b"\x93\x01\x02",  # msgpack of a truncated array
    __import__("msgspec").msgpack.encode([0.0, [{"type": "BlockStored"}], None]),  # no block_hashes
    __import__("msgspec").msgpack.encode([0.0, [1, 2], None]),  # events that are not maps
    __import__("msgspec").msgpack.encode({"not": "a batch"}),
])
def test_decode_batch_reports_every_malformed_payload_as_one_error(payload):
    from router.kv_events import MalformedFrame

    with pytest.raises(MalformedFrame):
        decode_batch("w", payload)


class ExplodingIndex(MemoryPrefixIndex):
    """A bug in the index (not IndexUnavailable) kills the subscriber thread once."""

    def __init__(self) -> None:
        super().__init__()
        self.explode = False

    def apply(self, events):
        if self.explode:
            self.explode = False
            raise RuntimeError("index bug")
        return super().apply(events)


def _prefill_router(index):
    """A KVRouter over one prefill pool, the pool's directory, a request, and a KV-event
    publisher for the replica `p1` to report."""
    import random

    from vllm import SamplingParams

    from cluster.protocol import EngineRequest
    from router.routing.decider import PDDecider
    from router.routing.directory import PoolDirectory
    from router.routing.service import KVRouter

    prefill = PoolDirectory()
    router = KVRouter(directories={("interactive", "prefill"): prefill}, index=index, weights={"prefix": 1.0},
                      decider=PDDecider(0), rng=random.Random(0), clock=iter(range(0, 10**6, 10)).__next__)
    req = EngineRequest("r", tuple(range(8)), SamplingParams(max_tokens=1), tier="interactive")
    return router, prefill, req, KVEventPublisher()


def _p1(pub):
    from cluster.types import RoutingStats
    from router.routing.directory import ReplicaInfo

    return ReplicaInfo("p1", 4, RoutingStats(worker_id="interactive-prefill-p1", block_size=4,
                                             kv_events=pub.endpoint, kv_replay=pub.replay_endpoint))


def test_router_restarts_a_dead_subscriber():
    import asyncio

    index = ExplodingIndex()
    router, prefill, req, pub = _prefill_router(index)
    worker = "interactive-prefill-p1"
    try:
        prefill.set_replicas([_p1(pub)])
        asyncio.run(router.route(req, "interactive"))
        first = router._subscribers[worker]
        wait_for(lambda: (pub.publish([stored(1)]), index.match([1]) == {worker: 1})[1])
        index.explode = True
        wait_for(lambda: (pub.publish([stored(2)]), first.crashed)[1])
        asyncio.run(router.route(req, "interactive"))  # the next sync replaces it
        second = router._subscribers[worker]
        assert second is not first and not second.crashed
        wait_for(lambda: (pub.publish([stored(9)]), index.match([9]) == {worker: 1})[1])
    finally:
        router.close()
        pub.close()


def test_router_follows_workers_that_join_and_forgets_those_that_leave():
    """A replica's routing stats appearing in its pool directory is all it takes to join; when
    it leaves the directory, its index entries go."""
    import asyncio

    index = MemoryPrefixIndex()
    router, prefill, req, pub = _prefill_router(index)
    try:
        prefill.set_replicas([_p1(pub)])
        asyncio.run(router.route(req, "interactive"))  # starts following p1's events
        wait_for(lambda: (pub.publish([stored(1)]), index.match([1]) == {"interactive-prefill-p1": 1})[1])
        prefill.set_replicas([])
        asyncio.run(router.route(req, "interactive"))
        assert index.match([1]) == {}
    finally:
        router.close()
        pub.close()
