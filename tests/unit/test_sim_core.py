"""The simulator is deterministic: the same inputs and seed give byte-identical JSON."""

from __future__ import annotations

import json

from loadtest.bench.workload import Mix, RequestKind, poisson_schedule
from loadtest.measure.slo import Objective
from loadtest.sim.control_plane import from_benchmark
from loadtest.sim.run import simulate_tandem
from loadtest.sim.setups import bench_system, bench_tandem_config, cpu_hardware

MIX = Mix(RequestKind("prefill-heavy", 512, 8), RequestKind("decode-heavy", 64, 32), 0.7)
MEAN = Objective(1300.0, 124.0)
EVERY = Objective(1300.0, 124.0, 248.0)


def run_json(system: str, seed: int, trace_seed: int = 0) -> str:
    schedule = poisson_schedule(MIX, 3.0, 6.0, trace_seed)
    hw, _ = cpu_hardware(0.26, 0.041, 512, 256, "bfloat16", source="test")
    cfg = bench_tandem_config(bench_system(system), EVERY, budget=256)
    result = simulate_tandem(cfg, hw, from_benchmark("tandem"), schedule, seed=seed, drain_timeout_s=20.0,
                             control_cores=2, shares_engine_cores=2)
    out = {"summary": result.summary(MEAN, EVERY, 6.0, 2), "reasons": result.trace.reasons(),
           "records": [(r.index, r.ttft_ms, r.token_gaps_ms, r.error) for r in result.records],
           "engines": result.engines, "control": result.control}
    return json.dumps(out, sort_keys=True)


def test_same_seed_gives_byte_identical_json():
    first = run_json("tandem-adaptive", seed=7)
    assert first == run_json("tandem-adaptive", seed=7)
    assert json.loads(first)["summary"]["requests"] > 10


def test_a_different_trace_gives_a_different_run():
    assert run_json("tandem-adaptive", seed=7) != run_json("tandem-adaptive", seed=7, trace_seed=1)
