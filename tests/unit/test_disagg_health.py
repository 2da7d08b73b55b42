"""The backend's readiness: a pool whose stats call waits behind full request slots is busy,
not down (the /health flap seen in CI while the compatibility corpus loaded the cluster); a pool
whose call fails, or that Serve lists no replica for, makes the gateway not ready."""

from __future__ import annotations

import asyncio

import pytest

import router.pd.hops
from tests.unit.test_disagg_abort import make_backend


@pytest.fixture(autouse=True)
def short_timeout(monkeypatch):
    monkeypatch.setattr(router.pd.hops, "HEALTH_TIMEOUT_S", 0.05)


def test_every_pool_answering_is_ready():
    backend, _ = make_backend()
    assert asyncio.run(backend.health()) == {
        "ready": True, "pools": {"interactive-prefill": "ready", "interactive-decode": "ready"}}


def test_a_pool_slow_to_answer_with_live_replicas_is_busy_and_ready():
    backend, pools = make_backend()
    pools.decode.hang_stats = True
    answer = asyncio.run(backend.health())
    assert answer["ready"] is True
    assert answer["pools"]["interactive-decode"] == "busy"


def test_a_pool_with_no_live_replica_that_does_not_answer_is_not_ready():
    backend, pools = make_backend()
    pools.decode.hang_stats = True
    pools.decode.directory.set_replicas([])
    answer = asyncio.run(backend.health())
    assert answer == {"ready": False, "pools": {"interactive-prefill": "ready", "interactive-decode": "no answer"}}


def test_a_pool_whose_call_fails_is_down():
    backend, pools = make_backend()
    pools.prefill.stats_error = RuntimeError("replica died")
    answer = asyncio.run(backend.health())
    assert answer["ready"] is False
    assert answer["pools"]["interactive-prefill"] == "down"


def test_without_a_kv_router_a_silent_pool_is_not_ready():
    backend, pools = make_backend(routed=False)
    pools.prefill.hang_stats = True
    assert asyncio.run(backend.health())["ready"] is False
