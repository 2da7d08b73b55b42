"""The P/D decider and its cost models as pure functions, and the KVRouter consulting them."""

from __future__ import annotations

import asyncio
import random

import pytest
from vllm import SamplingParams

from cluster.config import RoutingConfig
from cluster.protocol import EngineRequest
from router.routing.cost_model import PREFILL_PRIOR, STEP_PRIOR, EngineCostModel, LinearFit
from router.routing.decider import (DecodeView, Objectives, PDDecider, PrefillView, RequestView, decide,
                                    predict_local)
from router.routing.directory import PoolDirectory, ReplicaInfo
from cluster.types import RoutingStats
from router.routing.ledger import STALE_STATS_S
from router.routing.service import KVRouter

ADAPTIVE = PDDecider(mode="adaptive")
SLO = Objectives(ttft_s=1.0, itl_s=0.1, gap_s=0.2)

# -- cost model -----------------------------------------------------------------------------


def fitted(points, prior=PREFILL_PRIOR) -> LinearFit:
    fit = prior
    for x, y in points:
        fit = fit.observe(x, y)
    return fit


def test_the_fit_starts_at_its_prior():
    assert PREFILL_PRIOR.coefficients() == pytest.approx((0.09, 0.002))
    assert STEP_PRIOR.predict(8) == pytest.approx(0.035 + 0.008)
    assert PREFILL_PRIOR.observations == 0


def test_the_fit_recovers_a_line_from_noisy_observations():
    rng = random.Random(1)
    points = [(n, 0.03 + 0.0005 * n + rng.gauss(0, 0.005)) for n in (rng.randint(16, 2000) for _ in range(60))]
    a, b = fitted(points).coefficients()
    assert a == pytest.approx(0.03, abs=0.02)
    assert b == pytest.approx(0.0005, rel=0.1)  # 4x off the prior's slope, recovered


def test_the_fit_follows_a_change_through_its_decay():
    slow = fitted([(n, 0.1 + 0.004 * n) for n in (100, 800, 1500) * 10])
    assert slow.predict(1000) == pytest.approx(4.1, rel=0.05)
    fast = fitted([(n, 0.1 + 0.001 * n) for n in (100, 800, 1500) * 20], prior=slow)
    assert fast.predict(1000) == pytest.approx(1.1, rel=0.15)  # the old regime has (mostly) decayed away


def test_observations_at_one_x_move_the_level_and_keep_the_prior_slope():
    fit = fitted([(1, 0.05)] * 30, prior=STEP_PRIOR)  # a decode engine always at batch 1
    assert fit.predict(1) == pytest.approx(0.05, abs=0.003)
    assert fit.coefficients()[1] >= 0


def test_the_fit_never_predicts_negative_costs():
    fit = fitted([(1000, 0.0), (10, 0.5)] * 5)  # a downward line
    a, b = fit.coefficients()
    assert b == 0 and a > 0
    assert PREFILL_PRIOR.observe(-1, 1.0) == PREFILL_PRIOR  # nonsense is ignored


def test_engine_cost_model_is_frozen_and_observation_returns_a_new_one():
    model = EngineCostModel()
    calibrated = model.observe_prefill(512, 0.6).observe_step(4, 0.05)
    assert model.prefill.observations == 0 and calibrated.prefill.observations == 1
    assert calibrated.step.observations == 1
    with pytest.raises(Exception):
        model.prefill = PREFILL_PRIOR  # type: ignore[misc]


# -- decisions, step by step ----------------------------------------------------------------


def idle_prefill(queued=0) -> PrefillView:
    return PrefillView(queued_tokens=queued)


def decode_with(running=0, budget=512) -> DecodeView:
    return DecodeView(running_seqs=running, chunk_budget_tokens=budget)


def test_modes_always_and_never_ignore_load():
    req = RequestView(prompt_tokens=1500)
    assert decide(PDDecider(mode="always"), req, idle_prefill(10**6), decode_with(), SLO).path == "remote"
    never = decide(PDDecider(mode="never"), req, idle_prefill(), decode_with(), SLO)
    assert (never.path, never.reason) == ("local", "never")


def test_the_fixed_threshold_still_works_in_adaptive_and_always():
    req = RequestView(prompt_tokens=500, cached_on_decode=448)
    for mode in ("always", "adaptive"):
        d = decide(PDDecider(64, mode), req, idle_prefill(), decode_with(running=7), SLO)
        assert (d.path, d.reason) == ("local", "short_uncached")
    assert decide(PDDecider(64, "always"), RequestView(500), idle_prefill(), decode_with(), SLO).reason == "always"


def test_a_short_uncached_prompt_stays_on_decode():
    # 20 tokens cost decode 40 ms: less than the remote path's 90 ms of hops.
    d = decide(ADAPTIVE, RequestView(prompt_tokens=20), idle_prefill(), decode_with(running=2), SLO)
    assert (d.path, d.reason) == ("local", "short_uncached")
    assert d.ttft_local_s < d.ttft_remote_s
    # Mostly cached on decode: only the uncached tail counts.
    d = decide(ADAPTIVE, RequestView(prompt_tokens=2000, cached_on_decode=1984), idle_prefill(), decode_with(), SLO)
    assert d.reason == "short_uncached"


def test_a_long_prompt_goes_remote_while_the_prefill_engine_meets_the_objective():
    d = decide(ADAPTIVE, RequestView(prompt_tokens=300), idle_prefill(), decode_with(), SLO)
    assert (d.path, d.reason) == ("remote", "prefill_ok")
    assert d.ttft_remote_s == pytest.approx(0.09 + 0.002 * 300)


def test_a_long_prefill_queue_sends_the_prompt_local_while_decode_has_no_streams():
    d = decide(ADAPTIVE, RequestView(prompt_tokens=300), idle_prefill(queued=3000), decode_with(), SLO)
    assert (d.path, d.reason) == ("local", "prefill_queue")
    assert d.ttft_remote_s > SLO.ttft_s > d.ttft_local_s
    assert d.gap_local_s == 0  # no stream to delay


def test_local_prefill_that_would_stall_running_streams_stays_remote():
    d = decide(ADAPTIVE, RequestView(prompt_tokens=300), idle_prefill(queued=3000), decode_with(running=4), SLO)
    assert (d.path, d.reason) == ("remote", "decode_gap_budget")
    assert d.gap_local_s > SLO.itl_s
    # A small chunk budget keeps the gap within the objective: then local is fine.
    d = decide(ADAPTIVE, RequestView(prompt_tokens=300), idle_prefill(queued=3000),
               decode_with(running=4, budget=24), SLO)
    assert (d.path, d.reason) == ("local", "prefill_queue") and d.gap_local_s <= SLO.gap_s


def test_a_decode_engine_already_at_its_mean_itl_takes_no_local_prefill():
    # Its step at this batch (35 ms + 1 ms per sequence) alone reaches the 100 ms mean ITL.
    d = decide(ADAPTIVE, RequestView(prompt_tokens=300), idle_prefill(queued=3000),
               decode_with(running=70, budget=24), SLO)
    assert (d.path, d.reason) == ("remote", "decode_itl_budget")


def test_past_half_its_slack_the_prefill_queue_shares_prompts_with_an_idle_decode_engine():
    # 300 tokens: 0.69 s on an idle prefill engine, 0.31 s of slack to the 1 s objective.
    calm = decide(ADAPTIVE, RequestView(prompt_tokens=300), idle_prefill(queued=50), decode_with(), SLO)
    assert (calm.path, calm.reason) == ("remote", "prefill_ok")  # 0.1 s of queue: within half the slack
    busy = decide(ADAPTIVE, RequestView(prompt_tokens=300), idle_prefill(queued=100), decode_with(), SLO)
    assert busy.ttft_remote_s <= SLO.ttft_s  # remote would still meet the objective...
    assert (busy.path, busy.reason) == ("local", "prefill_queue")  # ...but its queue is the bottleneck


def test_prompts_queued_locally_on_decode_count_against_the_next_local_prefill():
    free = decide(ADAPTIVE, RequestView(prompt_tokens=300), idle_prefill(queued=100), decode_with(), SLO)
    queued = decide(ADAPTIVE, RequestView(prompt_tokens=300), idle_prefill(queued=100),
                    DecodeView(running_seqs=0, chunk_budget_tokens=512, queued_tokens=300), SLO)
    assert queued.ttft_local_s == pytest.approx(free.ttft_local_s + 0.002 * 300 + STEP_PRIOR.predict(1))
    assert (queued.path, queued.reason) == ("remote", "prefill_ok")  # now remote is the faster


def test_a_prompt_too_long_for_the_objective_even_when_idle_is_local_only_if_faster():
    # 800 tokens miss 1 s remote even with an idle prefill engine (1.69 s); local on an idle
    # decode engine is faster (no hops): "local_faster", not blamed on a queue.
    d = decide(ADAPTIVE, RequestView(prompt_tokens=800), idle_prefill(), decode_with(budget=2048), SLO)
    assert (d.path, d.reason) == ("local", "local_faster")
    assert d.ttft_local_s < d.ttft_remote_s


def test_overloaded_both_ways_stays_remote():
    # A 6000-token prompt misses 1 s either way; local is no faster: keep decode for its streams.
    d = decide(ADAPTIVE, RequestView(prompt_tokens=6000), idle_prefill(queued=100), decode_with(budget=64),
               SLO)
    assert (d.path, d.reason) == ("remote", "overloaded")
    assert d.ttft_local_s >= d.ttft_remote_s > SLO.ttft_s


def test_the_prompt_cached_on_the_prefill_engine_is_cheaper_remote():
    req = RequestView(prompt_tokens=1000, cached_on_prefill=900)
    d = decide(ADAPTIVE, req, idle_prefill(queued=200), decode_with(), SLO)
    assert d.path == "remote" and d.ttft_remote_s == pytest.approx(0.09 + 0.002 * 300)


def test_local_ttft_counts_one_step_per_chunk():
    model = EngineCostModel()
    ttft, gap = predict_local(RequestView(prompt_tokens=1000), DecodeView(running_seqs=2, chunk_budget_tokens=252,
                                                                          model=model), per_token_s=0.001)
    steps = 4  # 1000 tokens in chunks of 250
    assert ttft == pytest.approx(steps * model.step_s(3) + 1.0)
    assert gap == pytest.approx(model.step_s(2) + 0.25)


def test_routing_config_defaults_to_adaptive_and_keeps_the_threshold():
    cfg = RoutingConfig()
    assert cfg.disaggregation == "adaptive" and cfg.decode_only_below_tokens == 0
    assert RoutingConfig(disaggregation="never", decode_only_below_tokens=32).disaggregation == "never"
    with pytest.raises(Exception):
        RoutingConfig(disaggregation="sometimes")


# -- the KVRouter consults the decider and calibrates the models ----------------------------


def pool(pool_name: str, stats: dict) -> PoolDirectory:
    d = PoolDirectory()
    d.set_replicas([ReplicaInfo("x", 8, RoutingStats.from_dict({"worker_id": f"interactive-{pool_name}-x", **stats}))])
    return d


def router(prefill_stats: dict, decode_stats: dict, *, mode="adaptive", timer=None) -> KVRouter:
    dirs = {("interactive", "prefill"): pool("prefill", prefill_stats),
            ("interactive", "decode"): pool("decode", decode_stats)}
    extra = {"timer": timer} if timer else {}
    return KVRouter(directories=dirs, index=None, weights={"load": 1.0}, decider=PDDecider(mode=mode),
                    subscribe=False, rng=random.Random(0), objectives={"interactive": SLO},
                    chunk_budgets={"interactive": 512}, **extra)


def req(n: int, rid="r1") -> EngineRequest:
    return EngineRequest(request_id=rid, prompt_token_ids=tuple(range(n)), sampling=SamplingParams(max_tokens=4), tier="interactive")


def test_the_router_sends_long_prompts_local_when_the_reported_prefill_queue_is_long():
    busy = router({"queued_prompt_tokens": 5000}, {"running_seqs": 0})
    decision = asyncio.run(busy.route(req(300), "interactive"))
    assert decision.path == "local" and decision.prefill is None and decision.decode is not None
    idle = router({"queued_prompt_tokens": 0}, {"running_seqs": 0})
    decision = asyncio.run(idle.route(req(300), "interactive"))
    assert decision.path != "local" and decision.prefill.worker.worker_id == "interactive-prefill-x"


def test_never_mode_does_not_pick_a_prefill_engine():
    decision = asyncio.run(router({}, {}, mode="never").route(req(3000), "interactive"))
    assert decision.path == "local" and decision.prefill is None


def test_prefill_hops_calibrate_the_prefill_engines_model_from_hops_queued_behind_nothing():
    clock = iter([0.0, 0.1, 1.0, 1.0]).__next__  # hop a: 1 s; hop b starts inside it (0.9 s)
    r = router({}, {"running_seqs": 2}, timer=clock)
    first = asyncio.run(r.route(req(300, "a"), "interactive"))
    second = asyncio.run(r.route(req(200, "b"), "interactive"))
    with r.dispatch(first.prefill, "a"):
        assert r._ledger._queued_tokens == {"x": 300}
        with r.dispatch(second.prefill, "b"):
            assert r._ledger._queued_tokens == {"x": 500}  # what the next decision sees queued
    assert r._ledger._queued_tokens == {}
    model = r.cost_model("interactive-prefill-x")
    # Only hop a is a sample: b queued behind a's 300 tokens.
    assert model.prefill.observations == 1
    assert (model.prefill.sx, model.prefill.sy) == pytest.approx((PREFILL_PRIOR.sx * 0.95 + 300,
                                                                  PREFILL_PRIOR.sy * 0.95 + 1.0))


def test_a_timed_out_hop_moves_the_model_at_most_threefold():
    clock = iter([0.0, 30.0]).__next__
    r = router({}, {}, timer=clock)
    decision = asyncio.run(r.route(req(300), "interactive"))
    with r.dispatch(decision.prefill, "r1"):
        pass
    observed = r.cost_model("interactive-prefill-x").prefill.sy - PREFILL_PRIOR.sy * 0.95
    assert observed == pytest.approx(3 * (0.09 + 0.002 * 300))


def test_a_local_prefill_is_queued_on_its_decode_replica_until_its_first_token():
    r = router({"queued_prompt_tokens": 5000}, {"running_seqs": 0})
    a = asyncio.run(r.route(req(300, "a"), "interactive"))
    assert a.path == "local"
    with r.dispatch(a.decode, "a"):
        assert r._ledger._queued_tokens == {"x": 300}
        b = asyncio.run(r.route(req(300, "b"), "interactive"))  # sees a's prompt ahead on decode
        with r.dispatch(b.decode, "b"):
            assert r._ledger._queued_tokens == {"x": 600}
            r.first_token("a")
            assert r._ledger._queued_tokens == {"x": 300}  # a streams now; b's prompt is still ahead
        assert r._ledger._queued_tokens == {}  # b's hop ended before its first token: released with it
    r.first_token("a")  # a late or second call releases nothing twice
    assert r._ledger._queued_tokens == {} and r._ledger._prompts == {} and r._ledger._pending == {}
    assert r._ledger._done == {}  # a decode replica's prompts are not kept for the prefill discount


def test_decode_step_reports_calibrate_once_per_new_report():
    r = router({}, {"running_seqs": 3, "step_s": 0.08, "step_n": 40})
    for i in range(3):
        asyncio.run(r.route(req(300, f"r{i}"), "interactive"))
    step = r.cost_model("interactive-decode-x").step
    assert step.observations == 1
    assert (step.sx, step.sy) == pytest.approx((STEP_PRIOR.sx * 0.95 + 3, STEP_PRIOR.sy * 0.95 + 0.08))


# -- what the engine replicas report for the decider (cluster/engine/replica.py) ------------


def _replica(role, running=0.0):
    """An EngineReplica around a started FakeEngine (no Serve), its vLLM readings set by hand."""
    from cluster.config import EngineConfig, KVTransferConfig
    from cluster.engine.base import EngineSpec
    from cluster.engine.fake import FakeEngine
    from cluster.engine.replica import EngineReplica

    spec = EngineSpec(model_path="/m", served_name="m", dtype="float32", max_model_len=64,
                      engine=EngineConfig(block_size=16), kv_role=role, kv=KVTransferConfig(), nixl=None,
                      cpu_binding=None, on_gpu=False, worker_id=f"interactive-x-{role}")
    engine = FakeEngine(spec)
    replica = EngineReplica()
    replica.engine, replica.info = engine, engine.start()
    engine._values.update({("vllm:kv_cache_usage_perc", None): 0.23, ("vllm:num_requests_running", None): running})
    return replica


def test_a_prefill_replica_reports_its_queued_prompt_tokens():
    replica = _replica("kv_producer")
    with replica.signals.pending_prompt(700):
        stats = replica.routing_stats()
    assert stats["queued_prompt_tokens"] == 700 and stats["kv_usage"] == 0.2
    assert (stats["worker_id"], stats["block_size"], stats["hash_algo"]) == ("interactive-x-kv_producer", 16, "sha256")
    assert "step_s" not in stats


def test_a_decode_replica_reports_its_batch_and_mean_step_since_the_last_report():
    replica = _replica("kv_consumer", running=3.0)
    values = replica.engine._values  # the engine's own reading: the routing stats' only source
    assert "step_s" not in replica.routing_stats()  # idle: nothing to report, stats stay still
    values.update({("vllm:inter_token_latency_seconds_sum", None): 2.0,
                   ("vllm:inter_token_latency_seconds_count", None): 40.0})
    stats = replica.routing_stats()
    assert (stats["running_seqs"], stats["step_s"], stats["step_n"]) == (3, 0.05, 40)
    values.update({("vllm:inter_token_latency_seconds_sum", None): 2.8,
                   ("vllm:inter_token_latency_seconds_count", None): 50.0})  # the next period: its own 10 gaps
    assert replica.routing_stats()["step_s"] == 0.08
    assert "queued_prompt_tokens" not in stats


def test_a_prefill_replica_streaming_whole_requests_reports_its_step():
    replica = _replica("kv_producer", running=2.0)
    assert "step_s" not in replica.routing_stats()  # prefills only: no gaps
    replica.engine._values.update({("vllm:inter_token_latency_seconds_sum", None): 1.2,
                                   ("vllm:inter_token_latency_seconds_count", None): 20.0})
    stats = replica.routing_stats()
    assert (stats["running_seqs"], stats["step_s"], stats["step_n"], stats["queued_prompt_tokens"]) == (2, 0.06, 20, 0)

def test_a_reported_queue_is_discounted_by_this_gateways_prompts_done_since():
    # The replica's last report (up to seconds old) still counts a prompt this gateway saw finish.
    now = [100.0]
    r = router({"queued_prompt_tokens": 300}, {"running_seqs": 0})
    r._ledger._clock = lambda: now[0]
    first = asyncio.run(r.route(req(300, "a"), "interactive"))
    assert first.path == "local"  # 300 tokens reported queued: past half the slack, local
    r._ledger._queued_tokens.clear()
    r._ledger._pending.clear()
    r.release("a")  # each request here ends at once: its decode pick no longer counts
    # A remote prompt of this gateway's finishes on the prefill replica...
    pick = asyncio.run(r.route(req(20, "warm"), "interactive")).decode  # any pick: only its worker matters
    r.release("warm")
    prefill_pick = type(pick)(worker=r.workers("interactive", "prefill")[0], score=1.0, scores={})
    r._ledger.expect("b", 300)
    with r.dispatch(prefill_pick, "b"):
        pass
    # ...so the stale report's 300 tokens are its own: the next prompt goes remote.
    second = asyncio.run(r.route(req(300, "c"), "interactive"))
    assert second.path != "local" and second.prefill is not None
    r.release("c")
    now[0] += STALE_STATS_S + 0.1  # past the staleness window, the report counts again
    assert asyncio.run(r.route(req(300, "d"), "interactive")).path == "local"
