"""The single place that wires the Ray Serve application from a ClusterConfig."""

from __future__ import annotations

from ray.serve import Application

from cluster.config import ClusterConfig, PoolConfig

APP_NAME = "tandem"


def _pool_options(pool: PoolConfig) -> dict:
    return {
        "num_replicas": pool.replicas,
        "ray_actor_options": {"num_cpus": pool.num_cpus, "num_gpus": pool.num_gpus},
        # vLLM's engine start takes tens of seconds on CPU; don't let Serve give up early.
        "health_check_period_s": 10,
        "health_check_timeout_s": 60,
        "graceful_shutdown_timeout_s": 20,
        "max_ongoing_requests": max(pool.engine.max_num_seqs * 2, 8),
    }


def build_app(cfg: ClusterConfig) -> Application:
    # Imported here so `tandem --help` and config validation stay fast and Ray-free.
    from decode_workers.deployment import DecodeWorker
    from prefill_workers.deployment import PrefillWorker
    from router.gateway import Gateway

    prefill = PrefillWorker.options(**_pool_options(cfg.pools.prefill)).bind(cfg)
    decode = DecodeWorker.options(**_pool_options(cfg.pools.decode)).bind(cfg)
    return Gateway.options(max_ongoing_requests=1000).bind(cfg, prefill, decode)
