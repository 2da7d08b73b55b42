"""Admission control per tier (router/admission.py): bounded queues, 429 with Retry-After,
and tiers that never share places. Real edge, fake engine side."""

from __future__ import annotations

import asyncio

import pytest
from vllm import SamplingParams

from cluster.config import AdmissionConfig
from cluster.protocol import EngineRequest
from router.admission import AdmissionControl, TierGate
from router.concurrency_limit import AdaptiveLimit
from router.openai.errors import OpenAIError
from tests.conftest import REPO
from tests.support.fakes import FakeBackend

LIMITS = {"interactive": AdmissionConfig(max_running=2, max_queued=1, queue_timeout_s=5, retry_after_s=3),
          "batch": AdmissionConfig(max_running=1, max_queued=1, queue_timeout_s=5, retry_after_s=7)}


def request(tier="interactive", rid="r"):
    return EngineRequest(rid, (1, 2, 3), SamplingParams(max_tokens=3), tier=tier)


async def start(admission, req):
    """Start a request's stream and wait until it has a place (its first chunk) or fails."""
    it = admission.generate(req)
    return it, await anext(it)


def test_gate_is_fifo_and_hands_places_on():
    async def main():
        gate = TierGate("t", AdmissionConfig(max_running=1, max_queued=2, queue_timeout_s=5, retry_after_s=1))
        await gate.enter()
        order = []

        async def wait(name):
            await gate.enter()
            order.append(name)

        a, b = asyncio.create_task(wait("a")), asyncio.create_task(wait("b"))
        await asyncio.sleep(0)
        assert gate.queued == 2
        with pytest.raises(OpenAIError) as exc:
            await gate.enter()
        assert exc.value.status == 429 and exc.value.headers["Retry-After"] == "1"
        gate.leave()
        await a
        gate.leave()
        await b
        assert order == ["a", "b"] and gate.running == 1
        gate.leave()
        assert gate.running == 0

    asyncio.run(main())


def test_queue_timeout_and_cancelled_waiters_leave_no_trace():
    async def main():
        gate = TierGate("t", AdmissionConfig(max_running=1, max_queued=5, queue_timeout_s=0.05, retry_after_s=2))
        await gate.enter()
        with pytest.raises(OpenAIError) as exc:
            await gate.enter()
        assert exc.value.status == 429 and "did not move" in exc.value.message
        waiter = asyncio.create_task(gate.enter())
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert gate.queued == 0
        gate.leave()
        assert gate.running == 0

    asyncio.run(main())


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_expected_wait_past_the_bound_is_refused_on_arrival_and_follows_the_rate():
    """Places free up at 2/s: the 2nd in line waits ~1 s, the 3rd ~1.5 s (bound 1.2 s → 429
    'expected_wait'). With under two departures in the window there is nothing to go on:
    only max_queued applies. A faster rate later admits more again; a stall reads as slow."""
    async def main():
        clock = FakeClock()
        gate = TierGate("t", AdmissionConfig(max_running=1, max_queued=10, queue_timeout_s=60, retry_after_s=1,
                                             max_queue_wait_s=1.2), clock=clock)
        await gate.enter()
        assert gate.expected_wait_s(1) is None
        waiters = [asyncio.create_task(gate.enter()) for _ in range(4)]  # no history: all queue
        await asyncio.sleep(0)
        assert gate.queued == 4
        for _ in range(4):  # 4 places freed over 2 s: 2/s
            clock.now += 0.5
            gate.leave()
        await asyncio.gather(*waiters)
        assert gate.expected_wait_s(2) == pytest.approx(1.0) and gate.expected_wait_s(3) == pytest.approx(1.5)
        queued = [asyncio.create_task(gate.enter()) for _ in range(2)]  # positions 1 and 2: 0.5 s, 1 s
        await asyncio.sleep(0)
        assert gate.queued == 2
        with pytest.raises(OpenAIError) as exc:  # position 3: 1.5 s > 1.2 s
            await gate.enter()
        assert exc.value.status == 429 and "about 1.5 s" in exc.value.message and exc.value.headers["Retry-After"] == "1"
        clock.now += 10  # the window forgets; nothing to go on again
        assert gate.expected_wait_s(3) is None
        queued += [asyncio.create_task(gate.enter()) for _ in range(8)]  # so they queue: 10 in line
        await asyncio.sleep(0)
        assert gate.queued == 10
        for _ in range(10):  # 10 places handed on in 1 s
            clock.now += 0.1
            gate.leave()
        await asyncio.gather(*queued)
        assert gate.expected_wait_s(11) == pytest.approx(1.1)
        clock.now += 1  # nothing freed for 1 s: the rate halves
        assert gate.expected_wait_s(11) == pytest.approx(2.2)
        clock.now += 10
        gate.leave()
        assert (gate.running, gate.queued) == (0, 0)
        assert list(gate._freed) == [clock.now]  # leak check: only the window is kept

    asyncio.run(main())


def test_without_a_wait_bound_only_the_queue_length_refuses():
    """The default: however slow places free up (2 in 6 s), the line fills up to max_queued."""
    async def main():
        clock = FakeClock()
        gate = TierGate("t", AdmissionConfig(max_running=1, max_queued=3, queue_timeout_s=60, retry_after_s=1), clock=clock)
        await gate.enter()
        for _ in range(2):
            clock.now += 1
            gate.leave()
            await gate.enter()
        clock.now += 4
        waiters = [asyncio.create_task(gate.enter()) for _ in range(3)]
        await asyncio.sleep(0)
        assert gate.queued == 3 and gate.expected_wait_s(3) is None  # no bound: the rate is not kept
        with pytest.raises(OpenAIError) as exc:
            await gate.enter()
        assert "3 queued" in exc.value.message
        for _ in range(4):
            gate.leave()
        await asyncio.gather(*waiters)
        assert (gate.running, gate.queued) == (0, 0)

    assert AdmissionConfig().max_queue_wait_s is None
    asyncio.run(main())


def test_adaptive_limit_cuts_once_per_round_and_grows_only_when_in_use():
    """AIMD on time to first token (router/concurrency_limit.py), step by step."""
    clock = FakeClock()
    limit = AdaptiveLimit(target_s=1.0, floor=2, ceiling=8, clock=clock)
    assert limit.limit == 8
    admitted = clock.now
    clock.now += 1.5
    limit.observe(1.5, admitted, running=8)  # slow: 8 * 0.75
    assert limit.limit == 6
    limit.observe(1.6, admitted, running=8)  # admitted before that cut: same round, no new cut
    assert limit.limit == 6
    limit.observe(1.2, clock.now, running=6)  # admitted after it: a new round
    assert limit.limit == 4
    limit.observe(0.5, clock.now, running=3)  # fast, but the limit is not in use: stays
    assert limit.limit == 4
    limit.observe(0.5, clock.now, running=4)  # fast and full: +1
    assert limit.limit == 5
    for _ in range(5):
        clock.now += 1
        limit.observe(3.0, clock.now, running=5)
    assert limit.limit == 2  # the floor
    for _ in range(20):
        limit.observe(0.1, clock.now, running=limit.limit)
    assert limit.limit == 8  # the ceiling
    with pytest.raises(ValueError):
        AdaptiveLimit(1.0, floor=3, ceiling=2, clock=clock)


def test_gate_with_a_ttft_target_admits_fewer_when_slow_and_more_when_fast():
    """Slow first tokens shrink the places (4 → 3 → 2): later arrivals queue, and a leaving
    request frees no place while over the limit. Fast ones grow it back, admitting waiters."""
    async def main():
        clock = FakeClock()
        config = AdmissionConfig(max_running=4, min_running=2, max_queued=10, queue_timeout_s=60, target_ttft_s=1.0)
        gate = TierGate("t", config, clock=clock)
        for _ in range(4):
            await gate.enter()
        admitted = clock.now
        clock.now += 2
        gate.first_token(admitted)  # 2 s > 1 s: 4 * 0.75 = 3
        assert gate.limit == 3
        waiters = [asyncio.create_task(gate.enter()) for _ in range(3)]
        await asyncio.sleep(0)
        assert (gate.running, gate.queued) == (4, 3)
        gate.leave()  # 3 running, limit 3: nobody moves up
        await asyncio.sleep(0)
        assert (gate.running, gate.queued) == (3, 3)
        clock.now += 1.5  # a request admitted after the cut reports 1.5 s: a new round, 3 * 0.75 → 2
        gate.first_token(clock.now - 1.5)
        assert gate.limit == 2
        gate.leave()
        assert (gate.running, gate.queued) == (2, 3)
        gate.first_token(clock.now - 0.2)  # fast while full: 3 places, one waiter moves up
        await asyncio.sleep(0)
        assert (gate.running, gate.queued, gate.limit) == (3, 2, 3)
        for _ in range(2):  # up to the ceiling, 4: one more moves up
            gate.first_token(clock.now - 0.2)
        assert (gate.running, gate.queued, gate.limit) == (4, 1, 4)
        gate.leave()  # the last waiter takes the freed place
        await asyncio.gather(*waiters)
        assert (gate.running, gate.queued) == (4, 0)
        while gate.running:
            gate.leave()
        assert (gate.running, gate.queued) == (0, 0)

    asyncio.run(main())


def test_the_default_config_sheds_on_nothing_but_its_bounds_and_says_so():
    """Issue 28: as `vllm serve`, the default tiers queue what they cannot start; a 429 is for a
    full queue (or a tenant's limit), never for a predicted lateness."""
    from cluster.config import ClusterConfig

    cfg = ClusterConfig.load(REPO / "cluster" / "configs" / "local.yaml")
    for tier, t in cfg.tiers.items():
        assert (t.admission.max_queue_wait_s, t.admission.target_ttft_s) == (None, None), tier
        assert t.admission.summary().endswith("; no SLO shedding"), t.admission.summary()
    # Nor for a decode engine's queue: no first-token deadline on the decode hop (a 120 s one
    # refused 2 of vLLM's benchmark's 64 requests at concurrency 32 on the 2-core VM).
    assert cfg.gateway.decode_first_token_timeout_s is None
    shedding = AdmissionConfig(max_running=8, max_queue_wait_s=0.5, target_ttft_s=1, min_running=2).summary()
    assert "over 0.5 s" in shedding and "(2..8) to a 1 s TTFT" in shedding


def test_min_running_over_max_running_is_refused_at_the_edge():
    with pytest.raises(ValueError, match="min_running"):
        AdmissionConfig(max_running=2, min_running=3)


def test_batch_load_never_degrades_interactive_admission():
    async def main():
        backend = FakeBackend()
        backend.hang_after = 1  # every stream holds its place until closed
        admission = AdmissionControl(backend, LIMITS)
        held = [await start(admission, request("batch", "b0"))]
        queued = asyncio.create_task(start(admission, request("batch", "b1")))
        await asyncio.sleep(0)
        with pytest.raises(OpenAIError) as exc:  # batch: 1 running + 1 queued → full
            await start(admission, request("batch", "b2"))
        assert exc.value.status == 429 and exc.value.headers["Retry-After"] == "7"
        # interactive still gets both of its places at once, no queueing behind batch
        for i in range(2):
            held.append(await asyncio.wait_for(start(admission, request("interactive", f"i{i}")), 1))
        assert admission.gates["interactive"].running == 2 and admission.gates["batch"].queued == 1
        # closing the batch stream hands its place to the queued batch request
        await held[0][0].aclose()
        held.append(await asyncio.wait_for(queued, 1))
        for it, _ in held[1:]:
            await it.aclose()
        assert {t: (g.running, g.queued) for t, g in admission.gates.items()} == {"interactive": (0, 0), "batch": (0, 0)}
        assert (await admission.health())["admission"]["batch"] == {
            "running": 0, "queued": 0, "limit": 1, "max_queued": 1, "max_queue_wait_s": None, "target_ttft_s": None}

    asyncio.run(main())


# -- over HTTP: the real edge (build_openai_app, tests/support/openai_helpers.py). Its imports stay
# in here so the tests above do not depend on the edge's test helpers.


def test_over_the_bound_is_429_with_retry_after_over_http():
    from tests.support.openai_helpers import MODEL, assert_openai_error, make_client

    backend = FakeBackend()
    admission = AdmissionControl(backend, {"interactive": AdmissionConfig(max_running=1, max_queued=0,
                                                                          retry_after_s=4)})
    client = make_client(admission)[0]
    gate = admission.gates["interactive"]
    gate.running = 1  # a request in the pools takes the only place
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 3}
    for stream in (False, True):
        r = client.post("/v1/completions", json={**body, "stream": stream})
        assert_openai_error(r, 429, code="rate_limit_exceeded", type_="rate_limit_error", contains="interactive")
        assert r.headers["Retry-After"] == "4"
    gate.running = 0
    assert client.post("/v1/completions", json=body).status_code == 200
    assert gate.running == 0  # released after the answer
