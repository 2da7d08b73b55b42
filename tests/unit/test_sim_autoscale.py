"""The simulated autoscaler observes what the real path observes (loadtest/sim/autoscale.py):
each replica's signals.py sample every interval (counter increments, the first one 0), Serve's
mean over the look-back window, serve_policy.py's totals over replicas, and vLLM's TTFT and
inter-token latency as the engine's histograms define them. Stepped tick by tick, with a leak
check: a removed replica's window goes with it."""

from __future__ import annotations

import asyncio

import pytest

from cluster.config import ClusterConfig
from cluster.hashing import BlockHasher
from loadtest.sim.autoscale import Autoscaler
from loadtest.sim.clock import simulate
from loadtest.sim.engine import SimRequest
from loadtest.sim.pools import SimPools
from loadtest.sim.setups import cpu_hardware
from loadtest.sim.trace import Trace
from router.prefix_index.memory import MemoryPrefixIndex

LOOK_BACK_S = 4.0
KEY = ("interactive", "decode")  # the autoscaled pool


def _config() -> ClusterConfig:
    engine = {"kv_cache_memory_bytes": 64 << 20, "max_num_seqs": 16, "max_num_batched_tokens": 256,
              "enable_chunked_prefill": True}
    scaling = {"min_replicas": 1, "max_replicas": 3, "metrics_interval_s": 1, "look_back_s": LOOK_BACK_S,
               "upscale_delay_s": 0, "cooldown_s": 0, "downscale_delay_s": 0}
    return ClusterConfig.model_validate({
        "model": {"path": "/simulated/m", "name": "m", "max_model_len": 2048},
        "tiers": {"interactive": {
            "prefill": {"replicas": 1, "engine": engine},
            "decode": {"replicas": 2, "engine": engine, "autoscaling": scaling},
            "slo": {"ttft_s": 1.5, "itl_s": 0.12, "max_gap_s": 0.25},
        }},
    })


def _cluster(started: bool = True) -> tuple[SimPools, Autoscaler, Trace]:
    """A simulated cluster and its autoscaler; call inside `simulate`."""
    cfg = _config()
    hw, _ = cpu_hardware(0.26, 0.041, 512, 256, "bfloat16", source="test")
    pools = SimPools(cfg, hw, MemoryPrefixIndex(), lambda: 1.0, lambda now, n: None)
    if started:
        pools.start()
    trace = Trace()
    return pools, Autoscaler(cfg, pools, trace), trace


def _request(rid: str, prompt_tokens: int, max_tokens: int) -> SimRequest:
    prompt = tuple(range(1000, 1000 + prompt_tokens))
    return SimRequest(rid, prompt_tokens, BlockHasher(128).hashes(prompt), max_tokens)


def test_latency_signals_are_window_means_of_the_engines_histogram_increments():
    async def main():
        pools, scaler, _ = _cluster()
        loop = asyncio.get_running_loop()
        first, second = pools.replicas[KEY]
        seen = [scaler.observe(KEY, loop.time())]  # t=0: first reports, increments 0
        r = first.engine.submit(_request("a", 200, 4))
        await r.done.wait()
        await asyncio.sleep(1.0)
        seen.append(scaler.observe(KEY, loop.time()))  # r's latencies in the first replica's window
        await asyncio.sleep(LOOK_BACK_S + 0.5)
        seen.append(scaler.observe(KEY, loop.time()))  # r's sample has left the window
        return r, seen, scaler, pools, (first, second)

    r, (t0, t1, t2), scaler, pools, (first, second) = simulate(main)
    assert (t0.ttft_s, t0.itl_s) == (None, None), "the first report carries increments 0, not lifetime totals"
    # vLLM's TTFT counts from the engine's arrival to the first token, ITL each later gap.
    assert t1.ttft_s == pytest.approx(r.tokens[0] - r.arrived)
    assert t1.itl_s == pytest.approx((r.tokens[-1] - r.tokens[0]) / 3)
    assert first.engine.latency.ttft_count == 1 and first.engine.latency.itl_count == 3
    assert second.engine.latency.ttft_count == 0
    assert t1.replicas == 2 and t1.kv_usage >= 0.0 and t1.running_seqs == 0.0
    assert (t2.ttft_s, t2.itl_s) == (None, None), "a sample older than look_back_s still counted"
    assert set(scaler._windows) == {first.worker_id, second.worker_id}
    assert all(len(w) <= LOOK_BACK_S / 1.0 for w in scaler._windows.values())


def test_gauges_are_averaged_over_the_window_not_read_at_the_tick():
    async def main():
        pools, scaler, _ = _cluster(started=False)
        loop = asyncio.get_running_loop()
        first = pools.replicas[KEY][0]
        out = []
        for queued in (400, 0, 0):  # not a decode signal, but summed as signals.py reports it
            first.queued_prompt_tokens = queued
            out.append(scaler.observe(KEY, loop.time()))
            await asyncio.sleep(1.0)
        return out

    a, b, c = simulate(main)
    assert [a.queued_prompt_tokens, b.queued_prompt_tokens, c.queued_prompt_tokens] == pytest.approx([400, 200, 400 / 3])


def test_a_removed_replica_leaves_no_window_behind():
    async def main():
        pools, scaler, trace = _cluster()
        loop = asyncio.get_running_loop()
        for _ in range(4):  # idle: the policy scales the two decode replicas down to min_replicas
            scaler.tick(loop.time())
            await asyncio.sleep(1.0)
        return scaler, pools, trace

    scaler, pools, trace = simulate(main)
    assert any(d.target < obs.target for _, obs, _, d, _ in trace.scaling), "the idle pool never scaled down"
    assert len(pools.replicas[KEY]) == 1
    assert set(scaler._windows) == set(scaler._last_counters) == {pools.replicas[KEY][0].worker_id}
