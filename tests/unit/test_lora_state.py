"""Which adapters an engine holds (cluster/engine/lora_state.py): vLLM's vllm:lora_requests_info
gauge read from a real prometheus_client registry as vLLM's stat logger fills it, the adapter
cache's evictions counted, and what an engine replica reports to the router."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Gauge

from cluster.engine import lora_state
from cluster.engine.lora_state import LoraInfo, LoraResidency, lora_info_of, lora_report
from tests.support.fakes import RecordingMetric


def registry_with(*series: tuple[str, str, str, float]) -> CollectorRegistry:
    """A registry holding vLLM's gauge as its PrometheusStatLogger declares it (loggers.py), one
    series per (running, waiting, max_lora) label set, valued with the time it was last set."""
    registry = CollectorRegistry()
    gauge = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                  ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=registry)
    for running, waiting, max_lora, when in series:
        gauge.labels(max_lora=max_lora, waiting_lora_adapters=waiting, running_lora_adapters=running).set(when)
    return registry


def test_the_newest_series_is_the_engines_state_now():
    # vLLM never removes a label set: the old ones stay, with the time they were last current.
    registry = registry_with(("french,german", "", "2", 100.0), ("german", "dutch", "2", 105.0), ("", "", "2", 90.0))
    assert lora_info_of(registry.collect()) == LoraInfo(running=("german",), waiting=("dutch",), max_loras=2)


def test_no_gauge_means_no_information():
    assert lora_info_of(CollectorRegistry().collect()) is None
    assert lora_info_of(registry_with(("", "", "4", 1.0)).collect()) == LoraInfo((), (), 4)  # idle: none held now


@pytest.fixture
def evictions(monkeypatch):
    fake = RecordingMetric()
    monkeypatch.setattr(lora_state, "EVICTIONS", fake)
    return fake


LABELS = {"tier": "interactive", "pool": "decode", "replica": "interactive-decode-r1"}


def test_an_adapter_gone_from_the_cache_is_an_eviction(evictions):
    cache = LoraResidency({1: "french", 2: "german", 3: "dutch"}, LABELS)
    assert cache.observe([]) == frozenset() and cache.resident == frozenset()
    assert cache.observe([1, 2]) == frozenset()  # loaded: no eviction
    assert cache.observe([2, 3]) == {"french"}  # dutch loaded into a full cache of 2: french evicted
    assert cache.observe([2, 3]) == frozenset()  # unchanged: nothing counted twice
    assert cache.evictions == 1
    assert [v for v in evictions.values("inc", **LABELS) if v] == [1]  # after the series' 0


def test_the_first_look_counts_nothing_and_a_forgotten_adapter_is_no_eviction(evictions):
    cache = LoraResidency({1: "french"}, LABELS)
    cache.observe([1])  # whatever was there before the replica looked is not an eviction it saw
    cache.forget("french")  # unloaded on purpose
    assert cache.observe([]) == frozenset() and all(call[2] == 0 for call in evictions.calls)


def test_an_adapter_loaded_at_run_time_takes_a_slot_under_its_id(evictions):
    cache = LoraResidency({1: "french"}, LABELS)
    cache.observe([1, 7])
    assert cache.resident == {"french", "#7"}
    assert cache.observe([1]) == {"#7"}


def test_the_report_joins_the_cache_and_the_gauge_sorted_and_stable():
    info = LoraInfo(running=("german",), waiting=("dutch",), max_loras=2)
    assert lora_report(info, frozenset({"french", "german"}), 4) == {"loras": ("dutch", "french", "german"),
                                                                      "max_loras": 2}
    assert lora_report(None, None, 4) == {"loras": (), "max_loras": 4}  # nothing known yet: the configured bound
    assert lora_report(None, frozenset({"b", "a"}), 4) == lora_report(None, frozenset({"a", "b"}), 4)


# -- the replica's report (cluster/engine/replica.py) -------------------------------------------

def _replica(lora):
    from cluster.config import EngineConfig, KVTransferConfig
    from cluster.engine.base import EngineSpec
    from cluster.engine.fake import FakeEngine
    from cluster.engine.replica import EngineReplica

    spec = EngineSpec(model_path="/m", served_name="m", dtype="float32", max_model_len=64,
                      engine=EngineConfig(block_size=16), kv_role="kv_consumer", kv=KVTransferConfig(), nixl=None,
                      cpu_binding=None, on_gpu=False, worker_id="interactive-decode-r1", lora=lora)
    engine = FakeEngine(spec)
    replica = EngineReplica()
    replica.engine, replica.info = engine, engine.start()
    return replica, engine


def test_a_replica_without_lora_reports_as_before():
    replica, _ = _replica(None)
    stats = asyncio.run(replica.record_routing_stats())
    assert "loras" not in stats and "max_loras" not in stats


def test_a_replica_reports_the_gauge_and_its_cache_and_counts_evictions(evictions, monkeypatch):
    from cluster.engine.base import LoraLimits

    replica, engine = _replica(LoraLimits(2, 8, ("french", "german", "dutch")))
    info = {"now": LoraInfo(running=("german",), max_loras=2)}
    cache = {"ids": {1, 2}}
    monkeypatch.setattr(engine, "lora_info", lambda: info["now"], raising=False)

    async def resident():
        return set(cache["ids"])

    monkeypatch.setattr(engine, "resident_loras", resident, raising=False)
    assert replica.routing_stats()["loras"] == ("german",)  # before the cache was read: the gauge alone

    async def serve_reports():
        # As Serve calls the hook, on the replica's loop: the cache is read, then reported.
        first = await replica.record_routing_stats()
        cache["ids"] = {2, 3}  # dutch loaded, french evicted
        info["now"] = LoraInfo(running=("dutch",), max_loras=2)
        second = await replica.record_routing_stats()
        return first, second, await replica.record_routing_stats()

    first, second, third = asyncio.run(serve_reports())
    assert first["loras"] == ("french", "german")  # german running, french idle in the cache
    assert second["loras"] == third["loras"] == ("dutch", "german") and third["max_loras"] == 2
    assert [v for v in evictions.values("inc", tier="", pool="decode", replica="interactive-decode-r1") if v] == [1]


def test_serves_routing_stats_hook_is_async_so_it_runs_on_the_replicas_loop():
    """Ray Serve runs a sync user hook in a thread pool (RAY_SERVE_RUN_SYNC_IN_THREADPOOL, on by
    default in Ray 2.60): there no call into the EngineCore can be awaited, and vLLM's adapter
    cache was never read on real replicas. An async hook runs on the replica's loop."""
    import inspect

    from ray.serve._private import constants

    from cluster.engine.replica import EngineReplica
    from decode_workers.deployment import DecodeWorker
    from prefill_workers.deployment import PrefillWorker

    assert constants.REQUEST_ROUTING_STATS_METHOD == "record_routing_stats"  # the name Serve calls
    for cls in (EngineReplica, DecodeWorker.func_or_class, PrefillWorker.func_or_class):  # the deployments' classes
        assert inspect.iscoroutinefunction(cls.record_routing_stats), cls
