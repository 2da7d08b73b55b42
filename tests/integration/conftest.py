"""One real cluster for the whole integration session: Ray, Ray Serve, two vLLM engines on
CPU (prefill producer, decode consumer), NIXL between them, the tiny float32 model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TEST_STATE

GATEWAY_PORT = 8765
MODEL_NAME = "tiny-llama"
MAX_MODEL_LEN = 512


AUTOSCALING_DECISIONS = TEST_STATE / "autoscaling-decisions.jsonl"
BATCH_PREFILL_AUTOSCALING = {
    "min_replicas": 1, "max_replicas": 2, "target_queued_prompt_tokens": 256,
    "upscale_delay_s": 2, "downscale_delay_s": 10, "cooldown_s": 5,
    "look_back_s": 3, "metrics_interval_s": 0.5, "decision_log": str(AUTOSCALING_DECISIONS),
}


def integration_config(model_dir: Path):
    from cluster.config import ClusterConfig

    # Compact JSON (no free whitespace) keeps the random tiny model's constrained answers short.
    engine = {"kv_cache_bytes": 64 << 20, "max_num_seqs": 8, "structured_outputs_backend": "xgrammar",
              "json_disable_whitespace": True}
    return ClusterConfig.model_validate(
        {
            "model": {"path": str(model_dir), "name": MODEL_NAME, "dtype": "float32",
                      "max_model_len": MAX_MODEL_LEN, "tool_parser": "hermes"},
            "gateway": {"host": "127.0.0.1", "port": GATEWAY_PORT},
            "tiers": {
                "interactive": {
                    # Two prefill engines, one per core, for the KV-aware routing test
                    # (test_kv_router.py); half a CPU each so both fit beside decode.
                    "prefill": {"replicas": 2, "num_cpus": 0.5, "cpu_binding": ["0", "1"], "engine": engine},
                    "decode": {"replicas": 1, "num_cpus": 1, "cpu_binding": ["1"], "engine": engine},
                },
                # A small second tier (issue 4), chosen per request with the tier header. Its
                # prefill pool autoscales 1..2 with short delays (test_tiers_autoscaling.py).
                # num_cpus 0: the interactive engines hold all of Ray's CPUs; batch shares the cores.
                "batch": {
                    "prefill": {"replicas": 1, "num_cpus": 0, "cpu_binding": ["0", "1"], "engine": engine,
                                "autoscaling": BATCH_PREFILL_AUTOSCALING},
                    "decode": {"replicas": 1, "num_cpus": 0, "cpu_binding": ["1"], "engine": engine},
                    "slo": {"ttft_s": 10, "itl_s": 1},
                },
            },
            # Short, so the prefill-outage test falls back quickly.
            "kv_transfer": {"prefill_timeout_s": 5},
            "ray": {"num_cpus": 2},
        }
    )


@pytest.fixture(scope="session")
def cluster(tiny_model_dir):
    from cluster.local import LocalCluster

    local = LocalCluster(integration_config(tiny_model_dir), cache_dir=TEST_STATE / "cache")
    local.start(ready_timeout_s=600)
    yield local
    local.stop()


@pytest.fixture(scope="session")
def base_url(cluster) -> str:
    return cluster.url


def replica_stats(deployment: str, replicas: int) -> dict:
    """{worker_id: EngineStats} of every replica of a pool. A handle call lands on one replica
    Serve picks, so this asks until it has heard from `replicas` distinct engines."""
    from ray import serve

    handle = serve.get_deployment_handle(deployment, app_name="tandem")
    seen: dict = {}
    for _ in range(100):
        stats = handle.stats.remote().result()
        seen[stats.worker_id] = stats
        if len(seen) == replicas:
            return seen
    raise AssertionError(f"heard from {sorted(seen)} only, expected {replicas} replicas of {deployment}")
