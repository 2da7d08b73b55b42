"""The gateway: the cluster's HTTP entry, a Ray Serve deployment. vLLM's own OpenAI app
(router/openai/app.py) over tandem's engine client, which drives each request through
admission, metrics and the pools (DisaggregatedBackend). It holds no engine, so it asks Ray for
no CPU (on 2 cores, a CPU for it would leave an engine replica pending).

Two ingresses, one body (GatewayReplica), chosen by `gateway.ingress` in cluster/app.py:
`Gateway` (direct, the default) serves HTTP from the replica itself; `ServeIngressGateway`
is Serve's ingress behind its HTTP proxy.

Lifecycle: __init__ builds the served model's VllmConfig (config + tokenizer, no weights) and
the backend chain, and (direct) starts the HTTP server; Serve's ingress instead calls
`__serve_build_asgi_app__` once. Serve then calls `check_health` periodically (the first call
starts the NIXL handshake warmer), and `__del__` on teardown stops the server and closes what
holds threads and connections (`close_gateway`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

from ray import serve
from vllm.tokenizers import cached_tokenizer_from_config

from cluster.config import ClusterConfig
from cluster.engine.vllm import structured_outputs_config
from cluster.types import TierPools
from cluster.serve_patch import bind_replica_grpc_on_node_address
from cluster.tracing import Tracing
from cluster.hardware import engine_dtype_here
from router.admission import AdmissionControl
from router.auth import ApiKeyAuth
from router.pd.path import DisaggregatedBackend
from router.openai.app import build_openai_app, vllm_config_of, vllm_server_args
from router.openai.engine_client import PDEngineClient
from router.openai.server import GatewayServer
from router.pd.hops import Hops
from router.pd.prewarm import HandshakeWarmer
from router.ratelimit import RateLimiter
from router.ratelimit_shared import SharedRateLimiter, rate_limiter_from_config
from router.request_metrics import HttpMetricsMiddleware, MeasuredBackend, declare_series
from router.routing.build import build_kv_router
from router.routing.service import KVRouter
from router.tracing import TracingEdge, instrument_gateway

log = logging.getLogger(__name__)


class GatewayReplica:
    """What every gateway replica holds, whichever ingress serves its HTTP app."""

    tracing: Optional[Tracing] = None  # observability.tracing (None: off)
    # How long a removed replica's open HTTP streams may still run (cluster/app.py gateway_drain_s).
    drain_s: float = 5.0

    def __init__(self, cfg: ClusterConfig, pools: dict[str, TierPools], drain_s: float = 5.0):
        bind_replica_grpc_on_node_address()  # loopback on a local cluster (cluster/serve_patch.py)
        self.cfg, self.drain_s = cfg, drain_s
        default_engine = cfg.tiers[cfg.default_tier].decode.engine
        # `vllm serve`'s own arguments for this model: its renderer, parsers and defaults.
        self.args = vllm_server_args(
            model_path=cfg.model.path, served_name=cfg.model.served_name, dtype=engine_dtype_here(cfg.model.dtype),
            max_model_len=cfg.model.max_model_len, tool_parser=cfg.model.tool_parser,
            reasoning_parser=cfg.model.reasoning_parser,
            structured_outputs=structured_outputs_config(default_engine, cfg.model.reasoning_parser),
            lora_adapters=cfg.model.lora_adapters, max_loras=cfg.model.max_loras, max_lora_rank=cfg.model.max_lora_rank)
        vllm_config = vllm_config_of(self.args)
        self.router = build_kv_router(cfg)
        self.backend = DisaggregatedBackend(
            pools=pools,
            prefill_timeout_s=cfg.kv_transfer.prefill_timeout_s,
            router=self.router,
            first_token_reuse=cfg.kv_transfer.first_token_reuse,
            decode_first_token_timeout_s=cfg.gateway.decode_first_token_timeout_s,
            decode_streams=cfg.gateway.decode_streams,
            migration_limit=cfg.kv_transfer.migration_limit,
            # The renderer's own (cached) tokenizer: the text of an answer continued mid-character.
            tokenizer=cached_tokenizer_from_config(vllm_config.model_config),
        )
        # Every prefill/decode pair does its NIXL handshake before user traffic needs it.
        self.warmer = HandshakeWarmer(pools=pools, router=self.router)
        # API key → tenant → tier; warns at start-up when the API is open (no keys).
        self.auth = ApiKeyAuth.from_config(cfg)
        # Per-tenant requests/tokens per minute (auth.tenants.*.rate_limit), per gateway replica
        # or shared by all of them in Redis (auth.rate_limit_store).
        self.rate_limits = rate_limiter_from_config(cfg)
        # Bounded queue per tier in front of the pools: 429 with Retry-After beyond it.
        self.admission = AdmissionControl(self.backend, {tier: t.admission for tier, t in cfg.tiers.items()})
        # Outermost, so TTFT includes the admission queue and 429s count as outcomes.
        self.measured = MeasuredBackend(self.admission, cfg.model.lora_adapters)
        # observability.tracing: this process's tracer (None when off: nothing below traces).
        self.tracing = Tracing.from_config(cfg.observability.tracing, "gateway")
        traced = instrument_gateway(self.tracing, backend=self.backend, router=self.router,
                                    admission=self.admission, outer=self.measured)
        # The key is checked once, at the edge (auth.caller); the limits read the tenant it found.
        rate_limit = self.rate_limits.hook() if self.rate_limits.active else None
        self.engine_client = PDEngineClient(vllm_config, traced, cfg.default_tier,
                                            rate_limit=rate_limit)
        declare_series(list(cfg.tiers), list(cfg.model.lora_adapters))

    async def check_health(self) -> None:
        """Serve's health probe, the first call made on the replica's event loop: it starts
        the handshake warmer (idempotent)."""
        self.warmer.start()

    async def build_http_app(self):
        # No /metrics here: metrics are Ray metrics, on each Ray node's metrics port, never
        # on the public API port (cluster/metrics.py).
        gw = self.cfg.gateway
        app = await build_openai_app(
            self.engine_client, self.args,
            # API key → tenant, tier and (auth.prefix_cache isolate) the tenant's cache salt, once.
            authenticate=self.auth.caller, health_probe=self.admission.health,
            max_body_bytes=gw.max_body_bytes, body_read_timeout_s=gw.body_read_timeout_s,
            health_interval_s=gw.health_interval_s, allowed_hosts=gw.resolved_allowed_hosts(),
            ready_wait_s=gw.ready_wait_s, max_ready_waiters=gw.max_ready_waiters,
        )
        app = HttpMetricsMiddleware(app)
        return app if self.tracing is None else TracingEdge(app, self.tracing)

    async def close(self) -> None:
        await close_gateway(self.warmer, self.router, self.rate_limits, self.engine_client, self.backend.hops)
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # flushes what is still batched


@serve.deployment(name="Gateway", ray_actor_options={"num_cpus": 0})
class Gateway(GatewayReplica):
    """`gateway.ingress: direct`: the replica serves HTTP itself (router/openai/server.py);
    Serve runs no HTTP proxy. Serve awaits an async __init__ on the replica's event loop."""

    async def __init__(self, cfg: ClusterConfig, pools: dict[str, TierPools],  # type: ignore[misc]
                       drain_s: float = 5.0):
        super().__init__(cfg, pools, drain_s)
        await _refuse_beside_serve_proxy()
        self.server = await GatewayServer.start(await self.build_http_app(), cfg.gateway.host, cfg.gateway.port)

    async def __del__(self):
        """Serve's teardown, awaited by Serve on replica shutdown (ray/serve/_private/replica.py
        accepts an async __del__): the listening socket first, so no new request arrives, then
        the open streams run to their end or the drain deadline (a redeploy's old gateway: its
        replacement already listens on the same port, cluster/app.py gateway_options)."""
        server = getattr(self, "server", None)
        if server is not None:
            await server.stop(drain_s=self.drain_s)
        await self.close()


async def _refuse_beside_serve_proxy() -> None:
    """Serve's HTTP proxy binds its port with SO_REUSEPORT, as the gateway does: started on the
    same port, the kernel would split connections between them and the proxy's half would fail
    (it finds no ingress). Serve must run without a proxy (cluster/app.py proxy_location)."""
    status = await asyncio.to_thread(serve.status)
    if status.proxies:
        raise RuntimeError("gateway.ingress is direct but Serve runs an HTTP proxy "
                           f"({len(status.proxies)} node(s)): start Serve with proxy_location Disabled "
                           "(cluster/app.py proxy_location), or set gateway.ingress: serve")


@serve.deployment(name="Gateway", ray_actor_options={"num_cpus": 0})
@serve.ingress()
class ServeIngressGateway(GatewayReplica):
    """`gateway.ingress: serve`: Serve's HTTP proxy relays every request and chunk to the replica."""

    async def __serve_build_asgi_app__(self):
        return await self.build_http_app()

    async def __del__(self):
        await self.close()


async def close_gateway(warmer: HandshakeWarmer, router: KVRouter, rate_limits: RateLimiter | SharedRateLimiter,
                        engine_client: PDEngineClient, hops: Hops) -> None:
    """Release what a gateway replica holds, each part even when another fails: the handshake
    warmer's task, the KV-event subscriber threads and the prefix index client (KVRouter.close,
    a Redis connection with the redis backend), the shared rate limiter's Redis connection, the
    decode channels' subscriptions (Hops.close), the renderer's thread pools."""
    results = await asyncio.gather(warmer.stop(), asyncio.to_thread(router.close), _close(rate_limits), hops.close(),
                                   return_exceptions=True)
    for part, result in zip(("handshake warmer", "KV router", "rate limiter", "decode channels"), results):
        if isinstance(result, BaseException):
            log.warning("gateway teardown: closing the %s failed: %r", part, result)
    engine_client.shutdown()


async def _close(rate_limits: RateLimiter | SharedRateLimiter) -> None:
    close = getattr(rate_limits, "close", None)  # the in-memory limiter holds nothing
    if close is not None:
        await close()
