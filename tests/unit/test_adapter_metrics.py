"""Request metrics by LoRA adapter (router/request_metrics.py, issue 31): the label set stays the
configured names and "base", the series sit beside the per-tier ones, and a config without
adapters records exactly what it did before."""

from __future__ import annotations

import asyncio

import pytest
from vllm import SamplingParams

from cluster.protocol import Adapter, EngineRequest
from router import request_metrics
from router.request_metrics import MeasuredBackend, adapter_label, declare_series
from tests.support.fakes import FakeBackend, RecordingMetric

ADAPTERS = ("french", "german")
NAMES = ("REQUESTS", "TTFT_SECONDS", "PROMPT_TOKENS", "OUTPUT_TOKENS", "ADAPTER_REQUESTS", "ADAPTER_TTFT_SECONDS",
         "ADAPTER_PROMPT_TOKENS", "ADAPTER_OUTPUT_TOKENS")


@pytest.fixture
def recorded(monkeypatch):
    fakes = {name: RecordingMetric() for name in NAMES}
    for name, fake in fakes.items():
        monkeypatch.setattr(request_metrics, name, fake)
    return fakes


def _request(adapter=None, rid="r1") -> EngineRequest:
    return EngineRequest(rid, (5, 6, 7, 8), SamplingParams(max_tokens=3), tier="interactive", adapter=adapter)


async def _drain(backend, request):
    return [chunk async for chunk in backend.generate(request)]


def test_the_adapter_label_is_a_configured_name_or_base():
    assert adapter_label(_request(), ADAPTERS) == "base"
    assert adapter_label(_request(Adapter("french", 1, "/a/f")), ADAPTERS) == "french"
    # A name outside the config (a run-time adapter, if one ever gets past the edge) never makes
    # a series of its own.
    assert adapter_label(_request(Adapter("evil-" + "x" * 100, 9, "/tmp/x")), ADAPTERS) == "other"


def test_requests_ttft_and_tokens_are_counted_by_adapter(recorded):
    backend = MeasuredBackend(FakeBackend(), ADAPTERS)
    asyncio.run(_drain(backend, _request(Adapter("french", 1, "/a/f"))))
    asyncio.run(_drain(backend, _request(rid="r2")))
    for adapter in ("french", "base"):
        labels = {"tier": "interactive", "adapter": adapter}
        assert recorded["ADAPTER_REQUESTS"].values("inc", outcome="ok", **labels) == [1]
        assert len(recorded["ADAPTER_TTFT_SECONDS"].values("observe", **labels)) == 1
        assert recorded["ADAPTER_PROMPT_TOKENS"].values("inc", **labels) == [4]
        assert sum(recorded["ADAPTER_OUTPUT_TOKENS"].values("inc", **labels)) == 3
    assert recorded["ADAPTER_REQUESTS"].values("inc", adapter="german") == []
    # The per-tier series count both, as before.
    assert recorded["REQUESTS"].values("inc", tier="interactive", outcome="ok") == [1, 1]
    assert len(recorded["TTFT_SECONDS"].values("observe", tier="interactive")) == 2


def test_a_failed_adapter_request_counts_its_outcome_under_its_adapter(recorded):
    fake = FakeBackend()
    fake.fail_after = 1
    with pytest.raises(RuntimeError):
        asyncio.run(_drain(MeasuredBackend(fake, ADAPTERS), _request(Adapter("german", 2, "/a/g"))))
    assert recorded["ADAPTER_REQUESTS"].values("inc", tier="interactive", adapter="german", outcome="error") == [1]


def test_without_adapters_nothing_is_recorded_by_adapter(recorded):
    asyncio.run(_drain(MeasuredBackend(FakeBackend()), _request()))
    assert recorded["REQUESTS"].values("inc", outcome="ok") == [1]
    assert all(recorded[name].calls == [] for name in NAMES if name.startswith("ADAPTER_"))


def test_declared_series_cover_each_adapter_and_base_only_when_configured(recorded):
    declare_series(["interactive"], ADAPTERS)
    declared = {(labels["adapter"], labels["outcome"]) for labels, _, _ in recorded["ADAPTER_REQUESTS"].calls}
    assert {a for a, _ in declared} == {"base", "french", "german"}
    assert {o for _, o in declared} == set(request_metrics.OUTCOMES)
    recorded["ADAPTER_REQUESTS"].calls.clear()
    declare_series(["interactive"])
    assert recorded["ADAPTER_REQUESTS"].calls == []
