"""DisaggregatedBackend.abort reaches the replica that holds the request.

A pool may have several replicas; an abort sent through the Serve handle without a pin
lands wherever Serve picks, which is often not the replica running the request (the abort
of an unknown id is a no-op there, and the request runs on). The backend remembers where
each hop in flight went and pins its abort there (router/routing/serve_router.py).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from vllm import SamplingParams

from cluster.protocol import EngineRequest
from cluster.types import TierPools
from router.pd.path import DisaggregatedBackend
from router.routing.decider import PDDecider
from router.routing.directory import PoolDirectory
from router.routing.service import KVRouter
from tests.support.fakes import FakeServePool

TIER = "interactive"


def make_backend(*, routed: bool = True, hang_prefill: bool = False, prefill_timeout_s: float = 5.0):
    dirs = {(TIER, pool): PoolDirectory() for pool in ("prefill", "decode")}
    pools = TierPools(prefill=FakeServePool(dirs[(TIER, "prefill")], ["p0", "p1", "p2"], hang_prefill),
                      decode=FakeServePool(dirs[(TIER, "decode")], ["d0", "d1", "d2"]))
    router = KVRouter(directories=dirs, index=None, weights={"load": 1.0}, decider=PDDecider(0),
                      subscribe=False, rng=random.Random(7)) if routed else None
    backend = DisaggregatedBackend(pools={TIER: pools}, decode_streams="per_request", prefill_timeout_s=prefill_timeout_s, router=router)
    return backend, pools


def request(i: int) -> EngineRequest:
    return EngineRequest(f"req-{i}", (1, 2, 3), SamplingParams(max_tokens=1000), tier=TIER)


def test_abort_mid_stream_goes_to_the_decode_replica_of_the_request():
    async def main():
        backend, pools = make_backend()
        for i in range(30):
            it = backend.generate(request(i))
            await anext(it)  # streaming: the decode hop is in flight
            await anext(it)
            await backend.abort(f"req-{i}")
            await it.aclose()
        return backend, pools

    backend, pools = asyncio.run(main())
    for i in range(30):
        rid = f"req-{i}"
        assert pools.decode.replica_of("abort", rid) == pools.decode.replica_of("generate", rid)
        assert pools.prefill.replica_of("abort", rid) == []  # finished hop: nothing to abort there
    # Decode replicas were spread (so a wrong pick would have shown), and nothing is left behind.
    assert len({r for m, _, r in pools.decode.calls if m == "generate"}) > 1
    assert backend.hops._in_flight == {} and all(d.take_pin(f"req-{i}") is None
                                       for d in (pools.prefill.directory, pools.decode.directory)
                                       for i in range(30))


@pytest.mark.parametrize("leave", ["cancel", "close"])
def test_a_stream_left_mid_decode_is_aborted_on_its_decode_replica_without_an_abort_call(leave):
    """The client left: vLLM's serving code cancels the task awaiting the next chunk, or closes
    the stream while it waits at a yield. The backend aborts the hop itself, pinned, once."""
    async def main():
        backend, pools = make_backend()
        for i in range(10):
            it = backend.generate(request(i))
            await anext(it)
            await anext(it)  # decode streams
            if leave == "close":
                await it.aclose()
            else:
                waiting = asyncio.ensure_future(anext(it))
                await asyncio.sleep(0)
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
            await asyncio.sleep(0.01)  # the abort is sent in the background
        return backend, pools

    backend, pools = asyncio.run(main())
    for i in range(10):
        rid = f"req-{i}"
        assert pools.decode.replica_of("abort", rid) == pools.decode.replica_of("generate", rid)
    assert backend.hops._in_flight == {} and backend.hops._aborts == set()


def test_abort_of_a_finished_or_unknown_request_sends_nothing():
    async def main():
        backend, pools = make_backend()
        it = backend.generate(request(0))
        await anext(it)
        await it.aclose()  # the stream ended
        await backend.abort("req-0")
        await backend.abort("never-seen")
        return pools

    pools = asyncio.run(main())
    assert [c for p in (pools.prefill, pools.decode) for c in p.calls if c[0] == "abort"] == []


def test_prefill_timeout_aborts_on_the_prefill_replica_it_was_routed_to():
    async def main():
        backend, pools = make_backend(hang_prefill=True, prefill_timeout_s=0.05)
        it = backend.generate(request(1))
        await anext(it)  # the prefill timed out; decode recomputes and streams
        await asyncio.sleep(0.05)  # the prefill abort is sent in the background
        await it.aclose()
        return pools

    pools = asyncio.run(main())
    assert pools.prefill.replica_of("abort", "req-1") == pools.prefill.replica_of("prefill", "req-1")
    assert len(pools.prefill.replica_of("abort", "req-1")) == 1


@pytest.mark.parametrize("routed", [True, False])
def test_abort_while_waiting_for_the_prefill_reaches_the_prefill_pool(routed):
    async def main():
        backend, pools = make_backend(routed=routed, hang_prefill=True)
        task = asyncio.ensure_future(anext(backend.generate(request(2))))
        await asyncio.sleep(0.05)
        await backend.abort("req-2")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return pools

    pools = asyncio.run(main())
    aborted = pools.prefill.replica_of("abort", "req-2")
    assert len(aborted) == 1
    if routed:  # without a router Serve picks both calls; we cannot know the replica
        assert aborted == pools.prefill.replica_of("prefill", "req-2")
    assert pools.decode.calls == []


def test_the_serve_router_reads_the_request_id_of_an_abort():
    from types import SimpleNamespace

    from router.routing.serve_router import request_id_of

    assert request_id_of(SimpleNamespace(args=("req-9",))) == "req-9"  # abort(request_id)
    assert request_id_of(SimpleNamespace(args=(request(9), None))) == "req-9"  # generate(request, handoff)
    assert request_id_of(SimpleNamespace(args=())) is None


def test_a_burst_waiting_for_its_prefills_is_spread_over_the_decode_replicas_and_leaves_nothing_booked():
    """A request's decode replica is chosen at its route but its hop starts only after the prefill:
    counted from the pick (the ledger's booking), a burst routed meanwhile spreads; counted from
    the hop, every request of the burst saw the decode replicas idle (seen on real engines: 3 of
    4 streams on one of two decode replicas)."""
    async def main():
        dirs = {(TIER, pool): PoolDirectory() for pool in ("prefill", "decode")}
        pools = TierPools(prefill=FakeServePool(dirs[(TIER, "prefill")], ["p0"], hang_prefill=True),
                          decode=FakeServePool(dirs[(TIER, "decode")], ["d0", "d1", "d2"]))
        router = KVRouter(directories=dirs, index=None, weights={"load": 1.0}, decider=PDDecider(0, "always"),
                          subscribe=False, rng=random.Random(7))
        backend = DisaggregatedBackend(pools={TIER: pools}, decode_streams="per_request", prefill_timeout_s=60,
                                       router=router)
        tasks = [asyncio.ensure_future(anext(backend.generate(request(i)))) for i in range(6)]
        await asyncio.sleep(0.05)  # every request routed, every prefill hanging
        booked = {r: router._ledger.in_flight(r) for r in ("d0", "d1", "d2")}
        for task in tasks:  # the clients leave before any decode hop started
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.01)
        return booked, router._ledger.leftovers(), pools

    booked, leftovers, pools = asyncio.run(main())
    assert booked == {"d0": 2, "d1": 2, "d2": 2}
    assert pools.decode.calls == [] and set(leftovers) <= {"done"}  # done: the prefills' recent window, timed out later
