"""The control plane is charged for the tokens the client was streamed, each once (control_plane.py,
engine.py `SimRequest.streamed`): a remote prefill's sampled token counts only when the gateway
streams it as the first (decider rule 9's reuse); otherwise decode samples the first again."""

from __future__ import annotations

from cluster.config import ClusterConfig
from loadtest.bench.workload import Mix, RequestKind, poisson_schedule
from loadtest.sim.control_plane import from_benchmark
from loadtest.sim.run import simulate_tandem
from loadtest.sim.setups import cpu_hardware


def _config() -> ClusterConfig:
    # A KV cache of 11 blocks of 128 per engine (1,408 tokens): small enough that decode preempts,
    # with a context window it holds (vLLM refuses an engine that cannot hold max_model_len);
    # a tight gap objective so that rule 9 declines the first token's reuse for some remote requests.
    engine = {"kv_cache_memory_bytes": 32 << 20, "max_num_seqs": 16, "max_num_batched_tokens": 256,
              "enable_chunked_prefill": True}
    return ClusterConfig.model_validate({
        "model": {"path": "/simulated/m", "name": "m", "max_model_len": 1024},
        "tiers": {"interactive": {
            "prefill": {"replicas": 1, "engine": engine}, "decode": {"replicas": 1, "engine": engine},
            "slo": {"ttft_s": 1.5, "itl_s": 0.12, "max_gap_s": 0.2},
            "admission": {"max_running": 64, "max_queued": 256, "queue_timeout_s": 60}}},
        "routing": {"disaggregation": "adaptive"}})


def test_the_control_plane_is_charged_each_streamed_token_once():
    mix = Mix(RequestKind("prefill-heavy", 512, 8), RequestKind("decode-heavy", 64, 32), 0.7)
    hw, _ = cpu_hardware(0.26, 0.041, 512, 256, "bfloat16", source="test")
    result = simulate_tandem(_config(), hw, from_benchmark("tandem"), poisson_schedule(mix, 6.0, 4.0, 2), seed=1,
                             drain_timeout_s=60.0, control_cores=2, shares_engine_cores=2)
    verdicts = [d for _, d in result.trace.verdicts]
    # The run covers every way a token reaches the client: otherwise the equality below says less.
    assert all(r.ok for r in result.records)  # no stream cut short: every token sampled was delivered
    assert any(d.path == "remote" and d.reuse_first_token for d in verdicts)
    assert any(d.path == "remote" and not d.reuse_first_token for d in verdicts)
    assert any(d.path == "local" for d in verdicts)
    assert sum(e["preemptions"] for e in result.engines.values()) > 0
    streamed = sum(r.usage_tokens for r in result.records)
    assert streamed == sum(r.max_tokens for r in poisson_schedule(mix, 6.0, 4.0, 2))
    assert result.control["tokens"] == streamed
    assert result.control["requests"] == len(result.records)
