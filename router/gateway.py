"""The gateway: Ray Serve's HTTP ingress. It owns the tokenizer and the OpenAI edge and
drives each request through the pools via DisaggregatedBackend. It holds no engine, so it
asks Ray for no CPU (on 2 cores, a CPU for it would leave an engine replica pending)."""

from __future__ import annotations

from ray import serve

from cluster.config import ClusterConfig
from cluster.protocol import TierPools
from cluster.serve_patch import bind_replica_grpc_on_node_address
from router.admission import AdmissionControl
from router.auth import ApiKeyAuth
from router.disagg import DisaggregatedBackend
from router.openai.app import build_openai_app
from router.openai.tokenizer import PromptTokenizer
from router.openai.tools import ToolCalling
from router.prewarm import HandshakeWarmer
from router.ratelimit_shared import rate_limiter_from_config
from router.request_metrics import HttpMetricsMiddleware, MeasuredBackend, declare_series
from router.routing.build import build_kv_router


@serve.deployment(name="Gateway", ray_actor_options={"num_cpus": 0})
@serve.ingress()
class Gateway:
    def __init__(self, cfg: ClusterConfig, pools: dict[str, TierPools]):
        bind_replica_grpc_on_node_address()  # loopback on a local cluster (cluster/serve_patch.py)
        self.cfg = cfg
        self.backend = DisaggregatedBackend(
            model_id=cfg.model.served_name,
            max_model_len=cfg.model.max_model_len,
            tokenizer=(tokenizer := PromptTokenizer(cfg.model.path)),
            pools=pools,
            default_tier=cfg.default_tier,
            prefill_timeout_s=cfg.kv_transfer.prefill_timeout_s,
            router=(router := build_kv_router(cfg)),
            first_token_reuse=cfg.kv_transfer.first_token_reuse,
            decode_first_token_timeout_s=cfg.gateway.decode_first_token_timeout_s,
        )
        # Every prefill/decode pair does its NIXL handshake before user traffic needs it.
        self.warmer = HandshakeWarmer(pools=pools, model_id=cfg.model.served_name, router=router)
        # The model's vLLM tool parser (model.tool_parser); an unknown name fails the start here.
        self.tool_calling = ToolCalling.from_config(cfg, tokenizer.hf)
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
        declare_series(list(cfg.tiers))

    async def check_health(self) -> None:
        """Serve's health probe, the first call made on the replica's event loop: it starts
        the handshake warmer (idempotent)."""
        self.warmer.start()

    def __serve_build_asgi_app__(self):
        # No /metrics here: metrics are Ray metrics, on each Ray node's metrics port, never
        # on the public API port (cluster/metrics.py).
        app = build_openai_app(
            self.measured, max_body_bytes=self.cfg.gateway.max_body_bytes,
            body_read_timeout_s=self.cfg.gateway.body_read_timeout_s,
            health_interval_s=self.cfg.gateway.health_interval_s,
            allowed_hosts=self.cfg.gateway.resolved_allowed_hosts(), authenticate=self.auth.tier_of,
            # Per-tenant prefix caches (auth.prefix_cache): a salt per tenant, in both hops and the router.
            cache_salt=self.auth.cache_salt_of if self.cfg.auth.isolates_prefix_cache() else None,
            rate_limit=self.rate_limits.hook(self.auth.tenant_of) if self.rate_limits.active else None,
            tool_calling=self.tool_calling,
        )
        app.add_middleware(HttpMetricsMiddleware)
        return app
