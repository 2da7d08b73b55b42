"""A removed prefill replica keeps its engine until the decodes have pulled its handoffs' KV
(prefill_workers/lease_drain.py), bounded by the last lease: the wait step by step on a
simulated clock, then the replica's teardown with a FakeEngine that holds its KV."""

from __future__ import annotations

import asyncio
import time

from cluster.config import EngineConfig, KVTransferConfig
from cluster.engine.base import EngineSpec
from cluster.engine.fake import FakeEngine, FakeKnobs
from cluster.protocol import EngineRequest, PrefillResult
from kv_transfer.nixl import NixlEndpoint
from prefill_workers.deployment import PrefillWorker
from prefill_workers.lease_drain import POLL_S, drain_leases


class _Clock:
    """Wall time that moves only when the drain sleeps."""

    def __init__(self, start: float = 1000.0):
        self.t = start
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


def _drain(holds, deadline: float, clock: _Clock):
    return asyncio.run(drain_leases(holds, deadline, now=clock.now, sleep=clock.sleep))


def test_no_lease_outstanding_returns_at_once_whatever_the_engine_holds():
    clock = _Clock()
    drained = _drain(lambda: True, clock.t - 1, clock)  # the last lease ended a second ago
    assert (drained.outcome, drained.waited_s, clock.sleeps) == ("none", 0.0, [])


def test_a_lease_outstanding_but_nothing_held_returns_at_once():
    clock = _Clock()
    drained = _drain(lambda: False, clock.t + 22, clock)
    assert (drained.outcome, clock.sleeps) == ("released", [])


def test_waits_while_held_and_returns_when_the_pulls_are_done():
    clock = _Clock()
    released_at = clock.t + 1.0
    drained = _drain(lambda: clock.t < released_at, clock.t + 22, clock)
    assert drained.outcome == "released"
    assert 1.0 <= drained.waited_s <= 1.0 + POLL_S
    assert all(s <= POLL_S for s in clock.sleeps)  # polled, never one long sleep past the release


def test_stops_at_the_last_lease_when_nobody_pulls():
    """A decode that never pulls (it died, it recomputed) must not hold the teardown past the
    lease: after its deadline no decode may pull those blocks."""
    clock = _Clock()
    start = clock.t
    drained = _drain(lambda: True, start + 3.0, clock)
    assert drained.outcome == "expired"
    assert clock.t == start + 3.0  # the last sleep is cut to the deadline
    assert drained.waited_s == 3.0


def _worker(knobs: FakeKnobs) -> PrefillWorker:
    spec = EngineSpec(model_path="/no-model", served_name="m", dtype="float32", max_model_len=512,
                      engine=EngineConfig(), kv_role="kv_producer", kv=KVTransferConfig(),
                      nixl=NixlEndpoint("127.0.0.1", 5000),
                      cpu_binding=None, on_gpu=False, worker_id="prefill-0")
    worker = object.__new__(PrefillWorker.func_or_class)  # the class Serve instantiates, without Serve
    worker.engine = FakeEngine(spec, knobs)
    worker.info = worker.engine.start()
    return worker


def _prefill(worker, rid: str) -> PrefillResult:
    from vllm import SamplingParams

    request = EngineRequest(rid, tuple(range(5, 69)), SamplingParams(max_tokens=8), tier="interactive")

    async def run():
        result = await worker.engine.prefill(request)
        worker.handoff(result, request)  # stamps the lease, as the replica's prefill call does
        return result

    return asyncio.run(run())


def test_teardown_shuts_the_engine_down_only_after_its_kv_is_let_go():
    """Serve awaits the async `__del__` (ray/serve/_private/replica.py call_destructor); the
    FakeEngine keeps the prefill's KV 0.5 s, as a producer's blocks wait for the pull."""
    assert asyncio.iscoroutinefunction(PrefillWorker.func_or_class.__del__)
    worker = _worker(FakeKnobs(kv_hold_s=0.5))
    _prefill(worker, "r1")
    assert worker.engine.holds_kv()
    started = time.monotonic()
    asyncio.run(worker.__del__())
    waited = time.monotonic() - started
    assert worker.engine._closed and not worker.engine.holds_kv()
    assert 0.4 <= waited < 3.0


def test_teardown_of_a_replica_that_handed_nothing_out_does_not_wait():
    worker = _worker(FakeKnobs(kv_hold_s=30))
    started = time.monotonic()
    asyncio.run(worker.__del__())
    assert worker.engine._closed and time.monotonic() - started < 0.5
