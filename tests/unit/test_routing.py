"""The routing pipeline without Ray or vLLM: hashing, filters, scorers, picker, P/D decider,
and the gateway-side KVRouter over a real in-process index and pool directories."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections import Counter

import pytest
from vllm import SamplingParams

from cluster.protocol import EngineRequest
from cluster.hashing import BlockHasher, external_hash
from router.prefix_index import BlockStored, IndexUnavailable, MemoryPrefixIndex
from router.routing.decider import PDDecider
from router.routing.directory import PoolDirectory, ReplicaInfo
from cluster.types import RoutingStats
from router.routing.pipeline import SCORERS, pick
from router.routing.service import KVRouter
from router.routing.types import RouteContext, Worker

WEIGHTS = {"prefix": 1.0, "load": 0.5, "kv_usage": 0.1}


def w(name: str, **kw) -> Worker:
    return Worker(worker_id=name, replica_id=name, tier=kw.pop("tier", "interactive"), pool="prefill",
                  capacity=kw.pop("capacity", 4), block_size=4, **kw)


# -- hashing ---------------------------------------------------------------------------------

def test_hashes_chain_over_full_blocks_only():
    hasher = BlockHasher(block_size=4)
    tokens = list(range(10))
    hashes = hasher.hashes(tokens)
    assert len(hashes) == 2  # the trailing 2 tokens are a partial block: never cached
    assert hasher.hashes(tokens[:8]) == hashes  # a prefix's hashes are a prefix
    assert hasher.hashes([99] + tokens[1:])[0] != hashes[0]
    assert hasher.hashes([0, 1, 2, 3, 99, 5, 6, 7])[0] == hashes[0]  # chain: later blocks only
    assert BlockHasher(4, seed="other").hashes(tokens) != hashes  # PYTHONHASHSEED changes NONE_HASH
    assert all(0 <= h < 2**64 for h in hashes)
    assert external_hash(b"\x01" * 24 + (7).to_bytes(8, "big")) == 7


def test_block_size_must_be_positive():
    with pytest.raises(ValueError):
        BlockHasher(0)


# -- filters, scorers, picker ----------------------------------------------------------------

def ctx(**matches) -> RouteContext:
    return RouteContext(tier="interactive", prompt_tokens=40,
                        num_blocks={n: 10 for n in ("a", "b", "c")}, matches=matches)


def test_scores_are_in_unit_interval():
    workers = [w("a", in_flight=9, kv_usage=1.5), w("b", in_flight=0, kv_usage=-1), w("c")]
    context = RouteContext(tier="interactive", prompt_tokens=40, num_blocks={"a": 10, "b": 0},
                           matches={"a": 12, "b": 3})
    for scorer in SCORERS.values():
        for worker in workers:
            assert 0.0 <= scorer(worker, context) <= 1.0


def test_prefix_overlap_wins_over_equal_load():
    rng = random.Random(0)
    chosen = pick([w("a"), w("b")], ctx(b=6), WEIGHTS, rng)
    assert chosen.worker.worker_id == "b"
    assert chosen.scores["prefix"] == pytest.approx(0.6)


def test_load_outweighs_a_small_prefix_when_weighted_so():
    busy_with_prefix, idle = w("a", in_flight=3), w("b")
    assert pick([busy_with_prefix, idle], ctx(a=1), WEIGHTS, random.Random(0)).worker.worker_id == "b"
    assert pick([busy_with_prefix, idle], ctx(a=1), {"prefix": 1.0}, random.Random(0)).worker.worker_id == "a"


def test_a_stale_kv_usage_reading_does_not_pile_a_burst_onto_one_replica():
    # The decode picks are booked in flight at the route (ledger.book); the engines' KV usage is a
    # second old: one still shows the streams of the round before (0.2 against 0.1).
    replicas = {"a": w("a", kv_usage=0.2, capacity=64), "b": w("b", kv_usage=0.1, capacity=64)}
    rng = random.Random(0)
    for _ in range(4):
        chosen = pick(list(replicas.values()), ctx(), WEIGHTS, rng).worker
        replicas[chosen.worker_id] = dataclasses.replace(chosen, in_flight=chosen.in_flight + 1)
    assert [r.in_flight for r in replicas.values()] == [2, 2]


def test_a_nearly_full_kv_cache_is_avoided_at_equal_load():
    full, roomy, half = w("a", kv_usage=0.95), w("b", kv_usage=0.6), w("c", kv_usage=0.5)
    assert pick([full, roomy], ctx(), WEIGHTS, random.Random(0)).worker.worker_id == "b"
    assert pick([roomy, half], ctx(), WEIGHTS, random.Random(0)).worker.worker_id == "c"
    assert pick([full, roomy], ctx(), WEIGHTS, random.Random(0)).scores["kv_usage"] == pytest.approx(0.8)


def test_ties_are_broken_at_random():
    rng = random.Random(1)
    counts = Counter(pick([w("a"), w("b"), w("c")], ctx(), WEIGHTS, rng).worker.worker_id for _ in range(300))
    assert set(counts) == {"a", "b", "c"} and min(counts.values()) > 50


def test_filters_unhealthy_other_tier_and_full():
    rng = random.Random(0)
    sick, batch, full, ok = w("a", healthy=False), w("b", tier="batch"), w("c", in_flight=4), w("d")
    assert pick([sick, batch, full, ok], ctx(a=10, b=10, c=10), WEIGHTS, rng).worker.worker_id == "d"
    # When every worker is full, capacity is relaxed: Serve queues rather than fail.
    assert pick([sick, batch, full], ctx(), WEIGHTS, rng).worker.worker_id == "c"
    assert pick([sick, batch], ctx(), WEIGHTS, rng) is None


def test_decider_skips_prefill_only_for_short_uncached_parts():
    decider = PDDecider(decode_only_below_tokens=64)
    assert decider.skip_prefill(prompt_tokens=40, cached_on_decode_tokens=0)
    assert not decider.skip_prefill(prompt_tokens=500, cached_on_decode_tokens=0)
    assert decider.skip_prefill(prompt_tokens=500, cached_on_decode_tokens=448)
    assert not PDDecider(0).skip_prefill(prompt_tokens=1, cached_on_decode_tokens=1)


# -- KVRouter ----------------------------------------------------------------------------------

def directory(*names: str, block_size: int = 4, pool: str = "prefill") -> PoolDirectory:
    d = PoolDirectory()
    d.set_replicas([ReplicaInfo(n, 8, RoutingStats.from_dict({"worker_id": f"interactive-{pool}-{n}", "block_size": block_size,
                                       "hash_algo": "sha256", "hash_seed": "vllm-none-hash"})) for n in names])
    return d


def request(tokens, rid="r1") -> EngineRequest:
    return EngineRequest(request_id=rid, prompt_token_ids=tuple(tokens), sampling=SamplingParams(max_tokens=4), tier="interactive")


def kv_router(index, decider=PDDecider(0), prefill=("p1", "p2"), decode=("d1",)) -> KVRouter:
    dirs = {("interactive", "prefill"): directory(*prefill), ("interactive", "decode"): directory(*decode, pool="decode")}
    return KVRouter(directories=dirs, index=index, weights=WEIGHTS, decider=decider, subscribe=False,
                    rng=random.Random(0))


PROMPT = list(range(40))  # 10 blocks of 4


def test_router_sends_a_prompt_to_the_prefill_worker_holding_its_prefix():
    index = MemoryPrefixIndex()
    index.apply([BlockStored("interactive-prefill-p2", tuple(BlockHasher(4).hashes(PROMPT[:24])))])
    decision = asyncio.run(kv_router(index).route(request(PROMPT), "interactive"))
    assert decision.prefill.worker.worker_id == "interactive-prefill-p2"
    assert decision.prefill.worker.replica_id == "p2"
    assert decision.reason == "prefix_hit" and decision.predicted_hit_tokens == 24
    assert decision.decode.worker.worker_id == "interactive-decode-d1" and decision.path != "local"


def test_router_without_a_hit_routes_on_load():
    router = kv_router(MemoryPrefixIndex())
    decision = asyncio.run(router.route(request(PROMPT), "interactive"))
    assert decision.reason == "load" and decision.predicted_hit_tokens == 0
    with router.dispatch(decision.prefill, "r1"):  # one in flight on the chosen replica
        again = asyncio.run(router.route(request(PROMPT, "r2"), "interactive"))
        assert again.prefill.worker.replica_id != decision.prefill.worker.replica_id


def test_dispatch_pins_the_request_to_the_chosen_replica():
    router = kv_router(MemoryPrefixIndex())
    decision = asyncio.run(router.route(request(PROMPT), "interactive"))
    prefill_dir = router._directories[("interactive", "prefill")]
    with router.dispatch(decision.prefill, "r1"):
        assert prefill_dir.take_pin("r1") == decision.prefill.worker.replica_id  # what Serve's router reads
    assert prefill_dir.take_pin("r1") is None
    assert router.workers("interactive", "prefill")[0].in_flight == 0


class BrokenIndex(MemoryPrefixIndex):
    def match(self, block_hashes):
        raise IndexUnavailable("redis is down")


def test_router_degrades_to_load_only_when_the_index_is_unavailable():
    decision = asyncio.run(kv_router(BrokenIndex()).route(request(PROMPT), "interactive"))
    assert decision.reason == "index_unavailable"
    assert decision.prefill is not None and decision.decode is not None


def test_router_with_no_known_workers_lets_serve_choose():
    decision = asyncio.run(kv_router(MemoryPrefixIndex(), prefill=(), decode=()).route(request(PROMPT), "interactive"))
    assert decision.prefill is None and decision.decode is None and decision.reason == "no_workers"
    assert decision.path != "local"


def test_replicas_without_routing_stats_yet_are_load_only_candidates():
    d = PoolDirectory()
    d.set_replicas([ReplicaInfo("new", 8, RoutingStats.from_dict({}))])
    router = KVRouter(directories={("interactive", "prefill"): d}, index=MemoryPrefixIndex(), weights=WEIGHTS,
                      decider=PDDecider(0), subscribe=False)
    [worker] = router.workers("interactive", "prefill")
    assert worker.worker_id == "interactive-prefill-new" and worker.block_size is None


def test_decider_sends_prompts_mostly_cached_on_decode_straight_to_decode():
    index = MemoryPrefixIndex()
    index.apply([BlockStored("interactive-decode-d1", tuple(BlockHasher(4).hashes(PROMPT[:36])))])
    decision = asyncio.run(kv_router(index, decider=PDDecider(8)).route(request(PROMPT), "interactive"))
    assert decision.path == "local" and decision.prefill is None
    assert decision.predicted_hit_tokens == 36
    short = asyncio.run(kv_router(MemoryPrefixIndex(), decider=PDDecider(8)).route(request(PROMPT[:6]), "interactive"))
    assert short.path == "local"


def test_baseline_pickers_ignore_scores():
    workers = [w("b"), w("a"), w("c", healthy=False)]
    turns = [pick(workers, ctx(b=10), WEIGHTS, random.Random(0), "round_robin", t).worker.worker_id for t in range(4)]
    assert turns == ["a", "b", "a", "b"]  # worker-id order, unhealthy filtered, prefix ignored
    rng = random.Random(0)
    counts = Counter(pick(workers, ctx(b=10), WEIGHTS, rng, "random").worker.worker_id for _ in range(200))
    assert set(counts) == {"a", "b"} and min(counts.values()) > 60
    router = KVRouter(directories={("interactive", "prefill"): directory("p1", "p2"),
                                   ("interactive", "decode"): directory("d1", pool="decode")},
                      index=MemoryPrefixIndex(), weights=WEIGHTS, decider=PDDecider(0), subscribe=False,
                      picker="round_robin")
    chosen = [asyncio.run(router.route(request(PROMPT, f"r{i}"), "interactive")).prefill.worker.replica_id
              for i in range(4)]
    assert chosen == ["p1", "p2", "p1", "p2"]
