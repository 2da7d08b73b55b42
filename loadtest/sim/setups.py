"""Ready-made inputs: the CPU engines of this project's goodput runs, and tandem's config as the
goodput benchmark builds it (loadtest/bench/goodput_systems.py `tandem_config`, the very
function the benchmark used, so a replay's pools, SLOs and routing are the recorded run's)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from cluster.config import ClusterConfig
from loadtest.bench.goodput_systems import System, systems_of, tandem_config
from loadtest.measure.slo import Objective
from loadtest.sim.network import LinkSpec
from loadtest.sim.pools import Hardware
from loadtest.sim.step_time import MODELS, PRIOR_STREAM_SHARE, CpuFitted

GiB = 1 << 30
BENCH_RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
# NIXL over loopback TCP on these VMs: 1.3-2.6 GiB/s (DESIGN.md); the middle, for every run.
CPU_LINK = LinkSpec(bandwidth_Bps=2.0 * GiB, fixed_s=0.005)
CPU_BLOCK_SIZE = 128  # vLLM's CPU default (vllm/platforms/cpu.py)
CPU_MODEL = MODELS["smollm2-135m"]


def kv_bytes_per_token(dtype: str) -> int:
    """SmolLM2-135M's KV bytes per token in the run's dtype (float32 where bf16 is emulated)."""
    return CPU_MODEL.kv_bytes_per_token * (2 if dtype == "bfloat16" else 4) // CPU_MODEL.dtype_bytes


def decode_stream_share(host_class: Optional[str], results: Path = BENCH_RESULTS) -> tuple[float, str]:
    """A running stream's extra on a CPU engine's decode step, as a share of the one-stream step,
    and where it comes from: loadtest.bench.decode_slope's fit for the host class (the newest
    committed result of that class), else router/routing/cost_model.py's prior."""
    measured = sorted((p for p in results.glob("decode_slope-*.json")
                       if json.loads(p.read_text())["machine"]["host_class"] == host_class), key=lambda p: p.name)
    if not measured:
        return PRIOR_STREAM_SHARE, f"the router cost model's prior (not measured on {host_class or 'this'} host class)"
    fit = json.loads(measured[-1].read_text())["fit"]
    return fit["per_stream_share"], f"{measured[-1].name} (decode_slope fit, {fit['slope_ms_per_stream']} ms per stream)"


def cpu_hardware(unloaded_ttft_s: float, unloaded_step_s: float, prompt_tokens: int, budget: int, dtype: str,
                 source: str, link: LinkSpec = CPU_LINK, host_class: Optional[str] = None) -> tuple[Hardware, CpuFitted]:
    """`host_class` (validate.py machine_class) picks the decode step's per-stream share."""
    share, share_from = decode_stream_share(host_class)
    step = CpuFitted.from_calibration(unloaded_ttft_s, unloaded_step_s, prompt_tokens, budget,
                                      f"{source}; per stream: {share_from}", stream_share=share)
    hw = Hardware(step_model=lambda tier, role: step, kv_bytes_per_token=kv_bytes_per_token(dtype),
                  default_block_size=CPU_BLOCK_SIZE, link=link)
    return hw, step


def bench_system(name: str) -> Optional[System]:
    """The goodput benchmark's System of that name (colocated-mbtN included); None if unknown."""
    if name.startswith("colocated-mbt"):
        return System(name, "direct", engines=2, max_num_batched_tokens=int(name.removeprefix("colocated-mbt")))
    try:
        found = systems_of([name], [])
    except ValueError:
        return None
    return found[0] if found else None


def bench_tandem_config(system: System, objective: Objective, *, budget: int, kv_cache_mib: int = 256,
                        max_num_seqs: int = 32, dtype: str = "bfloat16", model: str = "SmolLM2-135M-Instruct") -> ClusterConfig:
    args = SimpleNamespace(model=Path("/simulated") / model, dtype=dtype, max_model_len=2048, kv_cache_mib=kv_cache_mib,
                           max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, engine_niceness=None)
    return tandem_config(args, False, system, objective)
