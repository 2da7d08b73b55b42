"""Adaptive disaggregation on the real engines: with the prefill engines idle, long prompts go
remote; a burst that queues the prefill engines sends some requests local (prefilled on the
decode engine) and fails none; a short answer runs whole on a prefill engine.

The session cluster's gateway runs `routing.disaggregation: always` (the other tests check
the prefill hop), so, like test_faults_redis.py, these tests build the gateway's request path
in the test process (tests/support/pd_path.py): an adaptive KVRouter and a DisaggregatedBackend over
the real Serve handles of the interactive pools (real prefill, NIXL, decode). Its cost models
start from their prior and calibrate on the idle requests' hops; the decisions are recorded by
wrapping the pure `decide` the router calls, and counted by reason.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter

from vllm import SamplingParams

from cluster.protocol import EngineRequest, finish_reason, new_token_ids
from router.pd.path import DisaggregatedBackend
from router.routing.decider import Objectives, PDDecider
from tests.support.pd_path import TIER, in_process_path, prefill_idle, ready, record_verdicts


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
    verdicts = record_verdicts(monkeypatch)
    path = in_process_path(decider=PDDecider(mode="adaptive"), prefill_timeout_s=60,
                           objectives=Objectives(ttft_s=2.0, itl_s=0.5, gap_s=1.0))
    try:
        asyncio.run(scenario(path, verdicts))
    finally:
        path.router.close()


async def scenario(path, verdicts) -> None:
    rng = random.Random(time.time_ns())
    await ready(path, prefill_replicas=2)

    # Idle prefill engines: long prompts, one at a time, go remote.
    for _ in range(3):
        assert await complete(path.backend, engine_request(rng)) == "length"
    idle = [(v.path, v.reason) for v in verdicts]
    assert idle == [("remote", "prefill_ok")] * 3, idle

    await asyncio.sleep(2.5)  # decode idle again in its reported stats
    verdicts.clear()
    finishes = await asyncio.gather(*(complete(path.backend, engine_request(rng)) for _ in range(BURST)))
    assert finishes == ["length"] * BURST  # none failed, local or remote
    counts = Counter((v.path, v.reason) for v in verdicts)
    print("burst decisions:", dict(counts))
    local = {reason: n for (path, reason), n in counts.items() if path == "local"}
    assert local and set(local) <= {"prefill_queue", "local_faster"}, counts
    assert counts[("remote", "prefill_ok")] >= 2, counts  # the first ones found the prefill engines idle


def test_a_short_answer_runs_whole_on_a_real_prefill_engine(base_url, monkeypatch):
    """The decider's "whole" path on vLLM: a prefill engine (NIXL producer) runs a request with
    no KV transfer params as any engine does, and streams it to the end; decode is not used."""
    from router import path_metrics
    from tests.support.fakes import RecordingMetric

    routes = RecordingMetric()
    monkeypatch.setattr(path_metrics, "ROUTES", routes)
    verdicts = record_verdicts(monkeypatch)
    path = in_process_path(decider=PDDecider(mode="adaptive", whole_on_prefill_max_tokens=16), prefill_timeout_s=60,
                           objectives=Objectives(ttft_s=10.0, itl_s=0.5, gap_s=10.0))

    async def run() -> tuple[str, int]:
        await ready(path)
        await prefill_idle(path)  # the burst of the test before leaves a queue in the engines' stats
        finish, tokens = None, 0
        async for chunk in path.backend.generate(engine_request(random.Random(time.time_ns()))):
            finish = finish_reason(chunk) or finish
            tokens += len(new_token_ids(chunk))
        return finish, tokens

    try:
        assert asyncio.run(run()) == ("length", 4)
    finally:
        path.router.close()
    assert [(v.path, v.reason) for v in verdicts] == [("whole", "short_output")], verdicts
    assert routes.values("inc", path="prefill_only") == [1.0]
    assert routes.values("inc", path="fallback_recompute") == []
