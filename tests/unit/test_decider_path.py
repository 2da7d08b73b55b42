"""The decider's verdict through DisaggregatedBackend: local prompts never touch the prefill
pool, remote ones take the prefill hop, and a burst that queues the prefill engine sends some
requests local without failing any (fake Serve pools, tests/support/fakes.py)."""

from __future__ import annotations

import asyncio
import random

from vllm import SamplingParams

from cluster.protocol import EngineRequest, new_token_ids
from cluster.types import TierPools
from router.pd.path import DisaggregatedBackend
from router.routing.decider import Objectives, PDDecider
from router.routing.directory import PoolDirectory, ReplicaInfo
from cluster.types import RoutingStats
from router.routing.service import KVRouter
from tests.support.fakes import FakeServePool

TIER = "interactive"


def make_backend(queued_prompt_tokens: int, mode: str = "adaptive"):
    dirs = {(TIER, pool): PoolDirectory() for pool in ("prefill", "decode")}
    pools = TierPools(prefill=FakeServePool(dirs[(TIER, "prefill")], ["p0"]),
                      decode=FakeServePool(dirs[(TIER, "decode")], ["d0"]))
    dirs[(TIER, "prefill")].set_replicas([ReplicaInfo("p0", 64, RoutingStats.from_dict({"worker_id": "interactive-prefill-p0",
                                                                 "queued_prompt_tokens": queued_prompt_tokens}))])
    dirs[(TIER, "decode")].set_replicas([ReplicaInfo("d0", 64, RoutingStats.from_dict({"worker_id": "interactive-decode-d0",
                                                                "running_seqs": 0}))])
    router = KVRouter(directories=dirs, index=None, weights={"load": 1.0}, decider=PDDecider(mode=mode),
                      subscribe=False, rng=random.Random(0), objectives={TIER: Objectives(ttft_s=1.0, itl_s=0.1, gap_s=0.2)},
                      chunk_budgets={TIER: 64})
    backend = DisaggregatedBackend(pools={TIER: pools}, decode_streams="per_request", prefill_timeout_s=5, router=router)
    return backend, pools


def request(i: int, n: int = 300) -> EngineRequest:
    return EngineRequest(f"req-{i}", tuple(range(n)), SamplingParams(max_tokens=3), tier=TIER)


async def tokens_of(backend, req) -> int:
    return sum([len(new_token_ids(o)) async for o in backend.generate(req)])


def test_a_long_reported_prefill_queue_sends_the_prompt_to_decode_only():
    backend, pools = make_backend(queued_prompt_tokens=20_000)
    assert asyncio.run(tokens_of(backend, request(0))) == 3
    assert pools.prefill.calls == [] and pools.decode.replica_of("generate", "req-0") == ["d0"]


def test_an_idle_prefill_engine_takes_the_long_prompt():
    backend, pools = make_backend(queued_prompt_tokens=0)
    assert asyncio.run(tokens_of(backend, request(0))) == 3
    assert pools.prefill.replica_of("prefill", "req-0") == ["p0"]
    assert pools.decode.replica_of("generate", "req-0") == ["d0"]


def test_never_skips_the_prefill_pool_and_always_uses_it_whatever_the_queue():
    backend, pools = make_backend(queued_prompt_tokens=0, mode="never")
    asyncio.run(tokens_of(backend, request(0)))
    assert pools.prefill.calls == []
    backend, pools = make_backend(queued_prompt_tokens=20_000, mode="always")
    asyncio.run(tokens_of(backend, request(0)))
    assert pools.prefill.replica_of("prefill", "req-0") == ["p0"]


def test_a_burst_queues_the_prefill_engine_then_spills_to_decode_and_fails_none():
    backend, pools = make_backend(queued_prompt_tokens=0)

    async def burst():
        return await asyncio.gather(*(tokens_of(backend, request(i)) for i in range(8)))

    assert asyncio.run(burst()) == [3] * 8
    remote = {rid for m, rid, _ in pools.prefill.calls if m == "prefill"}
    assert "req-0" in remote  # the first found the prefill engine idle
    assert 0 < len(remote) < 8  # the queue it built sent some local
    assert len({rid for m, rid, _ in pools.decode.calls if m == "generate"}) == 8
