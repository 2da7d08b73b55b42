"""NIXL wiring for one engine: vLLM's kv_transfer_config and the per-replica environment.

Each engine replica listens on its own NIXL side channel (the handshake socket decode
engines dial to fetch the prefill engine's memory registration), so every replica gets a
free port of its own, chosen at replica start: replicas come and go with autoscaling.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any, Literal

from cluster.config import KVTransferConfig
from kv_transfer.handoff import KV_LEASE_S

# vLLM's NixlConnector, capped to pull no more than the prefill computed (connector.py). A
# module path, not an import: only vLLM's EngineCore process loads the class.
CONNECTOR_MODULE = "kv_transfer.connector"

KVRole = Literal["kv_producer", "kv_consumer"]


@dataclass(frozen=True)
class NixlEndpoint:
    host: str
    port: int


def free_port(host: str) -> int:
    """A port nothing listens on now. Racy by nature; the window is the engine's start-up."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def resolve_buffer_device(cfg: KVTransferConfig, on_gpu: bool) -> str:
    if cfg.buffer_device != "auto":
        return cfg.buffer_device
    return "cuda" if on_gpu else "cpu"


def kv_transfer_config(cfg: KVTransferConfig, role: KVRole, on_gpu: bool) -> dict[str, Any]:
    """The dict vLLM's KVTransferConfig takes for a prefill (producer) or decode (consumer)."""
    # Explicit, so the handoff's lease deadline (kv_transfer/handoff.py) matches the engine's.
    extra: dict[str, Any] = {"kv_lease_duration": KV_LEASE_S}
    if not on_gpu:
        # One UCX worker thread is plenty on loopback and keeps idle CPU low on small hosts.
        extra["num_threads"] = 1
    return {
        "kv_connector": "NixlConnector",
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": role,
        "kv_buffer_device": resolve_buffer_device(cfg, on_gpu),
        "kv_load_failure_policy": cfg.failure_policy,
        "kv_connector_extra_config": extra,
    }


def nixl_env(cfg: KVTransferConfig, endpoint: NixlEndpoint, on_gpu: bool) -> dict[str, str]:
    """Environment the engine's processes need; set before the engine starts (children inherit)."""
    env = {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": endpoint.host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(endpoint.port),
        "UCX_TLS": cfg.ucx_tls,
    }
    if cfg.ucx_net_devices:
        env["UCX_NET_DEVICES"] = cfg.ucx_net_devices
    if cfg.cpu_patch and not on_gpu:
        env["TANDEM_NIXL_CPU_PATCH"] = "1"
    return env
