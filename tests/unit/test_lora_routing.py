"""Adapter-aware routing (issue 31): the lora scorer as a pure function, where a replica's adapters
come from (its routing stats and this gateway's own hops), the weight's default, and the whole
KVRouter sending an adapter's requests to the replica that holds it."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

from vllm import SamplingParams

from cluster.config import ClusterConfig
from cluster.protocol import Adapter, EngineRequest
from cluster.types import RoutingStats
from router.prefix_index import MemoryPrefixIndex
from router.routing.build import routing_weights
from router.routing.decider import PDDecider
from router.routing.directory import PoolDirectory, ReplicaInfo
from router.routing.ledger import LoadLedger
from router.routing.pipeline import LORA_DEFAULT_WEIGHT, LORA_EVICTS, LORA_HELD, LORA_ROOM, lora_score, pick
from router.routing.service import KVRouter
from router.routing.types import RouteContext, Worker
from tests.support.fakes import RecordingMetric

WEIGHTS = {"prefix": 1.0, "load": 0.5, "kv_usage": 0.1, "lora": LORA_DEFAULT_WEIGHT}


def w(name: str, loras=(), max_loras=2, **kw) -> Worker:
    return Worker(worker_id=name, replica_id=name, tier="interactive", pool="decode", capacity=4,
                  loras=frozenset(loras), max_loras=max_loras, **kw)


def ctx(adapter=None) -> RouteContext:
    return RouteContext(tier="interactive", prompt_tokens=8, adapter=adapter)


# -- the scorer, pure --------------------------------------------------------------------------

def test_an_engine_holding_the_adapter_scores_highest_then_room_then_eviction():
    assert lora_score(w("a", loras={"french"}), ctx("french")) == LORA_HELD
    assert lora_score(w("b", loras={"german"}), ctx("french")) == LORA_ROOM  # 1 of 2 slots used
    assert lora_score(w("c", loras={"german", "dutch"}), ctx("french")) == LORA_EVICTS  # full
    assert LORA_HELD > LORA_ROOM > LORA_EVICTS and 0.0 <= LORA_EVICTS and LORA_HELD <= 1.0


def test_a_full_engine_already_holding_the_adapter_is_not_penalised():
    assert lora_score(w("a", loras={"german", "french"}), ctx("french")) == LORA_HELD


def test_a_base_request_scores_every_engine_alike():
    workers = [w("a", loras={"french"}), w("b", loras={"german", "dutch"}), w("c", max_loras=None)]
    assert {lora_score(x, ctx(None)) for x in workers} == {LORA_HELD}


def test_an_engine_that_never_reported_counts_as_having_room():
    # Unknown is no worse than known-free, and better than known-full.
    assert lora_score(w("new", max_loras=None), ctx("french")) == LORA_ROOM


def test_the_picker_prefers_the_holder_but_load_still_wins_over_it():
    rng = random.Random(0)
    holder, other, full = w("a", loras={"french"}), w("b", loras={"german"}), w("c", loras={"german", "dutch"})
    for _ in range(20):  # no tie: always the holder, never the engine that would evict
        assert pick([full, other, holder], ctx("french"), WEIGHTS, rng).worker.worker_id == "a"
    assert pick([full, other], ctx("french"), WEIGHTS, rng).worker.worker_id == "b"
    # Two more requests of load on the holder (of 4 places) outweigh its adapter: affinity is a
    # tie-breaker, not a reason to queue.
    busy_holder = w("a", loras={"french"}, in_flight=2)
    assert pick([busy_holder, other], ctx("french"), WEIGHTS, rng).worker.worker_id == "b"


def test_base_requests_keep_spreading_at_random_with_the_lora_weight_on():
    rng = random.Random(1)
    workers = [w("a", loras={"french"}), w("b", loras={"german", "dutch"}), w("c")]
    counts = Counter(pick(workers, ctx(None), WEIGHTS, rng).worker.worker_id for _ in range(300))
    assert set(counts) == {"a", "b", "c"} and min(counts.values()) > 50


# -- the weight --------------------------------------------------------------------------------

def test_the_lora_weight_is_on_only_when_adapters_are_configured():
    plain = ClusterConfig.model_validate({"model": {"path": "/m"}})
    assert routing_weights(plain) == dict(plain.routing.weights)  # exactly as before the scorer
    assert "lora" not in routing_weights(plain)
    lora = ClusterConfig.model_validate({"model": {"path": "/m", "lora_adapters": {"french": "/a/french"}}})
    assert routing_weights(lora) == {**lora.routing.weights, "lora": LORA_DEFAULT_WEIGHT}


# -- where a replica's adapters come from ------------------------------------------------------

def test_routing_stats_carry_the_engines_adapters_and_stay_out_without_lora():
    stats = RoutingStats(worker_id="w", loras=("french", "german"), max_loras=2)
    back = RoutingStats.from_dict(stats.to_dict())
    assert back.loras == ("french", "german") and back.max_loras == 2
    assert RoutingStats.from_dict({"loras": ["x"], "max_loras": "4"}).max_loras == 4  # parsed once
    assert "loras" not in RoutingStats(worker_id="w").to_dict()  # no LoRA: the same report as before


def test_the_ledger_holds_an_adapter_while_a_hop_with_it_is_on_the_replica():
    ledger = LoadLedger(clock=lambda: 0.0, timer=lambda: 0.0)
    a = w("a")
    ledger.start("r1", a, "french")
    ledger.start("r2", a, "french")
    ledger.start("r3", a, None)  # a base request holds no adapter
    assert ledger.adapters("a") == {"french"}
    ledger.end(a, "french")
    assert ledger.adapters("a") == {"french"}  # r2 still runs with it
    ledger.end(a, "french")
    ledger.end(a, None)
    assert ledger.adapters("a") == frozenset() and ledger.leftovers() == {}


def request(rid: str, adapter=None) -> EngineRequest:
    return EngineRequest(request_id=rid, prompt_token_ids=tuple(range(6)), sampling=SamplingParams(max_tokens=4),
                         tier="interactive", adapter=adapter)


def decode_router(reports: dict[str, dict], picker: str = "max_score") -> KVRouter:
    d = PoolDirectory()
    d.set_replicas([ReplicaInfo(n, 8, RoutingStats.from_dict({"worker_id": f"interactive-decode-{n}", **r}))
                    for n, r in reports.items()])
    return KVRouter(directories={("interactive", "decode"): d}, index=MemoryPrefixIndex(), weights=WEIGHTS,
                    decider=PDDecider(0, "never"), subscribe=False, rng=random.Random(0), picker=picker)


FRENCH, GERMAN = Adapter("french", 1, "/a/french"), Adapter("german", 2, "/a/german")


def test_the_router_sends_an_adapters_request_to_the_replica_that_reported_it():
    router = decode_router({"d1": {"loras": ["german"], "max_loras": 1}, "d2": {"loras": ["french"], "max_loras": 1}})
    for i in range(10):
        decision = asyncio.run(router.route(request(f"f{i}", FRENCH), "interactive"))
        assert decision.decode.worker.replica_id == "d2" and decision.decode.scores["lora"] == LORA_HELD
        decision = asyncio.run(router.route(request(f"g{i}", GERMAN), "interactive"))
        assert decision.decode.worker.replica_id == "d1"


def test_a_hop_in_flight_makes_its_replica_hold_the_adapter_before_any_report():
    router = decode_router({"d1": {"max_loras": 1}, "d2": {"max_loras": 1}})  # nothing loaded yet
    first = asyncio.run(router.route(request("f0", FRENCH), "interactive"))
    with router.dispatch(first.decode, "f0", streams=True, adapter="french"):
        chosen = first.decode.worker.replica_id
        # The holder has one hop in flight (load score 7/8 vs 1: -0.0625 weighted) but holds
        # french (1.0 vs 0.5 for room: +0.15 weighted): it wins.
        again = asyncio.run(router.route(request("f1", FRENCH), "interactive"))
        assert again.decode.worker.replica_id == chosen
        # A german request avoids it: there it would evict french (max_loras 1).
        other = asyncio.run(router.route(request("g0", GERMAN), "interactive"))
        assert other.decode.worker.replica_id != chosen and other.decode.scores["lora"] == LORA_ROOM
    assert all(not x.loras for x in router.workers("interactive", "decode"))  # released with the hop


def test_a_yaml_lora_weight_wins_even_zero():
    cfg = ClusterConfig.model_validate({"model": {"path": "/m", "lora_adapters": {"french": "/a/french"}},
                                        "routing": {"weights": {"prefix": 1.0, "lora": 0.0}}})
    assert routing_weights(cfg) == {"prefix": 1.0, "lora": 0.0}  # switched off on purpose



def test_each_lora_request_is_counted_by_the_affinity_of_the_engine_it_was_sent_to(monkeypatch):
    from router.routing import metrics

    routes = RecordingMetric()
    monkeypatch.setattr(metrics, "LORA_ROUTES", routes)
    reports = {"d1": {"loras": ["german"], "max_loras": 1}, "d2": {"loras": ["french"], "max_loras": 1}}
    asyncio.run(decode_router(reports).route(request("f0", FRENCH), "interactive"))  # to d2, which holds it
    asyncio.run(decode_router(reports).route(request("b0"), "interactive"))  # the base model: no LoRA route
    rr = decode_router(reports, picker="round_robin")
    for i in range(2):  # round-robin ignores the adapter: one of the two picks evicts german for french
        asyncio.run(rr.route(request(f"r{i}", FRENCH), "interactive"))
    counted = [(labels["pool"], labels["affinity"]) for labels, kind, _ in routes.calls if kind == "inc"]
    assert sorted(counted) == [("decode", "evicts"), ("decode", "held"), ("decode", "held")]


def test_the_routes_are_exported_at_zero_per_tier_pool_and_affinity_only_with_adapters(monkeypatch):
    from router.routing import build

    routes = RecordingMetric()
    monkeypatch.setattr(build, "LORA_ROUTES", routes)
    monkeypatch.setattr(build, "make_index", lambda *a, **k: MemoryPrefixIndex())
    build.build_kv_router(ClusterConfig.model_validate({"model": {"path": "/m"}}))
    assert routes.calls == []
    build.build_kv_router(ClusterConfig.model_validate({"model": {"path": "/m", "lora_adapters": {"french": "/a/f"}}}))
    assert {(lbl["pool"], lbl["affinity"]) for lbl, kind, v in routes.calls if kind == "inc" and v == 0} == {
        (pool, a) for pool in ("prefill", "decode") for a in ("held", "free_slot", "evicts")}
