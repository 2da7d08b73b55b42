"""router/pd/prewarm.py: every prefill/decode pair of a tier gets one request through exactly
that pair; a new replica gets its pairs warmed, nothing is warmed twice, failures retry."""

from __future__ import annotations

import asyncio
import random

from router.pd.prewarm import HandshakeWarmer
from router.routing.decider import PDDecider
from router.routing.directory import PoolDirectory, ReplicaInfo
from router.routing.service import KVRouter
from tests.support.fakes import FakeServePool
from cluster.types import TierPools

TIER = "interactive"


def setup(prefills=("p0", "p1"), decodes=("d0", "d1", "d2")):
    dirs = {(TIER, pool): PoolDirectory() for pool in ("prefill", "decode")}
    pools = TierPools(prefill=FakeServePool(dirs[(TIER, "prefill")], list(prefills)),
                      decode=FakeServePool(dirs[(TIER, "decode")], list(decodes)))
    router = KVRouter(directories=dirs, index=None, weights={"load": 1.0}, decider=PDDecider(0),
                      subscribe=False, rng=random.Random(1))
    return HandshakeWarmer(pools={TIER: pools}, router=router), pools, dirs


def pairs_called(pools) -> set[tuple[str, str]]:
    prefill_of = {rid: r for m, rid, r in pools.prefill.calls if m == "prefill"}
    return {(prefill_of[rid], r) for m, rid, r in pools.decode.calls if m == "generate"}


def test_every_pair_is_warmed_once_through_exactly_that_pair():
    warmer, pools, _ = setup()
    assert asyncio.run(warmer.warm_new_pairs()) == 6
    assert pairs_called(pools) == {(p, d) for p in ("p0", "p1") for d in ("d0", "d1", "d2")}
    assert asyncio.run(warmer.warm_new_pairs()) == 0  # nothing twice
    assert len(pools.prefill.calls) == 6


def test_a_new_replica_gets_only_its_pairs_warmed():
    warmer, pools, dirs = setup()
    asyncio.run(warmer.warm_new_pairs())
    pools.prefill.replica_ids.append("p2")
    dirs[(TIER, "prefill")].set_replicas([ReplicaInfo(r, 8) for r in pools.prefill.replica_ids])
    pools.prefill.calls.clear()
    pools.decode.calls.clear()
    assert asyncio.run(warmer.warm_new_pairs()) == 3
    assert pairs_called(pools) == {("p2", d) for d in ("d0", "d1", "d2")}


def test_a_failed_warm_up_is_retried_on_the_next_pass():
    warmer, pools, _ = setup(prefills=("p0",), decodes=("d0",))
    pools.decode.refuse = RuntimeError("decode not ready")
    assert asyncio.run(warmer.warm_new_pairs()) == 0
    pools.decode.refuse = None
    assert asyncio.run(warmer.warm_new_pairs()) == 1


def test_the_warmer_starts_and_stops_cleanly():
    async def main():
        warmer, pools, _ = setup(prefills=("p0",), decodes=("d0",))
        warmer._interval_s = 0.01
        warmer.start()
        warmer.start()  # idempotent
        for _ in range(200):
            if warmer.warmed:
                break
            await asyncio.sleep(0.01)
        await warmer.stop()
        await warmer.stop()
        return warmer, [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    warmer, leftover = asyncio.run(main())
    assert warmer.warmed and leftover == []
