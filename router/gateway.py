"""The gateway: Ray Serve's HTTP ingress. vLLM's own OpenAI app (router/openai/app.py) over
tandem's engine client, which drives each request through admission, metrics and the pools
(DisaggregatedBackend). It holds no engine, so it asks Ray for no CPU (on 2 cores, a CPU for
it would leave an engine replica pending).

Lifecycle: __init__ builds the served model's VllmConfig (config + tokenizer, no weights) and
the backend chain; Serve then calls `__serve_build_asgi_app__` once (vLLM's app state is
async to build), `check_health` periodically (the first call starts the NIXL handshake
warmer), and `__del__` on teardown closes what holds connections.
"""

from __future__ import annotations

import asyncio
import logging

from ray import serve

from cluster.config import ClusterConfig
from cluster.engine.vllm import structured_outputs_config
from cluster.protocol import TierPools
from cluster.serve_patch import bind_replica_grpc_on_node_address
from cluster.hardware import engine_dtype_here
from router.admission import AdmissionControl
from router.auth import ApiKeyAuth
from router.disagg import DisaggregatedBackend
from router.openai.app import build_openai_app, vllm_config_of, vllm_server_args
from router.openai.engine_client import PDEngineClient
from router.prewarm import HandshakeWarmer
from router.ratelimit_shared import rate_limiter_from_config
from router.request_metrics import HttpMetricsMiddleware, MeasuredBackend, declare_series
from router.routing.build import build_kv_router

log = logging.getLogger(__name__)


@serve.deployment(name="Gateway", ray_actor_options={"num_cpus": 0})
@serve.ingress()
class Gateway:
    def __init__(self, cfg: ClusterConfig, pools: dict[str, TierPools]):
        bind_replica_grpc_on_node_address()  # loopback on a local cluster (cluster/serve_patch.py)
        self.cfg = cfg
        default_engine = cfg.tiers[cfg.default_tier].decode.engine
        # `vllm serve`'s own arguments for this model: its renderer, parsers and defaults.
        self.args = vllm_server_args(
            model_path=cfg.model.path, served_name=cfg.model.served_name, dtype=engine_dtype_here(cfg.model.dtype),
            max_model_len=cfg.model.max_model_len, tool_parser=cfg.model.tool_parser,
            reasoning_parser=cfg.model.reasoning_parser,
            structured_outputs=structured_outputs_config(default_engine, cfg.model.reasoning_parser))
        self.router = build_kv_router(cfg)
        self.backend = DisaggregatedBackend(
            model_id=cfg.model.served_name,
            pools=pools,
            default_tier=cfg.default_tier,
            prefill_timeout_s=cfg.kv_transfer.prefill_timeout_s,
            router=self.router,
            first_token_reuse=cfg.kv_transfer.first_token_reuse,
            decode_first_token_timeout_s=cfg.gateway.decode_first_token_timeout_s,
        )
        # Every prefill/decode pair does its NIXL handshake before user traffic needs it.
        self.warmer = HandshakeWarmer(pools=pools, model_id=cfg.model.served_name, router=self.router)
        # API key → tenant → tier; warns at start-up when the API is open (no keys).
        self.auth = ApiKeyAuth.from_config(cfg)
        # Per-tenant requests/tokens per minute (auth.tenants.*.rate_limit), per gateway replica
        # or shared by all of them in Redis (auth.rate_limit_store).
        self.rate_limits = rate_limiter_from_config(cfg)
        # Bounded queue per tier in front of the pools: 429 with Retry-After beyond it.
        self.admission = AdmissionControl(
            self.backend, {tier: t.admission for tier, t in cfg.tiers.items()}, cfg.default_tier
        )
        # Outermost, so TTFT includes the admission queue and 429s count as outcomes.
        self.measured = MeasuredBackend(self.admission, cfg.default_tier)
        rate_limit = None
        if self.rate_limits.active:
            rate_limit = self.rate_limits.hook(self.auth.tenant_of)
        self.engine_client = PDEngineClient(vllm_config_of(self.args), self.measured, cfg.default_tier,
                                            rate_limit=rate_limit)
        declare_series(list(cfg.tiers))

    async def check_health(self) -> None:
        """Serve's health probe, the first call made on the replica's event loop: it starts
        the handshake warmer (idempotent)."""
        self.warmer.start()

    async def __serve_build_asgi_app__(self):
        # No /metrics here: metrics are Ray metrics, on each Ray node's metrics port, never
        # on the public API port (cluster/metrics.py).
        gw = self.cfg.gateway
        app = await build_openai_app(
            self.engine_client, self.args,
            authenticate=self.auth.tier_of, health_probe=self.admission.health,
            # Per-tenant prefix caches (auth.prefix_cache): a salt per tenant, in both hops and the router.
            cache_salt=self.auth.cache_salt_of if self.cfg.auth.isolates_prefix_cache() else None,
            max_body_bytes=gw.max_body_bytes, body_read_timeout_s=gw.body_read_timeout_s,
            health_interval_s=gw.health_interval_s, allowed_hosts=gw.resolved_allowed_hosts(),
        )
        return HttpMetricsMiddleware(app)

    async def __del__(self):
        """Serve's teardown (awaited by Serve): the warmer, the KV-event followers, the Redis
        connections, the renderer's threads."""
        await self.warmer.stop()
        await asyncio.gather(_maybe_close(self.router), _maybe_close(self.rate_limits), return_exceptions=True)
        self.engine_client.shutdown()


async def _maybe_close(obj) -> None:
    close = getattr(obj, "close", None)
    if close is None:
        return
    result = close()
    if asyncio.iscoroutine(result):
        await result
