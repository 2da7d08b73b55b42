"""tandem's metrics: the Ray-metrics facade, the engine exporter and the per-request metrics."""

from __future__ import annotations

import asyncio

import pytest
from vllm import SamplingParams

from cluster.engine import metrics as engine_metrics
from cluster.engine.metrics import EngineMetricsExporter
from cluster import metrics
from cluster.metrics import Counter, Gauge, Histogram
from cluster.protocol import EngineRequest, finish_reason
from router import request_metrics
from router.openai.errors import too_many_requests
from router.request_metrics import MeasuredBackend, outcome_of, route_label
from tests.support.fakes import FakeBackend, RecordingMetric, RecordingRayGauge


def test_labels_must_match_the_declared_names():
    counter = Counter("tandem_unit_counter", "doc", ["tier", "pool"])
    counter.labels(tier="a", pool="b").inc()  # outside Ray: recorded nowhere, but checked
    counter.labels("a", "b").inc(2)
    with pytest.raises(ValueError, match="expected labels"):
        counter.labels(tier="a").inc()
    with pytest.raises(ValueError, match="expected labels"):
        counter.labels("a").inc()
    Histogram("tandem_unit_histogram", "doc", ["tier"]).labels(tier="a").observe(0.1)


def test_gauge_inc_and_dec_keep_the_value_per_label_set():
    gauge = Gauge("tandem_unit_gauge", "doc", ["tier"])
    a, b = gauge.labels(tier="a"), gauge.labels(tier="b")
    a.inc()
    a.inc()
    b.inc()
    gauge.labels(tier="a").dec()  # a new bound object, the same series
    assert gauge._values == {(("tier", "a"),): 1.0, (("tier", "b"),): 1.0}


def test_gauges_are_recorded_again_so_a_still_value_does_not_age_out_of_ray():
    """Ray drops a gauge series not recorded within two report intervals: a queue that sits
    at 0 would vanish. The first value of a gauge puts it under the keeper, which records
    every label set's current value again."""
    gauge = Gauge("tandem_unit_kept_gauge", "doc", ["tier"])
    gauge._metric = ray = RecordingRayGauge()
    assert gauge not in metrics._KEEPER._gauges
    gauge.labels(tier="a").inc()
    gauge.labels(tier="b").set(5)
    gauge.labels(tier="a").dec()
    assert metrics._KEEPER._gauges.count(gauge) == 1 and metrics._KEEPER._thread.is_alive()
    ray.sets.clear()
    gauge.republish()
    assert sorted(ray.sets, key=lambda s: s[1]["tier"]) == [(0.0, {"tier": "a"}), (5.0, {"tier": "b"})]


def test_engine_exporter_sends_the_exact_histogram_sums_as_counter_increments(monkeypatch):
    recorded = {name: RecordingMetric() for name in engine_metrics.COUNTERS}
    monkeypatch.setattr(engine_metrics, "_COUNTER_METRICS", recorded)
    readings = iter([
        {("vllm:nixl_bytes_transferred_sum", None): 4096, ("vllm:iteration_tokens_total_sum", None): 100,
         ("vllm:nixl_xfer_time_seconds_sum", None): 0.5, ("vllm:num_requests_running", None): 3},
        {("vllm:nixl_bytes_transferred_sum", None): 6144, ("vllm:iteration_tokens_total_sum", None): 160,
         ("vllm:nixl_xfer_time_seconds_sum", None): 0.5},
    ])
    exporter = EngineMetricsExporter("interactive", "decode", "interactive-decode-r1", lambda: next(readings))
    first, second = exporter.export_once(), exporter.export_once()
    assert first["tandem_engine_kv_transfer_bytes"] == 4096 and second["tandem_engine_kv_transfer_bytes"] == 2048
    assert first["tandem_engine_scheduled_tokens"] == 100 and second["tandem_engine_scheduled_tokens"] == 60
    assert second["tandem_engine_kv_transfer_seconds"] == 0  # no change: no increment
    labels = {"tier": "interactive", "pool": "decode", "replica": "interactive-decode-r1"}
    assert recorded["tandem_engine_kv_transfer_bytes"].values("inc", **labels) == [4096, 2048]
    # Gauges and plain counters go out under vLLM's names (vllm_ray_metrics.py), not here.
    assert set(first) == set(engine_metrics.COUNTERS) == {
        "tandem_engine_scheduled_tokens", "tandem_engine_kv_transfer_bytes", "tandem_engine_kv_transfer_seconds"}


def test_outcome_labels():
    assert outcome_of(None, "stop") == outcome_of(None, "length") == "ok"
    assert outcome_of(None, "error") == outcome_of(None, None) == "error"
    assert outcome_of(too_many_requests("busy"), None) == "rejected_429"
    assert outcome_of(asyncio.CancelledError(), None) == "cancelled"
    assert outcome_of(GeneratorExit(), "stop") == "ok"  # closed by the edge right after the last chunk
    assert outcome_of(RuntimeError("boom"), None) == "error"


def test_route_label_bounds_the_path_cardinality():
    assert route_label("/v1/chat/completions") == "/v1/chat/completions"
    assert route_label("/v1/models/tandem-test") == "/v1/models"
    assert route_label("/wp-admin/../../etc/passwd") == "other"


@pytest.fixture
def recorded(monkeypatch):
    names = ("REQUESTS", "TTFT_SECONDS", "ITL_SECONDS", "E2E_SECONDS", "PROMPT_TOKENS", "OUTPUT_TOKENS")
    fakes = {name: RecordingMetric() for name in names}
    for name, fake in fakes.items():
        monkeypatch.setattr(request_metrics, name, fake)
    return fakes


def _request(max_tokens: int, tier="interactive") -> EngineRequest:
    return EngineRequest("r1", (5, 6, 7, 8), SamplingParams(max_tokens=max_tokens), tier=tier)


async def _drain(backend, request):
    return [chunk async for chunk in backend.generate(request)]


def test_measured_backend_records_ttft_itl_e2e_and_tokens(recorded):
    backend = MeasuredBackend(FakeBackend())
    chunks = asyncio.run(_drain(backend, _request(3)))
    assert len(chunks) == 3
    assert len(recorded["TTFT_SECONDS"].values("observe", tier="interactive")) == 1
    assert len(recorded["ITL_SECONDS"].values("observe", tier="interactive")) == 2  # gaps between 3 tokens
    assert len(recorded["E2E_SECONDS"].values("observe", tier="interactive")) == 1
    assert recorded["OUTPUT_TOKENS"].values("inc", tier="interactive") == [1, 1, 1]
    assert recorded["PROMPT_TOKENS"].values("inc", tier="interactive") == [4]
    assert recorded["REQUESTS"].values("inc", tier="interactive", outcome="ok") == [1]


def test_a_stream_closed_after_its_last_chunk_counts_as_ok(recorded):
    backend = MeasuredBackend(FakeBackend())

    async def like_the_edge():  # router/openai/app.py breaks out at the finish reason
        stream = backend.generate(_request(2))
        async for chunk in stream:
            if finish_reason(chunk) is not None:
                break
        await stream.aclose()

    asyncio.run(like_the_edge())
    assert recorded["REQUESTS"].values("inc", tier="interactive", outcome="ok") == [1]
    assert len(recorded["E2E_SECONDS"].values("observe", tier="interactive")) == 1


def test_measured_backend_counts_failures_and_cancellations_without_e2e(recorded):
    fake = FakeBackend()
    fake.fail_after = 1
    backend = MeasuredBackend(fake)
    with pytest.raises(RuntimeError):
        asyncio.run(_drain(backend, _request(3, tier="batch")))
    assert recorded["REQUESTS"].values("inc", tier="batch", outcome="error") == [1]

    async def leave_early():
        stream = backend.generate(_request(3))
        await stream.__anext__()
        await stream.aclose()  # the client went away

    fake.fail_after = None
    asyncio.run(leave_early())
    assert recorded["REQUESTS"].values("inc", tier="interactive", outcome="cancelled") == [1]
    assert recorded["E2E_SECONDS"].calls == []
