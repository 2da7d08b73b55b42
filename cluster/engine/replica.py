"""What the prefill and decode replicas share: the Ray Serve hooks around one Engine.

Runs in each engine replica's process (a Ray actor Serve made). The deployments
(prefill_workers/, decode_workers/) take the engine class as an argument (cluster/app.py
build_app passes VLLMEngine, tests/serve/ FakeEngine) and call `start_engine` from their
constructor; Serve then calls the hooks below; `__del__` stops the metrics and shuts the
engine down.

A replica learns its rank from Ray Serve, takes the CPU core slot for that rank and a free
NIXL side-channel port; its engine binds the KV-event publisher and replay sockets on ports
the OS picks. All of them are on the node's own cluster address (127.0.0.1 locally, the pod
IP on Kubernetes), never on all interfaces. The replica reports them to the gateway's router
through Ray Serve's routing stats, so new replicas (autoscaling, restarts) need no manual
wiring.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, Callable, Optional

from cluster.autoscaling.signals import ReplicaSignals
from cluster.config import ClusterConfig
from cluster.engine.base import Engine, EngineInfo, EngineSpec, EngineTracing, LoraLimits
from cluster.engine.lora_state import LoraResidency, lora_report
from cluster.engine.metrics import ITL_COUNT, ITL_SUM, EngineMetricsExporter, EngineStats
from cluster.engine.metrics import engine_stats as engine_stats_of
from cluster.hardware import cpu_flags, engine_dtype, has_nvidia_gpu
from cluster.tracing import Tracing
from cluster.types import PoolId, RoutingStats
from kv_transfer.nixl import KVRole, claim_side_channel

log = logging.getLogger(__name__)

# What a deployment is given to make its engine: an Engine class (or any callable) from a spec.
EngineFactory = Callable[[EngineSpec], Engine]


# Addresses that bind every interface: engine sockets carry prompts (KV events hold token ids).
_WILDCARDS = frozenset({"", "*", "0.0.0.0", "::", "[::]"})


def _ray_node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def node_address(configured: str, ray_node_ip: Callable[[], str] = _ray_node_ip) -> str:
    """The node's cluster address engine sockets (NIXL side channel, KV events) bind on:
    kv_transfer.side_channel_host, or for "auto" (multi-node, the Helm chart) the Ray node IP
    other nodes reach this replica at. Never a wildcard."""
    host = ray_node_ip() if configured == "auto" else configured
    if host in _WILDCARDS:
        raise ValueError(f"engine sockets must bind one address, not {host!r} "
                         "(kv_transfer.side_channel_host: 127.0.0.1 locally, auto on Kubernetes)")
    return host


def replica_rank_and_id() -> tuple[int, str]:
    try:
        from ray import serve

        ctx = serve.get_replica_context()
        rank = getattr(ctx.rank, "rank", ctx.rank)
        return int(rank or 0), ctx.replica_id.unique_id
    except Exception:  # outside Serve (unit use): a single, anonymous replica
        return 0, socket.gethostname()


def engine_tracing(tracing) -> Optional[EngineTracing]:
    """Where vLLM's own engine spans go (observability.tracing.engine_spans), or None."""
    if not (tracing.enabled and tracing.engine_spans and tracing.exporter == "otlp"):
        return None
    return EngineTracing(tracing.endpoint, tracing.protocol, f"{tracing.service_name_prefix}-engine")


def build_engine_spec(cfg: ClusterConfig, tier: str, role: KVRole) -> EngineSpec:
    pool_name = "prefill" if role == "kv_producer" else "decode"
    pool = cfg.tiers[tier].pools()[pool_name]
    rank, replica_id = replica_rank_and_id()
    on_gpu = has_nvidia_gpu()
    binding: Optional[str] = None
    if pool.cpu_binding:
        binding = pool.cpu_binding[rank % len(pool.cpu_binding)]
    host = node_address(cfg.kv_transfer.side_channel_host)
    return EngineSpec(
        model_path=cfg.model.path,
        served_name=cfg.model.served_name,
        dtype=engine_dtype(cfg.model.dtype, on_gpu, cpu_flags()),
        max_model_len=cfg.model.max_model_len,
        engine=pool.engine,
        kv_role=role,
        kv=cfg.kv_transfer,
        nixl=claim_side_channel(host, cfg.kv_transfer.side_channel_ports),
        cpu_binding=binding,
        on_gpu=on_gpu,
        # The same id the router derives from the Serve replica id (router/routing/service.py).
        worker_id=PoolId(tier, pool_name).worker_id(replica_id),
        kv_events_host=host if cfg.routing.kv_events and pool.engine.enable_prefix_caching else None,
        reasoning_parser=cfg.model.reasoning_parser,
        config_key=f"tiers.{tier}.{pool_name}.engine",
        pool=PoolId(tier, pool_name),
        tracing=engine_tracing(cfg.observability.tracing),
        lora=LoraLimits(cfg.model.max_loras, cfg.model.max_lora_rank, tuple(cfg.model.lora_adapters))
        if cfg.model.lora_adapters else None,
    )


class EngineReplica:
    """Base of the prefill and decode deployments: owns one engine for the replica's life.

    A subclass's __init__ calls `start_engine(engine_cls(spec), tier)`; Serve then calls the
    hooks below; `__del__` stops the metrics and shuts the engine down.
    """

    engine: Engine
    info: EngineInfo
    _signals: Optional[ReplicaSignals] = None
    _metrics: Optional[EngineMetricsExporter] = None
    tracing: Optional[Tracing] = None  # observability.tracing; the deployment's __init__ sets it

    def start_engine(self, engine: Engine, tier: str) -> None:
        """Start the engine (blocks until it takes requests), then publish its metrics."""
        self.engine = engine
        self.info = engine.start()
        self.export_metrics(tier)

    def export_metrics(self, tier: str) -> None:
        """Publish the exact sums of this engine's vLLM histograms (labelled tier, pool, replica)
        every 2 s; vLLM's own series go out through its Ray stat logger (vllm_ray_metrics.py)."""
        pool = "prefill" if self.info.kv_role == "kv_producer" else "decode"
        self._metrics = EngineMetricsExporter(tier, pool, self.info.worker_id, self.engine.metrics).start()

    @property
    def signals(self) -> ReplicaSignals:
        """This replica's autoscaling signals, made on first use (subclasses own __init__),
        from the engine's own reading."""
        if self._signals is None:
            self._signals = ReplicaSignals(self.engine.metrics)
        return self._signals

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Ray Serve's hook: called every record period when the pool autoscales."""
        return self.signals.sample()

    def span_attributes(self, request: Any) -> dict[str, Any]:
        """What a replica's span of `request` says (cluster/tracing.py): counts and names only."""
        return {"tandem.worker": self.info.worker_id, "gen_ai.usage.input_tokens": len(request.prompt_token_ids)}

    def describe(self) -> dict:
        """Who this replica is (engine id, NIXL side-channel port, KV-event endpoints, CPU
        cores) and how many prompt tokens it has computed: one call tells which replica served."""
        spec = self.engine.spec
        events = self.info.kv_events
        return {
            "worker_id": self.info.worker_id,
            "nixl_port": spec.nixl.port if spec.nixl else None,
            "kv_events": [events.endpoint, events.replay_endpoint] if events else [],
            "cpu_binding": spec.cpu_binding,
            "prompt_tokens_computed": self.engine.stats().prompt_tokens_computed,
        }

    _itl_seen: tuple[float, float] = (0.0, 0.0)  # vLLM's token-gap (sum, count) at the last report

    async def record_routing_stats(self) -> dict:
        """Ray Serve's hook (every request_routing_stats_period_s): `routing_stats()`, with vLLM's
        adapter cache read first where the engine serves LoRA. Async, so that Serve runs it on the
        replica's event loop: a sync hook runs in a thread pool (Ray 2.60's default,
        RAY_SERVE_RUN_SYNC_IN_THREADPOOL), where the call into the EngineCore cannot be awaited
        and the cache was never read (found on real engines: no eviction ever counted)."""
        await self._refresh_loras()
        return await asyncio.to_thread(self.routing_stats)  # reads vLLM's registry: off the loop, as before

    def routing_stats(self) -> dict:
        """The routing stats, delivered to the gateway's request router: who this engine is, where its KV events are, how it hashes blocks, and
        the P/D decider's live state (router/routing/decider.py): a prefill engine's queued
        prompt tokens; its running sequences and, when it streamed tokens since the last report,
        its mean token gap (`step_s`, over `step_n` gaps) for the step cost model.
        Values are rounded so the stats (broadcast on change) stay still while idle."""
        info = self.info
        values = self.engine.metrics()  # one reading for all of this report
        engine_stats = engine_stats_of(info.worker_id, values)
        events = info.kv_events
        report = dict(worker_id=info.worker_id, **info.cache.as_stats(),
                      kv_usage=round(engine_stats.kv_cache_usage, 1),
                      running_seqs=int(engine_stats.requests_running),
                      kv_events=events.endpoint if events else None,
                      kv_replay=events.replay_endpoint if events else None)
        if info.kv_role == "kv_producer":
            report["queued_prompt_tokens"] = self.signals.queued_prompt_tokens
        report.update(self._lora_report())
        # Both roles: a prefill engine's gaps are those of the whole requests it streams.
        itl = (values.get(ITL_SUM, 0.0), values.get(ITL_COUNT, 0.0))
        gaps = itl[1] - self._itl_seen[1]
        if gaps > 0:
            report["step_s"] = round((itl[0] - self._itl_seen[0]) / gaps, 3)
            report["step_n"] = int(gaps)
        self._itl_seen = itl
        return RoutingStats(**report).to_dict()

    _lora: Optional[LoraResidency] = None

    def _lora_residency(self) -> LoraResidency:
        if self._lora is None:
            limits = self.engine.spec.lora
            pool = "prefill" if self.info.kv_role == "kv_producer" else "decode"
            tier = self.engine.spec.pool.tier if self.engine.spec.pool else ""
            self._lora = LoraResidency({i + 1: name for i, name in enumerate(limits.adapters)},
                                       {"tier": tier, "pool": pool, "replica": self.info.worker_id})
        return self._lora

    def _lora_report(self) -> dict:
        """The routing stats' adapters (cluster/engine/lora_state.py): vLLM's gauge read now, and
        its adapter cache as of the last refresh (record_routing_stats). Nothing without LoRA."""
        limits = self.engine.spec.lora
        if limits is None:
            return {}
        return lora_report(self.engine.lora_info(), self._lora_residency().resident, limits.max_loras)

    async def _refresh_loras(self) -> None:
        """vLLM's adapter cache now, evictions since the last look counted; bounded, and never a
        failed report over it (routing keeps the gauge's view)."""
        if self.engine.spec.lora is None:
            return
        try:
            ids = await asyncio.wait_for(self.engine.resident_loras(), 5.0)
        except Exception:
            log.debug("adapter cache of %s not read", self.info.worker_id, exc_info=True)
            return
        if ids is not None:
            gone = self._lora_residency().observe(ids)
            if gone:
                log.info("%s evicted LoRA adapters %s", self.info.worker_id, sorted(gone))

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def check_health(self) -> None:
        """Ray Serve's health probe: a dead EngineCore marks the replica unhealthy → replaced."""
        self.engine.check_alive()

    def __del__(self):
        # Serve calls __del__ on graceful teardown; without it the EngineCore child and its
        # /dev/shm segments outlive the replica.
        if self._metrics is not None:
            self._metrics.stop()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
        if self.tracing is not None:
            self.tracing.shutdown()  # flushes the spans still batched
