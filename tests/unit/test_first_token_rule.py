"""Rule 9 of the P/D decider (router/routing/decider.py): the prefill's sampled token is reused
as the answer's first only where the handoff gap it puts after that token keeps the request
within its objectives, or where waiting for decode's first token would miss the TTFT one. As a
pure function, then through DisaggregatedBackend over fake Serve pools (tests/support/fakes.py)."""

from __future__ import annotations

import asyncio

from vllm import SamplingParams

from cluster.protocol import EngineRequest, new_token_ids
from router.pd import path as disagg
from router.routing.cost_model import EngineCostModel
from router.routing.decider import DecodeView, Objectives, PDDecider, PrefillView, RequestView, decide
from tests.support.fakes import RecordingMetric
from tests.support.pd_path import fake_pd_path

TIER = "interactive"
SLO = Objectives(ttft_s=2.0, itl_s=0.1, gap_s=0.2)
ADAPTIVE = PDDecider(mode="adaptive")
IDLE_PREFILL = PrefillView(queued_tokens=0)  # a 300-token prompt: 0.69 s with the prior


def decode_after(handoff_s: float = 0.0) -> DecodeView:
    model = EngineCostModel() if not handoff_s else EngineCostModel().observe_handoff(handoff_s)
    return DecodeView(running_seqs=2, chunk_budget_tokens=64, model=model)


def test_an_unobserved_or_short_handoff_keeps_the_reuse():
    for decode in (decode_after(0.0), decode_after(0.05)):
        d = decide(ADAPTIVE, RequestView(300, max_tokens=8), IDLE_PREFILL, decode, SLO)
        assert (d.path, d.reuse_first_token) == ("remote", True)


def test_a_handoff_gap_past_the_bound_waits_for_decodes_first_token_while_ttft_has_room():
    d = decide(ADAPTIVE, RequestView(300, max_tokens=8), IDLE_PREFILL, decode_after(0.5), SLO)
    assert (d.path, d.reason, d.reuse_first_token) == ("remote", "prefill_ok", False)
    # Waiting would miss the TTFT objective (0.69 + 1.5 s > 2 s): the first token is reused.
    d = decide(ADAPTIVE, RequestView(300, max_tokens=8), IDLE_PREFILL, decode_after(1.5), SLO)
    assert d.reuse_first_token


def test_a_gap_within_the_bound_still_costs_a_short_answer_its_mean():
    # 0.15 s after the first token: within gap_s. Spread over 7 gaps the mean holds (~0.05 s);
    # over 1 gap it is 0.15 s, past itl_s.
    assert decide(ADAPTIVE, RequestView(300, max_tokens=8), IDLE_PREFILL, decode_after(0.15), SLO).reuse_first_token
    assert not decide(ADAPTIVE, RequestView(300, max_tokens=2), IDLE_PREFILL, decode_after(0.15),
                      SLO).reuse_first_token


def test_other_modes_and_paths_keep_the_configured_reuse():
    decode = decode_after(0.5)
    assert decide(PDDecider(mode="always"), RequestView(300, max_tokens=8), IDLE_PREFILL, decode, SLO).reuse_first_token
    local = decide(ADAPTIVE, RequestView(20, max_tokens=8), IDLE_PREFILL, decode, SLO)  # hops cost more
    assert local.path == "local" and local.reuse_first_token  # no prefill hop: nothing to reuse


# -- through the backend ------------------------------------------------------------------------


def make_backend(handoff_s: float):
    backend, pools, router = fake_pd_path(ADAPTIVE, SLO)
    router._models["interactive-decode-d0"] = EngineCostModel().observe_handoff(handoff_s)
    return backend, pools


async def answer(backend) -> list[list[int]]:
    req = EngineRequest("req-0", tuple(range(300)), SamplingParams(max_tokens=8), tier=TIER)
    return [new_token_ids(o) async for o in backend.generate(req)]


def test_the_backend_takes_the_first_token_from_decode_when_the_decider_says_so(monkeypatch):
    first_token = RecordingMetric()
    monkeypatch.setattr(disagg, "FIRST_TOKEN", first_token)
    for handoff_s, reused in ((0.5, False), (0.05, True)):
        first_token.calls.clear()
        backend, pools = make_backend(handoff_s)
        chunks = asyncio.run(answer(backend))
        assert sum(len(c) for c in chunks) == 8  # the whole answer either way
        assert pools.prefill.replica_of("prefill", "req-0") == ["p0"]
        assert pools.decode.replica_of("generate", "req-0") == ["d0"]
        where = ("prefill", "") if reused else ("decode", "handoff_gap")
        assert [(lbl["path"], lbl["reason"]) for lbl, _, _ in first_token.calls] == [where]
