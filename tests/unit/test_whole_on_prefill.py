"""A short answer runs whole on the prefill engine (the decider's "whole" path, rule 7): the
decision as a pure function, then through DisaggregatedBackend over fake Serve pools
(tests/support/fakes.py): the one hop it takes, its fallback to decode before its first token, and
the router's queue accounting left empty."""

from __future__ import annotations

import asyncio

import pytest
from vllm import SamplingParams

from cluster.protocol import EngineRequest, new_token_ids
from router.routing.cost_model import EngineCostModel
from router.routing.decider import DecodeView, Objectives, PDDecider, PrefillView, RequestView, decide
from router.routing.service import KVRouter
from tests.support.pd_path import fake_pd_path

TIER = "interactive"
SLO = Objectives(ttft_s=1.0, itl_s=0.1, gap_s=0.2)
WHOLE = PDDecider(mode="adaptive", whole_on_prefill_max_tokens=16)


def short(max_tokens=8, prompt=300) -> RequestView:
    return RequestView(prompt_tokens=prompt, max_tokens=max_tokens)


def prefill_view(budget=64, queued=0) -> PrefillView:
    return PrefillView(queued_tokens=queued, chunk_budget_tokens=budget)


DECODE = DecodeView(running_seqs=2, chunk_budget_tokens=64)


def test_a_short_answer_that_would_go_remote_runs_whole_on_prefill():
    d = decide(WHOLE, short(), prefill_view(), DECODE, SLO)
    assert (d.path, d.reason) == ("whole", "short_output")


def test_long_or_unbounded_answers_and_the_other_modes_keep_their_paths():
    assert decide(WHOLE, short(max_tokens=17), prefill_view(), DECODE, SLO).path == "remote"
    assert decide(WHOLE, short(max_tokens=None), prefill_view(), DECODE, SLO).path == "remote"
    assert decide(PDDecider(mode="adaptive"), short(), prefill_view(), DECODE, SLO).path == "remote"  # off
    for mode, path in (("always", "remote"), ("never", "local")):
        policy = PDDecider(mode=mode, whole_on_prefill_max_tokens=16)
        assert decide(policy, short(), prefill_view(), DECODE, SLO).path == path


def test_a_prefill_engine_with_prompts_queued_takes_no_whole_request():
    # Its steps carry their chunks: the answer's every gap would be a chunk's.
    d = decide(WHOLE, short(), prefill_view(queued=10), DECODE, SLO)
    assert (d.path, d.reason) == ("remote", "prefill_ok")


def test_a_prefill_engine_whose_chunk_would_break_a_gap_takes_no_whole_request():
    # 2048 tokens a step at 2 ms each: a 4 s gap for the streams it runs.
    assert decide(WHOLE, short(), prefill_view(budget=2048), DECODE, SLO).path == "remote"


def test_a_chunk_gap_past_the_bound_still_beats_a_longer_handoff_gap():
    # A 256-token chunk at the prior's 2 ms a token: a 0.55 s gap, past gap_s (0.2 s)...
    assert decide(WHOLE, short(), prefill_view(budget=256), DECODE, SLO).path == "remote"
    # ...but shorter than the 0.6 s the handoff puts between the first token and the second.
    slow_handoff = EngineCostModel().observe_handoff(0.6)
    decode = DecodeView(running_seqs=2, chunk_budget_tokens=64, model=slow_handoff)
    assert slow_handoff.handoff_s() == pytest.approx(0.6)  # one observation: no spread yet
    assert decide(WHOLE, short(), prefill_view(budget=256), decode, SLO).path == "whole"


def test_the_handoff_gap_is_the_one_a_request_in_ten_sees():
    model = EngineCostModel()
    for seconds in [0.1, 0.3] * 20:
        model = model.observe_handoff(seconds)
    assert model.handoff.mean == pytest.approx(0.2, abs=0.01)
    assert model.handoff_s() == pytest.approx(0.2 + 1.28 * 0.1, abs=0.01)
    assert EngineCostModel().handoff_s() == 0  # never observed: no handoff gap to beat


def test_a_verdict_for_local_stays_local():
    # A short uncached prompt costs decode less than the remote hops: no reason to use prefill.
    assert decide(WHOLE, short(prompt=20), prefill_view(), DECODE, SLO).path == "local"


# -- through the backend ------------------------------------------------------------------------


def make_backend(prefill_timeout_s: float = 5.0):
    return fake_pd_path(WHOLE, SLO, prefill_timeout_s=prefill_timeout_s, prefill_chunk_budget=64)


def request(max_tokens: int = 3) -> EngineRequest:
    return EngineRequest("req-0", tuple(range(300)), SamplingParams(max_tokens=max_tokens), tier=TIER)


async def tokens_of(backend, req) -> int:
    return sum([len(new_token_ids(o)) async for o in backend.generate(req)])


def assert_no_leak(router: KVRouter) -> None:
    assert router._ledger._queued_tokens == {} and router._ledger._prompts == {} and router._ledger._pending == {}
    assert router._ledger._in_flight == {}


def test_the_whole_request_streams_from_the_prefill_replica_alone():
    backend, pools, router = make_backend()
    assert asyncio.run(tokens_of(backend, request())) == 3
    assert pools.prefill.calls == [("generate", "req-0", "p0")]
    assert pools.decode.calls == []
    assert router.cost_model("interactive-prefill-p0").prefill.observations == 1  # timed to its first token
    assert_no_leak(router)


def test_a_long_answer_takes_the_disaggregated_path():
    backend, pools, router = make_backend()
    assert asyncio.run(tokens_of(backend, request(max_tokens=40))) == 40
    assert pools.prefill.replica_of("prefill", "req-0") == ["p0"]
    assert pools.decode.replica_of("generate", "req-0") == ["d0"]
    assert router.cost_model("interactive-decode-d0").handoff.weight == 1  # the handoff's time, observed
    assert_no_leak(router)


def test_a_prefill_replica_that_fails_before_the_first_token_costs_a_recompute_on_decode():
    backend, pools, router = make_backend()
    pools.prefill.refuse = RuntimeError("replica died")
    assert asyncio.run(tokens_of(backend, request())) == 3
    assert pools.decode.replica_of("generate", "req-0") == ["d0"]
    assert router.cost_model("interactive-prefill-p0").prefill.observations == 0  # a failure is no sample
    assert_no_leak(router)


def test_a_stuck_prefill_replica_is_aborted_and_decode_answers():
    backend, pools, router = make_backend(prefill_timeout_s=0.2)
    pools.prefill.hang_decode = True  # its stream yields nothing
    assert asyncio.run(tokens_of(backend, request())) == 3
    assert pools.prefill.replica_of("abort", "req-0") == ["p0"]  # where the stuck request runs
    assert pools.decode.replica_of("generate", "req-0") == ["d0"]
    assert_no_leak(router)


def test_a_client_that_leaves_closes_the_hop_at_once():
    backend, pools, router = make_backend()

    async def leave_after_one():
        stream = backend.generate(request(max_tokens=10))
        await anext(stream)
        await stream.aclose()  # what the OpenAI layer does when the client disconnects
        await asyncio.sleep(0.05)  # the fire-and-forget abort

    asyncio.run(leave_after_one())
    assert pools.prefill.replica_of("abort", "req-0") == ["p0"]
    assert_no_leak(router)


@pytest.mark.parametrize("max_tokens", [1, 16])
def test_the_bound_is_inclusive(max_tokens):
    backend, pools, router = make_backend()
    assert asyncio.run(tokens_of(backend, request(max_tokens=max_tokens))) == max_tokens
    assert pools.prefill.calls == [("generate", "req-0", "p0")]
