"""Keep each Serve replica's inter-deployment gRPC server on the node's address.

Ray Serve 2.60 starts, in every replica, a gRPC server for handle calls and binds it on
`[::]:0`, all interfaces, with no setting to change it (ray/serve/_private/replica.py,
`_on_initialized`). It checks Ray's token, but on a laptop nothing of Ray should listen
beyond loopback. Callers dial the replica's node IP, so on a node whose Ray address is
loopback (a local cluster) the server binds that address instead; elsewhere (Kubernetes:
the pod IP, behind the chart's NetworkPolicies) Serve's own choice stands.

Call `bind_replica_grpc_on_node_address()` first thing in a deployment's __init__: Serve
starts the server after the constructor returns. Idempotent; a no-op when Serve's code no
longer has the function (a newer Ray), so a version change can only lose the narrowing,
which tests/integration/test_security_network.py reports.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any, Callable

log = logging.getLogger(__name__)

_ALL_INTERFACES = "[::]:0"


def narrowed(add_port: Callable[[Any, str], int], host: str) -> Callable[[Any, str], int]:
    """`add_port` with Serve's all-interfaces address replaced by `host` (port still 0)."""
    def add_port_on_host(server: Any, address: str) -> int:
        return add_port(server, f"{host}:0" if address == _ALL_INTERFACES else address)

    add_port_on_host.tandem_narrowed = True  # type: ignore[attr-defined]
    return add_port_on_host


def bind_replica_grpc_on_node_address(node_ip: Callable[[], str] | None = None) -> bool:
    """Narrow this process's replica gRPC server to the node's loopback address; True if done."""
    import ray
    from ray.serve._private import replica

    host = (node_ip or ray.util.get_node_ip_address)()
    if not ipaddress.ip_address(host).is_loopback:
        return False
    original = getattr(replica, "add_port_to_grpc_server", None)
    if original is None:
        log.warning("Serve has no add_port_to_grpc_server: its replica gRPC server keeps Serve's address")
        return False
    if not getattr(original, "tandem_narrowed", False):
        replica.add_port_to_grpc_server = narrowed(original, host)
    return True
