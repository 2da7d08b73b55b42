"""The simulator's step-time, network and control-plane models (loadtest/sim)."""

from __future__ import annotations

import asyncio
import pytest

from loadtest.sim.clock import SimulationStuck, simulate
from loadtest.sim.control_plane import ControlPlane, ControlPlaneCost, from_benchmark
from loadtest.sim.network import LinkSpec, Nic
from loadtest.sim.step_time import ACCELERATORS, MODELS, CpuFitted, Roofline, StepShape


def test_the_cpu_fit_gives_back_its_calibration():
    fit = CpuFitted.from_calibration(unloaded_ttft_s=0.9, unloaded_step_s=0.043, prompt_tokens=512,
                                     budget_tokens=256, source="test")
    # One stream alone: the unloaded step. The prompt alone: two 256-token steps, the TTFT.
    assert fit.step_s(StepShape(decode_seqs=1, prefill_tokens=0, context_tokens=100)) == pytest.approx(0.043)
    two_chunks = 2 * fit.step_s(StepShape(decode_seqs=0, prefill_tokens=256, context_tokens=256))
    assert two_chunks == pytest.approx(0.9)


def test_the_roofline_is_memory_bound_for_decode_and_compute_bound_for_a_long_prefill():
    roof = Roofline(ACCELERATORS["H200"], MODELS["llama-3.1-8b"])
    decode = roof.step_s(StepShape(decode_seqs=1, prefill_tokens=0, context_tokens=1000, attention_pairs=1000))
    weights_s = 8.03e9 * 2 / 4.8e12
    assert decode == pytest.approx(weights_s, rel=0.01)  # reading the weights once dominates
    prefill = roof.step_s(StepShape(decode_seqs=0, prefill_tokens=8192, context_tokens=8192,
                                    attention_pairs=8192 * 8193 // 2))
    assert prefill == pytest.approx((2 * 8.03e9 * 8192 + 4 * 32 * 32 * 128 * 8192 * 8193 // 2) / 989e12)
    assert Roofline(ACCELERATORS["H200"], MODELS["llama-3.1-70b"], tp=4).step_s(
        StepShape(1, 0, 1000, 1000)) < Roofline(ACCELERATORS["H200"], MODELS["llama-3.1-70b"]).step_s(StepShape(1, 0, 1000, 1000))
    assert roof.provenance()["kind"] == "roofline_bound"


def test_transfers_share_a_nic_fairly():
    link = LinkSpec(bandwidth_Bps=1000.0, fixed_s=0.5)

    async def main():
        nic = Nic(link)
        loop = asyncio.get_running_loop()
        done: dict[str, float] = {}

        async def one(name: str, nbytes: float, delay: float) -> None:
            await asyncio.sleep(delay)
            await nic.send(nbytes)
            done[name] = loop.time()

        await asyncio.gather(one("a", 1000, 0.0), one("b", 1000, 0.0), one("c", 500, 1.5))
        return done

    done = simulate(main)
    # 0.5-2.0: a, b at 500 B/s → 750 B each by 2.0 (250 left); c starts its bytes at 2.0.
    # 2.0 on: three share, 333 B/s each → a, b done at 2.75 s; c has 250 left, alone → 3.0 s.
    assert done["a"] == pytest.approx(2.75)
    assert done["b"] == pytest.approx(2.75)
    assert done["c"] == pytest.approx(3.0)


def test_the_control_plane_costs_come_from_the_benchmark_and_slow_shared_engines():
    tandem, vllm = from_benchmark("tandem"), from_benchmark("vllm")
    assert 0.0003 < tandem.per_token_cpu_s < 0.001  # issue 27's 0.45-0.62 ms per token
    assert vllm.per_token_cpu_s < tandem.per_token_cpu_s
    assert "control_plane-issue27.json" in tandem.source
    cost = ControlPlaneCost(per_token_cpu_s=0.001, per_request_cpu_s=0.0, hop_s=0.0, source="test")
    shared = ControlPlane(cost, cores=2, shares_engine_cores=2)
    own = ControlPlane(cost, cores=2, shares_engine_cores=None)
    for cp in (shared, own):
        cp.charge(0.5, tokens=1000)  # one core-second within the last second
    # One engine busy: the other engine's idle core takes the control plane's core-second.
    shared.engine_busy(True)
    assert shared.slowdown(0.9) == pytest.approx(1.0)
    # Both busy: the core-second is shared by their two cores, half of each: steps twice as long.
    shared.engine_busy(True)
    assert shared.slowdown(0.9) == pytest.approx(2.0)
    assert own.slowdown(0.9) == 1.0
    assert shared.slowdown(2.0) == 1.0  # the window has passed
    assert own.summary(span_s=10)["peak_cores_1s"] == pytest.approx(1.0)


def test_the_clock_costs_no_wall_time_and_a_deadlock_is_named():
    async def sleeper():
        await asyncio.sleep(3600)
        return asyncio.get_running_loop().time()

    assert simulate(sleeper) == 3600

    async def stuck():
        await asyncio.get_running_loop().create_future()

    with pytest.raises(SimulationStuck):
        simulate(stuck)
