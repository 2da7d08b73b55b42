"""ClusterConfig: the one YAML that drives a local run and the Helm chart.

Validated once, here, at the edge. Everything downstream receives these frozen models and
never re-checks them. Relative paths in the YAML resolve against the YAML file's folder so a
config works from any working directory.

The package's modules, by subject (import from `cluster.config`, this facade):
- base.py: sizes as vLLM reads them ("256M", "4G"), Hub ids, ConfigError, the strict frozen base model;
- pools.py: the model, the engines and the pools of each tier (placement, autoscaling, SLOs,
  admission);
- services.py: KV transfer, the gateway's edge, routing and its index, auth, Ray;
- observability.py: tracing (OpenTelemetry);
- cluster_config.py: ClusterConfig (cross-field checks), loading a YAML, error messages.
"""

from cluster.config.base import MiB, SIZE_PATTERN, HumanInt, ConfigError, is_hub_id, parse_size
from cluster.config.cluster_config import ClusterConfig, explain
from cluster.config.observability import ObservabilityConfig, TracingConfig
from cluster.config.pools import (AdmissionConfig, AutoscalingConfig, EngineConfig, ModelConfig, PlacementConfig,
                                  PoolConfig, SLOConfig, TierConfig)
from cluster.config.services import (ApiKeySource, AuthConfig, GatewayConfig, KVTransferConfig, RateLimitConfig,
                                     RayConfig, RedisTLSConfig, RoutingConfig, RoutingIndexConfig, TenantConfig)

__all__ = [
    "AdmissionConfig", "ApiKeySource", "AuthConfig", "AutoscalingConfig", "HumanInt", "ClusterConfig", "ConfigError",
    "EngineConfig", "GatewayConfig", "KVTransferConfig", "MiB", "ModelConfig", "PlacementConfig", "PoolConfig",
    "RateLimitConfig", "RayConfig", "RedisTLSConfig", "RoutingConfig", "RoutingIndexConfig", "SIZE_PATTERN",
    "ObservabilityConfig", "SLOConfig", "TenantConfig", "TierConfig", "TracingConfig", "explain", "is_hub_id", "parse_size",
]
