"""The replay serves a rate as the goodput benchmark did (loadtest/sim/run.py simulate_tandem):
one cluster per system, the benchmark's own warm-up first (loadtest/bench/workload.py
warm_up_requests, one request at a time), then the earlier rates, each to its end; the router
learns from all of it and nothing of it is reported."""

from __future__ import annotations

from cluster.config import ClusterConfig
from loadtest.bench.workload import Mix, RequestKind, poisson_schedule, warm_up_requests
from loadtest.sim.control_plane import from_benchmark
from loadtest.sim.run import simulate_tandem
from loadtest.sim.setups import cpu_hardware

MIX = Mix(RequestKind("prefill-heavy", 512, 8), RequestKind("decode-heavy", 64, 32), 0.5)


def _config() -> ClusterConfig:
    engine = {"kv_cache_memory_bytes": 64 << 20, "max_num_seqs": 16, "max_num_batched_tokens": 256,
              "enable_chunked_prefill": True}
    return ClusterConfig.model_validate({
        "model": {"path": "/simulated/m", "name": "m", "max_model_len": 2048},
        "tiers": {"interactive": {"prefill": {"replicas": 1, "engine": engine},
                                  "decode": {"replicas": 1, "engine": engine},
                                  "slo": {"ttft_s": 3.0, "itl_s": 0.12, "max_gap_s": 0.25}}},
        "routing": {"disaggregation": "adaptive"},
    })


def _run(**prelude):
    hw, _ = cpu_hardware(0.26, 0.041, 512, 256, "bfloat16", source="test")
    schedule = poisson_schedule(MIX, 1.0, 6.0, 0)
    result = simulate_tandem(_config(), hw, from_benchmark("tandem"), schedule, seed=0, drain_timeout_s=20.0,
                             control_cores=2, shares_engine_cores=2, **prelude)
    return schedule, result


def test_the_warm_up_and_earlier_rates_teach_the_router_and_count_in_no_rate():
    schedule, cold = _run()
    earlier = poisson_schedule(MIX, 2.0, 6.0, 0)
    _, warm = _run(warm_up=warm_up_requests(MIX), earlier=[earlier])
    for result in (cold, warm):
        assert len(result.records) == len(schedule)
        assert len(result.trace.verdicts) == len(schedule), "a warm-up or earlier verdict was counted"
        assert result.control["requests"] == len(schedule)
        prefill = next(v for k, v in result.engines.items() if "prefill" in k)
        assert prefill["steps"] > 0
    # The first verdict of the measured rate: cold, the prefill cost model has seen nothing;
    # after the warm-up and a rate, it has learned from their prompts.
    first_cold, first_warm = cold.trace.verdicts[0][0], warm.trace.verdicts[0][0]
    assert first_cold[2].model.prefill.data_weight == 0.0
    assert first_warm[2].model.prefill.data_weight > 0.0


def test_the_warm_up_is_the_benchmarks_two_of_each_kind_with_short_answers():
    reqs = warm_up_requests(MIX)
    assert [r.kind for r in reqs] == ["prefill-heavy", "decode-heavy"] * 2
    assert {r.max_tokens for r in reqs} == {16}
    assert len({r.prompt for r in reqs}) == 4  # distinct prompts: no prefix hit between them
