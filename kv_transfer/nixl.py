"""NIXL wiring for one engine: vLLM's kv_transfer_config and the per-replica environment.

Each engine replica listens on its own NIXL side channel (the handshake socket decode
engines dial to fetch the prefill engine's memory registration), so every replica gets a
port of its own, claimed at replica start (`claim_side_channel`): replicas come and go with
autoscaling.
"""

from __future__ import annotations

import errno
import random
import socket
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from cluster.config import KVTransferConfig
from kv_transfer.cpu_patch import PROGRESS_POLL_ENV
from kv_transfer.handoff import KV_LEASE_S

# vLLM's NixlConnector, capped to pull no more than the prefill computed (connector.py). A
# module path, not an import: only vLLM's EngineCore process loads the class.
CONNECTOR_MODULE = "kv_transfer.connector"

KVRole = Literal["kv_producer", "kv_consumer"]


@dataclass(frozen=True)
class NixlEndpoint:
    host: str
    port: int
    # Holds the port against the other engines on this host until this process ends.
    claim: Optional[socket.socket] = field(default=None, compare=False, repr=False)


def claim_side_channel(host: str, ports: tuple[int, int]) -> NixlEndpoint:
    """A side-channel port in `ports` that nothing listens on and no other engine on this host
    has claimed. vLLM binds it only once the engine is up, minutes later on a busy CPU host, so
    a free port alone is not enough: two replicas starting together could pick the same one.
    The claim is an abstract Unix socket named after the port (Linux: host-wide within the
    network namespace, gone when the process is), kept in the endpoint."""
    low, high = ports
    candidates = list(range(low, high + 1))
    random.shuffle(candidates)
    for port in candidates:
        claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            claim.bind(f"\0tandem-nixl-side-channel-{host}-{port}")
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((host, port))
        except OSError as exc:
            claim.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            continue
        return NixlEndpoint(host=host, port=port, claim=claim)
    raise RuntimeError(f"no free NIXL side-channel port on {host} in {low}-{high}: "
                       "widen kv_transfer.side_channel_ports")


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
        poll = cfg.nixl_progress_poll_ms
        env[PROGRESS_POLL_ENV] = "off" if poll is None else str(poll * 1000)
    return env
