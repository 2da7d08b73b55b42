"""Adaptive disaggregation on the real engines: with the prefill engines idle, long prompts go
remote; a burst that queues the prefill engines sends some requests local (prefilled on the
decode engine) and fails none.

The session cluster's gateway runs `routing.disaggregation: always` (the other tests check
the prefill hop), so, like test_faults_redis.py, this test builds the gateway's request path
in the test process: an adaptive KVRouter and a DisaggregatedBackend over the real Serve
handles of the interactive pools (real prefill, NIXL, decode). Its cost models start from
their prior and calibrate on the idle requests' hops; the decisions are recorded by wrapping
the pure `decide` the router calls, and counted by reason.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter

import pytest
from vllm import SamplingParams

from cluster.protocol import EngineRequest, finish_reason, new_token_ids
from cluster.types import PoolId, TierPools
from router.disagg import DisaggregatedBackend
from router.routing import service
from router.routing.decider import Objectives, PDDecider
from router.routing.directory import pool_directory
from router.routing.service import KVRouter

pytestmark = pytest.mark.integration

TIER = "interactive"
LONG = 448  # tokens: near max_model_len (512), room for the answer
BURST = 16


def engine_request(rng: random.Random) -> EngineRequest:
    prompt = tuple(rng.randrange(5, 250) for _ in range(LONG))  # fresh: nothing cached anywhere
    return EngineRequest(f"adaptive-{uuid.uuid4()}", prompt,
                         SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), tier=TIER)


async def complete(backend: DisaggregatedBackend, request: EngineRequest) -> str:
    finish = None
    async for chunk in backend.generate(request):
        finish = finish_reason(chunk) or finish
    return finish


def test_idle_long_prompts_go_remote_and_a_burst_spills_some_to_decode(base_url, monkeypatch):
    from ray import serve

    verdicts = []
    real_decide = service.decide

    def recording(*args, **kwargs):
        verdict = real_decide(*args, **kwargs)
        verdicts.append(verdict)
        return verdict

    monkeypatch.setattr(service, "decide", recording)
    dirs = {(TIER, pool): pool_directory(PoolId(TIER, pool)) for pool in ("prefill", "decode")}
    handles = TierPools(prefill=serve.get_deployment_handle(f"{TIER}-prefill", app_name="tandem"),
                        decode=serve.get_deployment_handle(f"{TIER}-decode", app_name="tandem"))
    router = KVRouter(directories=dirs, index=None, weights={"load": 1.0}, decider=PDDecider(mode="adaptive"),
                      subscribe=False, objectives={TIER: Objectives(ttft_s=2.0, itl_s=0.5, gap_s=1.0)})
    backend = DisaggregatedBackend(pools={TIER: handles}, prefill_timeout_s=60, router=router)
    try:
        asyncio.run(scenario(backend, router, handles, verdicts))
    finally:
        router.close()


async def scenario(backend, router, handles, verdicts) -> None:
    rng = random.Random(time.time_ns())
    # This process's Serve routers publish the replicas and their routing stats once in use.
    await handles.prefill.stats.remote()
    await handles.decode.stats.remote()
    deadline = time.monotonic() + 60
    while not (len(router.workers(TIER, "prefill")) == 2 and router.workers(TIER, "decode")):
        assert time.monotonic() < deadline, "the Serve routers did not publish both pools"
        await asyncio.sleep(0.25)

    # Idle prefill engines: long prompts, one at a time, go remote.
    for _ in range(3):
        assert await complete(backend, engine_request(rng)) == "length"
    idle = [(v.path, v.reason) for v in verdicts]
    assert idle == [("remote", "prefill_ok")] * 3, idle

    await asyncio.sleep(2.5)  # decode idle again in its reported stats
    verdicts.clear()
    finishes = await asyncio.gather(*(complete(backend, engine_request(rng)) for _ in range(BURST)))
    assert finishes == ["length"] * BURST  # none failed, local or remote
    counts = Counter((v.path, v.reason) for v in verdicts)
    print("burst decisions:", dict(counts))
    local = {reason: n for (path, reason), n in counts.items() if path == "local"}
    assert local and set(local) <= {"prefill_queue", "local_faster"}, counts
    assert counts[("remote", "prefill_ok")] >= 2, counts  # the first ones found the prefill engines idle


def test_a_short_answer_runs_whole_on_a_real_prefill_engine(base_url, monkeypatch):
    """The decider's "whole" path on vLLM: a prefill engine (NIXL producer) runs a request with
    no KV transfer params as any engine does, and streams it to the end; decode is not used."""
    from ray import serve

    from router import disagg
    from tests.fakes import RecordingMetric

    routes = RecordingMetric()
    monkeypatch.setattr(disagg, "ROUTES", routes)
    verdicts = []
    real_decide = service.decide

    def recording(*args, **kwargs):
        verdicts.append(real_decide(*args, **kwargs))
        return verdicts[-1]

    monkeypatch.setattr(service, "decide", recording)
    dirs = {(TIER, pool): pool_directory(PoolId(TIER, pool)) for pool in ("prefill", "decode")}
    handles = TierPools(prefill=serve.get_deployment_handle(f"{TIER}-prefill", app_name="tandem"),
                        decode=serve.get_deployment_handle(f"{TIER}-decode", app_name="tandem"))
    router = KVRouter(directories=dirs, index=None, weights={"load": 1.0}, subscribe=False,
                      decider=PDDecider(mode="adaptive", whole_on_prefill_max_tokens=16),
                      objectives={TIER: Objectives(ttft_s=10.0, itl_s=0.5, gap_s=10.0)})
    backend = DisaggregatedBackend(pools={TIER: handles}, prefill_timeout_s=60, router=router)

    async def run() -> tuple[str, int]:
        await handles.prefill.stats.remote()
        await handles.decode.stats.remote()
        deadline = time.monotonic() + 60
        while not (router.workers(TIER, "prefill") and router.workers(TIER, "decode")):
            assert time.monotonic() < deadline, "the Serve routers did not publish both pools"
            await asyncio.sleep(0.25)
        # Rule 7 wants a prefill engine with nothing queued: the test before left a burst.
        while any(info.stats.queued_prompt_tokens for info in dirs[(TIER, "prefill")].replicas()):
            assert time.monotonic() < deadline, "the prefill engines still report queued prompts"
            await asyncio.sleep(0.25)
        finish, tokens = None, 0
        async for chunk in backend.generate(engine_request(random.Random(time.time_ns()))):
            finish = finish_reason(chunk) or finish
            tokens += len(new_token_ids(chunk))
        return finish, tokens

    try:
        assert asyncio.run(run()) == ("length", 4)
    finally:
        router.close()
    assert [(v.path, v.reason) for v in verdicts] == [("whole", "short_output")], verdicts
    assert routes.values("inc", path="prefill_only") == [1.0]
    assert routes.values("inc", path="fallback_recompute") == []
