"""A prefill engine whose every KV block is held for decode pulls must resume when the pulls
free them (loadtest/sim/engine.py `release`). Before, the simulated engine slept until the next
arrival: with a 24 MiB cache (8 blocks of 128 tokens, two 512-token prompts' worth) at 8 req/s,
27 of 47 requests (`always`) and 23 of 47 (`adaptive`) sat in the prefill engine's waiting queue
with every block free, "unfinished 60 s after the last arrival"."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from cluster.config import ClusterConfig
from loadtest.bench.workload import Mix, RequestKind, poisson_schedule
from loadtest.sim.clock import simulate
from loadtest.sim.control_plane import from_benchmark
from loadtest.sim.engine import EngineParams, SimEngine, SimRequest
from loadtest.sim.kv_cache import BlockPool
from loadtest.sim.run import simulate_tandem
from loadtest.sim.setups import cpu_hardware
from loadtest.sim.step_time import CpuFitted

KV_MIB = 24  # SmolLM2-135M bf16 at 128-token blocks: 8 blocks, 1,024 tokens (= max_model_len below)


def _config(mode: str) -> ClusterConfig:
    engine = {"kv_cache_memory_bytes": KV_MIB << 20, "max_num_seqs": 16, "max_num_batched_tokens": 256,
              "enable_chunked_prefill": True}
    return ClusterConfig.model_validate({
        "model": {"path": "/simulated/m", "name": "m", "max_model_len": 1024},
        "tiers": {"interactive": {
            "prefill": {"replicas": 1, "engine": engine},
            "decode": {"replicas": 1, "engine": engine},
            "slo": {"ttft_s": 1.5, "itl_s": 0.12, "max_gap_s": 0.25},
            "admission": {"max_running": 64, "max_queued": 256, "queue_timeout_s": 60, "target_ttft_s": 1.5,
                          "min_running": 4},
        }},
        "routing": {"disaggregation": mode, "whole_on_prefill_max_tokens": 16},
    })


def _run(mode: str):
    mix = Mix(RequestKind("prefill-heavy", 512, 8), RequestKind("decode-heavy", 64, 32), 0.7)
    schedule = poisson_schedule(mix, 8.0, 6.0, 3)
    hw, _ = cpu_hardware(0.26, 0.041, 512, 256, "bfloat16", source="test")
    result = simulate_tandem(_config(mode), hw, from_benchmark("tandem"), schedule, seed=1, drain_timeout_s=60.0,
                             control_cores=2, shares_engine_cores=2)
    return schedule, result


@pytest.mark.parametrize("mode", ["always", "adaptive"])
def test_a_small_kv_cache_finishes_every_request_and_stays_deterministic(mode):
    schedule, result = _run(mode)
    assert len(result.records) == len(schedule) == 47
    errors = [r.error for r in result.records if not r.ok]
    assert errors == []
    assert result.trace.paths.get("remote", 0) >= 38  # the producers' held blocks were exercised
    # Well before the 60 s drain: nothing waits on a lease or a timeout.
    assert result.span_s < 15.0
    again = _run(mode)[1]
    as_json = lambda res: json.dumps([dataclasses.asdict(r) for r in res.records] + [res.engines], sort_keys=True)
    assert as_json(again) == as_json(result)


def test_releasing_held_blocks_wakes_an_engine_that_had_nothing_to_admit():
    """Two blocks, one producer holding both: the second prompt can only start once `release`
    frees them, with no other event (no arrival, no step) to wake the engine."""
    step = CpuFitted(base_s=0.01, per_seq_s=0.0, per_prompt_token_s=0.001, source="test")

    async def main():
        engine = SimEngine("p", EngineParams(4, 256, 16, 2), step, BlockPool("p", 2, 16, lambda ev: None))
        engine.start()
        held = engine.submit(SimRequest("a", 32, [], 1, hold_blocks=True))
        second = engine.submit(SimRequest("b", 32, [], 1))
        await held.done.wait()
        await asyncio.sleep(5.0)
        assert not second.tokens and len(engine.waiting) == 1  # blocked: both blocks still held
        engine.release(held)
        released_at = asyncio.get_running_loop().time()
        await asyncio.wait_for(second.done.wait(), timeout=1.0)
        engine.stop()
        return second.tokens[0] - released_at

    assert 0 < simulate(main) < 0.1
