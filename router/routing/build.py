"""The gateway's KVRouter from the cluster config (the one place routing is wired)."""

from __future__ import annotations

from typing import Any

from cluster.config import ClusterConfig
from cluster.types import ROLES, PoolId
from router.prefix_index import make_index
from router.prefix_index.redis_index import tls_of
from router.routing.decider import Objectives, PDDecider
from router.routing.directory import pool_directory
from router.routing.pipeline import LORA_DEFAULT_WEIGHT
from router.routing.metrics import LORA_ROUTES
from router.routing.service import LORA_AFFINITY, KVRouter


def routing_weights(cfg: ClusterConfig) -> dict[str, float]:
    """routing.weights, with the lora scorer's: its default (pipeline.LORA_DEFAULT_WEIGHT) when
    adapters are configured and the YAML names none; none at all without adapters, so a config
    without LoRA scores and picks exactly as before the scorer existed."""
    weights = dict(cfg.routing.weights)
    if not cfg.model.lora_adapters:
        weights.pop("lora", None)
    else:
        weights.setdefault("lora", LORA_DEFAULT_WEIGHT)
    return weights


def kv_router_settings(cfg: ClusterConfig) -> dict[str, Any]:
    """The KVRouter's policy from the cluster config: weights, picker, decider, objectives, token
    budgets. One place, shared by the gateway (below) and the simulator (loadtest/sim), which runs
    the same router on a simulated clock."""
    routing = cfg.routing
    objectives = {tier: Objectives(ttft_s=t.slo.ttft_s, itl_s=t.slo.itl_s, gap_s=t.slo.gap_s)
                  for tier, t in cfg.tiers.items()}
    # The decode engine's prefill tokens per step; unset: vLLM's chunked-prefill default.
    budgets = {tier: t.decode.engine.max_num_batched_tokens for tier, t in cfg.tiers.items()
               if t.decode.engine.max_num_batched_tokens}
    prefill_budgets = {tier: t.prefill.engine.max_num_batched_tokens for tier, t in cfg.tiers.items()
                       if t.prefill.engine.max_num_batched_tokens}
    decider = PDDecider(routing.decode_only_below_tokens, routing.disaggregation, routing.whole_on_prefill_max_tokens,
                        routing.whole_on_prefill_when_decode_full)
    return dict(weights=routing_weights(cfg), decider=decider, picker=routing.picker, objectives=objectives,
                chunk_budgets=budgets, prefill_chunk_budgets=prefill_budgets)


def build_kv_router(cfg: ClusterConfig) -> KVRouter:
    routing = cfg.routing
    index = None
    if routing.kv_events:
        index = make_index(routing.index.backend, redis_url=routing.index.redis_url,
                           redis_password=routing.index.resolve_redis_password(),
                           redis_username=routing.index.redis_username,
                           redis_tls=tls_of(routing.index.redis_tls), prefix=routing.index.key_prefix,
                           key_ttl_s=routing.index.key_ttl_s)
    directories = {
        (tier, role): pool_directory(PoolId(tier, role)) for tier in cfg.tiers for role in ROLES
    }
    if cfg.model.lora_adapters:  # exported at 0: the dashboard's hit rate reads 0 requests, not "no data"
        for tier in cfg.tiers:
            for role in ROLES:
                for affinity in LORA_AFFINITY.values():
                    LORA_ROUTES.labels(tier=tier, pool=role, affinity=affinity).inc(0)
    return KVRouter(directories=directories, index=index, **kv_router_settings(cfg))
