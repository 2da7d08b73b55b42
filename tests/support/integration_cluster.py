"""The integration session's cluster, as data and helpers: its fixed ports, its config (two
nodes, two tiers, five vLLM engines), and how tests read its metrics and replicas. The fixtures
that start and stop it are in tests/integration/conftest.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from loadtest.measure.prom import metric_sum
from tests.conftest import TEST_STATE

GATEWAY_PORT = 8765
MODEL_NAME = "tiny-llama"
MAX_MODEL_LEN = 512
RAY_PORT = 6391  # GCS of the two-node test cluster; not Ray's default, to stay clear of others
# Each Ray node's metrics export port (all of tandem's metrics, cluster/metrics.py).
METRICS_PORTS = {"head": 8766, "worker": 8767}
# Each node's own custom resource; a pool asks for 1 per replica (placement.resources).
NODE_RESOURCES = {"head": {"node_prefill": 8}, "worker": {"node_decode": 8}}
DASHBOARD_AGENT_PORT_WORKER = 52366  # the head's is Ray's default, 52365
# The session's OTLP/HTTP trace receiver (tests/support/otlp_receiver.py): every process and
# every vLLM engine exports there, sampling 0, so only a request that sends a sampled
# traceparent is traced (tests/integration/test_tracing.py) and the rest run untraced.
OTLP_PORT = 8768
RAY_TOKEN = TEST_STATE / "ray_auth_token"  # Ray's token auth is on, as for `tandem run`
# `ray start` for the worker node, on loopback like the head: Ray refuses a worker node while
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (which keeps 127.0.0.1 as the node address), and with it
# on rewrites 127.0.0.1 to this machine's address, where every Ray port listens on all
# interfaces. This is Ray's own CLI with that one rewrite left out.
_LOOPBACK_RAY_START = (
    "import sys; from ray._private import services; "
    "services.resolve_ip_for_localhost = lambda host: host; "
    "from ray.scripts.scripts import main; sys.exit(main())"
)


def ray_cli(*args: str, worker_node: bool = False) -> None:
    from cluster.local import LOCAL_RAY_ENV, ensure_ray_token, ray_auth_env

    env = {**os.environ, **LOCAL_RAY_ENV, **ray_auth_env(ensure_ray_token(RAY_TOKEN)),
           # Metrics reach the export port within 1 s instead of 10: tests poll for them.
           "RAY_metrics_report_interval_ms": "1000"}
    if worker_node:
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"
        cmd = [sys.executable, "-c", _LOOPBACK_RAY_START, *args]
    else:
        cmd = [str(Path(sys.executable).parent / "ray"), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"`ray {' '.join(args)}` failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def placed_on(node_resource: str, ray_address: str | None) -> dict:
    return {"placement": {"resources": {node_resource: 1}}} if ray_address else {}


AUTOSCALING_DECISIONS = TEST_STATE / "autoscaling-decisions.jsonl"
BATCH_PREFILL_AUTOSCALING = {
    "min_replicas": 1, "max_replicas": 2, "target_queued_prompt_tokens": 256,
    "upscale_delay_s": 2, "downscale_delay_s": 10, "cooldown_s": 5,
    "look_back_s": 3, "metrics_interval_s": 0.5, "decision_log": str(AUTOSCALING_DECISIONS),
}


# Two LoRA adapters of the tiny model (cluster/models/lora.py, seeded), served beside it by the
# cluster and by the direct vLLM server alike (tests/integration/compat_corpus/lora.json, test_lora.py).
LORA_SEEDS = {"tiny-lora-a": 1, "tiny-lora-b": 2}


def lora_adapters(model_dir: Path) -> dict[str, str]:
    """name → folder; written by make_lora_adapters before the cluster or the direct server starts."""
    return {name: str(TEST_STATE / "models" / name) for name in LORA_SEEDS}


def make_lora_adapters(model_dir: Path) -> None:
    from cluster.models.lora import make_lora_adapter

    for name, seed in LORA_SEEDS.items():
        make_lora_adapter(model_dir, Path(lora_adapters(model_dir)[name]), seed=seed)


def integration_config(model_dir: Path, ray_address: str | None = None):
    from cluster.config import ClusterConfig

    # Compact JSON (no free whitespace) keeps the random tiny model's constrained answers short.
    engine = {"kv_cache_memory_bytes": 64 << 20, "max_num_seqs": 8,
              "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True}}
    return ClusterConfig.model_validate(
        {
            "model": {"path": str(model_dir), "name": MODEL_NAME, "dtype": "float32",
                      "max_model_len": MAX_MODEL_LEN, "tool_parser": "hermes",
                      "lora_adapters": lora_adapters(model_dir), "max_loras": 2, "max_lora_rank": 8},
            "gateway": {"host": "127.0.0.1", "port": GATEWAY_PORT},
            "tiers": {
                "interactive": {
                    # Two prefill engines, one per core, for the KV-aware routing test
                    # (test_kv_router.py); half a CPU each so both fit on the head node.
                    "prefill": {"replicas": 2, "num_cpus": 0.5, "cpu_binding": ["0", "1"], "engine": engine,
                                **placed_on("node_prefill", ray_address)},
                    "decode": {"replicas": 1, "num_cpus": 1, "cpu_binding": ["1"], "engine": engine,
                               **placed_on("node_decode", ray_address)},
                    # Small bounds, so 3x capacity overflows the queue within seconds
                    # (test_faults_overload.py); no SLO shedding, as the default config: vLLM's
                    # benchmark at concurrency 8 completes everything (test_peer_clients.py).
                    "admission": {"max_running": 16, "max_queued": 32},
                    "slo": {"ttft_s": 2.0, "itl_s": 0.5},
                },
                # A small second tier (issue 4), chosen per request with the tier header. Its
                # prefill pool autoscales 1..2 with short delays (test_tiers_autoscaling.py).
                # num_cpus 0: the interactive engines hold all of Ray's CPUs; batch shares the cores.
                "batch": {
                    "prefill": {"replicas": 1, "num_cpus": 0, "cpu_binding": ["0", "1"], "engine": engine,
                                "autoscaling": BATCH_PREFILL_AUTOSCALING,
                                **placed_on("node_prefill", ray_address)},
                    "decode": {"replicas": 1, "num_cpus": 0, "cpu_binding": ["1"], "engine": engine,
                               **placed_on("node_decode", ray_address)},
                    "slo": {"ttft_s": 10, "itl_s": 1},
                },
            },
            # Short, so the prefill-outage test falls back quickly.
            "kv_transfer": {"prefill_timeout_s": 5},
            # Every request disaggregated, as the tests of the prefill hop (first token, KV
            # transfer, prefill faults, routing) expect; the adaptive decider is unit-tested
            # (tests/unit/test_decider*.py).
            "routing": {"disaggregation": "always"},
            "ray": {"address": ray_address} if ray_address else {"num_cpus": 2},
            "observability": {"tracing": {"enabled": True, "endpoint": f"http://127.0.0.1:{OTLP_PORT}/v1/traces",
                                          "protocol": "http", "sampling_ratio": 0.0, "engine_spans": True}},
        }
    )



def scrape_metrics() -> str:
    """The Prometheus text of every Ray node of the test cluster (what Prometheus would scrape)."""
    import httpx

    return "\n".join(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
                     for port in METRICS_PORTS.values())


def metric(name: str, text: Optional[str] = None, **labels: str) -> float:
    """Sum of the samples of `name` (exact, e.g. `ray_tandem_route_total`) whose labels include `labels`."""
    return metric_sum(scrape_metrics() if text is None else text, name, **labels)


def wait_for_metric(name: str, at_least: float, timeout_s: float = 30, **labels: str) -> float:
    """Poll until the metric reaches `at_least` (Ray exports every second here); returns the value."""
    deadline = time.monotonic() + timeout_s
    while (value := metric(name, **labels)) < at_least:
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}{labels} = {value} after {timeout_s} s, expected >= {at_least}")
        time.sleep(0.5)
    return value


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
