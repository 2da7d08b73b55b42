"""Replay of a trace through the pure cost models and decider.

tests/unit/data/pd_decider_trace.json is simulated, not recorded (its "source" says how): one
prefill and one decode engine on a 2-core machine with known costs ("truth"), an idle warm-up,
a 70/30 mix, a burst of long prompts that saturates the prefill engine, and multi-turn prompts
mostly cached on decode. Its events are what the gateway sees: prefill hops that queued behind
nothing (tokens, seconds), the decode engine's step reports, and requests with the live state at
their arrival and the decision the decider made. Replaying must calibrate the models to the
truth, reproduce every decision and reason, and keep the decider's promises on the way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.routing.cost_model import EngineCostModel
from router.routing.decider import DecodeView, Objectives, PDDecider, PrefillView, RequestView, decide

TRACE = Path(__file__).parent / "data" / "pd_decider_trace.json"


@pytest.fixture(scope="module")
def trace():
    return json.loads(TRACE.read_text())


def replay(trace):
    """[(request event, Decision)] and the two calibrated models at the end."""
    policy = PDDecider(**trace["policy"])
    slo = Objectives(**trace["objectives"])
    prefill, decode = EngineCostModel(), EngineCostModel()
    out = []
    for e in trace["events"]:
        if e["kind"] == "prefill_hop":
            prefill = prefill.observe_prefill(e["tokens"], e["seconds"])
        elif e["kind"] == "step_report":
            decode = decode.observe_step(e["running_seqs"], e["step_s"])
        else:
            req = RequestView(e["prompt_tokens"], e["cached_on_decode"], e["cached_on_prefill"])
            out.append((e, decide(policy, req, PrefillView(e["prefill_queued_tokens"], prefill),
                                  DecodeView(e["decode_running_seqs"], trace["chunk_budget_tokens"], decode), slo)))
    return out, prefill, decode


def test_replay_reproduces_every_recorded_decision(trace):
    decisions, _, _ = replay(trace)
    assert [(d.path, d.reason) for _, d in decisions] == [(e["decision"]["path"], e["decision"]["reason"])
                                                          for e, _ in decisions]


def test_the_models_calibrate_to_the_machine(trace):
    _, prefill, decode = replay(trace)
    truth = trace["truth"]
    a, b = prefill.prefill.coefficients()
    assert b == pytest.approx(truth["prefill_b_s"], rel=0.1)  # the prior's 2 ms/token moved to the machine's
    assert a == pytest.approx(truth["prefill_a_s"], abs=0.03)
    c, d = decode.step.coefficients()
    assert c == pytest.approx(truth["step_c_s"], abs=0.005)
    assert d == pytest.approx(truth["step_d_s"], abs=0.0005)


def test_local_prefill_never_breaks_the_running_streams_gap(trace):
    decisions, _, _ = replay(trace)
    gap = trace["objectives"]["gap_s"]
    local = [(e, d) for e, d in decisions if d.path == "local"]
    assert local
    assert all(e["decode_running_seqs"] == 0 or d.gap_local_s <= gap for e, d in local)


def test_the_burst_sends_some_prompts_local_and_idle_long_prompts_go_remote(trace):
    decisions, _, _ = replay(trace)
    burst = [d for e, d in decisions if e["prompt_tokens"] == 1024]
    assert any(d.path == "local" for d in burst) and any(d.path == "remote" for d in burst)
    # A queued 512-token prompt that an idle prefill engine would serve in time: blamed on the queue.
    assert any(d.reason == "prefill_queue" and e["prefill_queued_tokens"] > 0 for e, d in decisions)
    idle_long = [d for e, d in decisions
                 if e["prefill_queued_tokens"] == 0 and e["prompt_tokens"] - e["cached_on_decode"] >= 512]
    assert idle_long and all(d.path == "remote" for d in idle_long)
    cached = [d for e, d in decisions if e["prompt_tokens"] - e["cached_on_decode"] <= 32]
    assert cached and all((d.path, d.reason) == ("local", "short_uncached") for d in cached)


def test_every_reason_is_one_of_the_documented_labels(trace):
    decisions, _, _ = replay(trace)
    documented = {"short_uncached", "prefill_ok", "prefill_queue", "local_faster", "decode_itl_budget", "decode_gap_budget",
                  "overloaded"}
    assert {d.reason for _, d in decisions} <= documented
