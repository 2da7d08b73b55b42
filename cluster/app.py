"""The single place that wires the Ray Serve application from a ClusterConfig."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from cluster.autoscaling.serve_policy import serve_autoscaling_config
from cluster.config import AdmissionConfig, ClusterConfig, PoolConfig, SLOConfig
from cluster.types import PoolId, TierPools
from kv_transfer.handoff import KV_LEASE_S, LEASE_MARGIN_S

if TYPE_CHECKING:
    from cluster.engine.replica import EngineFactory


def _actor_options(pool: PoolConfig) -> dict:
    """Ray resources of one replica, and where it may run (pool.placement, multi-node)."""
    options: dict = {"num_cpus": pool.num_cpus, "num_gpus": pool.num_gpus}
    if pool.placement.resources:
        options["resources"] = dict(pool.placement.resources)
    if pool.placement.node_labels:
        options["label_selector"] = dict(pool.placement.node_labels)
    return options


def _pool_options(pool: PoolConfig, role: str, slo: SLOConfig, admission: AdmissionConfig,
                  max_model_len: int) -> dict:
    options = {
        "num_replicas": pool.replicas,
        "ray_actor_options": _actor_options(pool),
        # vLLM's engine start takes tens of seconds on CPU; don't let Serve give up early.
        "health_check_period_s": 10,
        "health_check_timeout_s": 60,
        # Serve's own drain: a replica it removes gets no new requests and is stopped once its
        # ongoing ones (each decode stream's run call, its step subscription) end, or at this
        # deadline; streams cut there migrate (router/pd/migration.py).
        "graceful_shutdown_timeout_s": drain_timeout_s(pool, role, slo, max_model_len),
        # A redeploy starts the new replicas before the old ones drain, where the cluster has room.
        "max_surge_percent": surge_percent(pool),
        "max_ongoing_requests": max(pool.engine.max_num_seqs * 2, 8),
        # Bounded: past it Serve refuses at once (BackPressureError: a 429 at the gateway, or a
        # recompute for a prefill) instead of queueing without end behind a stuck pool.
        "max_queued_requests": max_queued_requests(admission),
        # The gateway's KV-aware router picks the replica; this Serve router sends the request
        # there and reports the replicas' routing stats (worker id, KV-event endpoints) back.
        "request_router_config": RequestRouterConfig(
            request_router_class="router.routing.serve_router:KVAwareRequestRouter",
            request_routing_stats_period_s=1.0,
        ),
    }
    if pool.autoscaling is not None:
        # Serve takes a fixed count or an autoscaling config, not both (cluster/autoscaling/).
        del options["num_replicas"]
        options["autoscaling_config"] = serve_autoscaling_config(role, pool, slo)
    return options


MIN_DRAIN_S = 20.0  # what Serve gave every pool before the drain was configurable
# A prefill replica's last handoff may be pulled until its lease's deadline, the teardown waits
# for that (prefill_workers/lease_drain.py): its prompts in flight, then one usable lease.
PREFILL_LEASE_S = KV_LEASE_S - LEASE_MARGIN_S


def drain_timeout_s(pool: PoolConfig, role: str, slo: SLOConfig, max_model_len: int) -> float:
    """How long a removed replica may finish what it has (pool.drain_timeout_s): by default, a
    decode replica the tier's longest answer (every token of the context at the tier's
    inter-token objective), a prefill replica its prompts in flight and the decodes' pulls of
    the last one's KV."""
    if pool.drain_timeout_s is not None:
        return pool.drain_timeout_s
    if role == "decode":
        return max(MIN_DRAIN_S, max_model_len * slo.itl_s)
    return MIN_DRAIN_S + PREFILL_LEASE_S


def surge_percent(pool: PoolConfig) -> int:
    """Serve's max_surge_percent for the pool (pool.max_surge_percent). By default a surge only
    where it cannot stall: Serve stops no old replica until its replacement runs, so a new
    replica waiting for the CPU, GPU or custom resource an old one holds would wait forever
    (the old ones keep serving, the redeploy never ends); stop-first instead frees them."""
    if pool.max_surge_percent is not None:
        return pool.max_surge_percent
    reserves = pool.num_cpus > 0 or pool.num_gpus > 0 or bool(pool.placement.resources)
    return 0 if reserves else 100


GATEWAY_SHUTDOWN_MARGIN_S = 10.0  # Serve's drain loop (2 s) before __del__, then closing the gateway's parts


def gateway_drain_s(cfg: ClusterConfig) -> float:
    """How long a gateway replica being removed (a redeploy) lets its open HTTP streams run after
    it stops accepting: the longest any pool lets a removed replica finish (drain_timeout_s), so
    a stream the old gateway holds ends no earlier than the engine replica serving it would."""
    return max(drain_timeout_s(pool, role, t.slo, cfg.model.max_model_len)
               for t in cfg.tiers.values() for role, pool in (("prefill", t.prefill), ("decode", t.decode)))


def gateway_options(cfg: ClusterConfig) -> dict:
    # Room for every tier's admitted and queued requests (router/admission.py), plus probes.
    admitted = sum(t.admission.max_running + t.admission.max_queued for t in cfg.tiers.values())
    ongoing = max(1000, admitted + 100)
    return {
        "num_replicas": cfg.gateway.replicas, "max_ongoing_requests": ongoing, "max_queued_requests": ongoing,
        # Surge: the new gateway listens (SO_REUSEPORT, same port) before the old one stops, so
        # the port always has a listener. It reserves no CPU (router/gateway.py), so it always fits.
        "max_surge_percent": 100,
        # Serve force-kills a replica past this: it must outlast the gateway's own drain.
        "graceful_shutdown_timeout_s": gateway_drain_s(cfg) + GATEWAY_SHUTDOWN_MARGIN_S,
    }


def max_queued_requests(admission: AdmissionConfig) -> int:
    """Each caller's queue for a pool of a tier. A gateway has at most the tier's admitted requests
    (admission.max_running, router/admission.py) in a pool at once, so a longer queue never
    fills unless admission is bypassed; the margin is for probes (stats, cache layout)."""
    return admission.max_running + 16


def build_app(cfg: ClusterConfig, engine_cls: Optional["EngineFactory"] = None) -> Application:
    """The application; `engine_cls` makes each replica's engine from its spec (None: the
    real VLLMEngine; tests/serve/ passes cluster.engine.fake.FakeEngine)."""
    # Imported here, not at the top, only to keep this module light: the deployments and the
    # gateway import vLLM (seconds), and unit tests of the pool options import this module
    # without it. No import circle depends on it (tests/unit/test_import_graph.py).
    from decode_workers.deployment import DecodeWorker
    from prefill_workers.deployment import PrefillWorker
    from router.gateway import Gateway, ServeIngressGateway

    if engine_cls is None:
        from cluster.engine.vllm import VLLMEngine

        engine_cls = VLLMEngine

    def bound(deployment, tier: str, role: str, pool: PoolConfig):
        t = cfg.tiers[tier]
        options = _pool_options(pool, role, t.slo, t.admission, cfg.model.max_model_len)
        return deployment.options(name=PoolId(tier, role).deployment_name, **options).bind(cfg, tier, engine_cls)

    pools = {
        tier: TierPools(prefill=bound(PrefillWorker, tier, "prefill", t.prefill),
                        decode=bound(DecodeWorker, tier, "decode", t.decode))
        for tier, t in cfg.tiers.items()
    }
    gateway = Gateway if cfg.gateway.ingress == "direct" else ServeIngressGateway
    return gateway.options(**gateway_options(cfg)).bind(cfg, pools, gateway_drain_s(cfg))


def proxy_location(cfg: ClusterConfig) -> str:
    """Where Serve runs its HTTP proxy: nowhere when the gateway serves HTTP itself (it takes
    the proxy's host and port), else on the head node only (one gateway address)."""
    return "Disabled" if cfg.gateway.ingress == "direct" else "HeadOnly"
