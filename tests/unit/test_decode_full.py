"""Rule 8 of the P/D decider (router/routing/decider.py): with the decode engine at its mean-ITL
bound, a request that would prefill remotely runs whole on the prefill engine while that engine
has room for a stream; the prefill engine's step model is fitted from the streams it runs."""

from __future__ import annotations

import asyncio
import random

import pytest
from vllm import SamplingParams

from cluster.config import ClusterConfig, RoutingConfig
from cluster.protocol import EngineRequest
from cluster.types import RoutingStats
from router.routing.build import build_kv_router
from router.routing.cost_model import STEP_PRIOR, EngineCostModel
from router.routing.decider import DecodeView, Objectives, PDDecider, PrefillView, RequestView, decide
from router.routing.directory import PoolDirectory, ReplicaInfo
from router.routing.service import KVRouter

SLO = Objectives(ttft_s=1.0, itl_s=0.1, gap_s=0.2)
BALANCING = PDDecider(mode="adaptive", whole_when_decode_full=True)
ANSWER = RequestView(prompt_tokens=64, max_tokens=128)  # a decode-heavy request


def full_decode(running=70) -> DecodeView:
    # The prior step: 35 ms + 1 ms per sequence; at 71 sequences 106 ms, past the 100 ms ITL.
    return DecodeView(running_seqs=running, chunk_budget_tokens=24)


def test_a_decode_engine_at_its_bound_sends_the_stream_whole_to_a_prefill_engine_with_room():
    d = decide(BALANCING, ANSWER, PrefillView(queued_tokens=0), full_decode(), SLO)
    assert (d.path, d.reason) == ("whole", "decode_full")
    # Without the rule: remote, and the reason says the decode engine's step is why not local.
    off = decide(PDDecider(mode="adaptive"), ANSWER, PrefillView(queued_tokens=0), full_decode(), SLO)
    assert (off.path, off.reason) == ("remote", "prefill_ok")
    queued = PrefillView(queued_tokens=1000)  # remote misses ttft_s; local refused on the decode step
    assert decide(PDDecider(mode="adaptive"), ANSWER, queued, full_decode(), SLO).reason == "decode_itl_budget"


def test_a_decode_engine_below_its_bound_keeps_its_streams():
    d = decide(BALANCING, ANSWER, PrefillView(queued_tokens=0), full_decode(running=60), SLO)
    assert (d.path, d.reason) == ("remote", "prefill_ok")
    assert decide(BALANCING, ANSWER, PrefillView(queued_tokens=0), full_decode(running=0), SLO).path != "whole"


def test_a_prefill_engine_without_room_keeps_the_request_remote():
    slow_streams = EngineCostModel(step=STEP_PRIOR.observe(2, 0.15).observe(2, 0.15).observe(2, 0.15))
    cases = {
        "its streams already past itl_s": PrefillView(queued_tokens=0, model=slow_streams, running_seqs=2),
        "its queue past ttft_s": PrefillView(queued_tokens=1000),
        "a chunk of its queue past gap_s": PrefillView(queued_tokens=150, chunk_budget_tokens=2048),
    }
    for why, prefill in cases.items():
        d = decide(BALANCING, ANSWER, prefill, full_decode(), SLO)
        assert d.path == "remote", why
    # The same queue chunked at 16 tokens per step keeps the gap: whole again.
    small_chunks = PrefillView(queued_tokens=150, chunk_budget_tokens=16)
    assert decide(BALANCING, ANSWER, small_chunks, full_decode(), SLO).reason == "decode_full"


def test_modes_always_and_never_and_local_verdicts_are_untouched():
    assert decide(PDDecider(mode="always", whole_when_decode_full=True), ANSWER, PrefillView(queued_tokens=0),
                  full_decode(), SLO).path == "remote"
    assert decide(PDDecider(mode="never", whole_when_decode_full=True), ANSWER, PrefillView(queued_tokens=0),
                  full_decode(), SLO).path == "local"
    short = RequestView(prompt_tokens=20, max_tokens=128)  # cheaper on decode than the hops
    assert decide(BALANCING, short, PrefillView(queued_tokens=0), DecodeView(running_seqs=2, chunk_budget_tokens=24),
                  SLO).path == "local"


def test_the_cluster_config_turns_the_rule_on_and_the_router_gets_it(tiny_model_dir):
    assert RoutingConfig().whole_on_prefill_when_decode_full is False  # not measured to pay yet
    cfg = ClusterConfig.model_validate({"model": {"path": str(tiny_model_dir)},
                                        "routing": {"whole_on_prefill_when_decode_full": True}})
    assert build_kv_router(cfg)._decider.whole_when_decode_full is True


# -- through the KVRouter: the prefill replica's step reports feed its model ----------------


def _pool(name: str, stats: dict) -> PoolDirectory:
    d = PoolDirectory()
    d.set_replicas([ReplicaInfo("x", 8, RoutingStats.from_dict({"worker_id": f"interactive-{name}-x", **stats}))])
    return d


def _router(prefill_stats: dict, decode_stats: dict) -> KVRouter:
    dirs = {("interactive", "prefill"): _pool("prefill", prefill_stats),
            ("interactive", "decode"): _pool("decode", decode_stats)}
    return KVRouter(directories=dirs, index=None, weights={"load": 1.0}, decider=BALANCING, subscribe=False,
                    rng=random.Random(0), objectives={"interactive": SLO}, chunk_budgets={"interactive": 24},
                    prefill_chunk_budgets={"interactive": 256})


def _request(rid: str) -> EngineRequest:
    return EngineRequest(request_id=rid, prompt_token_ids=tuple(range(64)), sampling=SamplingParams(max_tokens=128),
                         tier="interactive")


def test_the_router_sends_streams_whole_to_prefill_until_its_reported_gaps_pass_the_objective():
    decode_full = {"running_seqs": 70, "step_s": 0.106, "step_n": 500}
    r = _router({"running_seqs": 1, "step_s": 0.05, "step_n": 20}, decode_full)
    decision = asyncio.run(r.route(_request("a"), "interactive"))
    assert decision.path == "whole" and decision.prefill.worker.worker_id == "interactive-prefill-x"
    model = r.cost_model("interactive-prefill-x").step
    assert (model.sx, model.sy) == pytest.approx((STEP_PRIOR.sx * 0.95 + 1, STEP_PRIOR.sy * 0.95 + 0.05))
    # Its streams now report 150 ms gaps: after a few reports the rule stops sending more there.
    slow = _router({"running_seqs": 1, "step_s": 0.15, "step_n": 20}, decode_full)
    for i in range(4):
        slow._directories[("interactive", "prefill")].set_replicas([ReplicaInfo("x", 8, RoutingStats.from_dict(
            {"worker_id": "interactive-prefill-x", "running_seqs": 1, "step_s": 0.15, "step_n": 20 + i}))])
        last = asyncio.run(slow.route(_request(f"b{i}"), "interactive"))
    assert last.path == "remote"
