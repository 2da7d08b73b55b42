"""Keep each Serve replica's inter-deployment gRPC server on the node's address.

Ray Serve 2.60 starts, in every replica, a gRPC server for handle calls and binds it on
`[::]:0`, all interfaces, with no setting to change it (ray/serve/_private/replica.py,
`_on_initialized`). It checks Ray's token, but on a laptop nothing of Ray should listen
beyond loopback. Callers dial the replica's node IP, so on a node whose Ray address is
loopback (a local cluster) the server binds that address instead; elsewhere (Kubernetes:
the pod IP, behind the chart's NetworkPolicies) Serve's own choice stands.

Call `bind_replica_grpc_on_node_address()` first thing in a deployment's __init__: Serve
starts the server after the constructor returns. Idempotent. When Serve's code no longer
has the function (a newer Ray) it raises, naming this file and the Ray version it was written
for: on a loopback node the narrowing is what keeps the port off the network, so losing it
must not pass as a log line (UPSTREAM.md; tests/unit/test_upstream_seams.py checks the
function and the call Serve makes; tests/integration/test_security_network.py what listens).
"""

from __future__ import annotations

import ipaddress
from typing import Any, Callable

_ALL_INTERFACES = "[::]:0"
WRITTEN_FOR = "Ray 2.60.0"


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
        raise RuntimeError(f"tandem's Serve patch (cluster/serve_patch.py) was written for {WRITTEN_FOR} and does not "
                           f"apply to Ray {ray.__version__}: ray.serve._private.replica has no "
                           "add_port_to_grpc_server, so the replica's gRPC server would listen on all interfaces. "
                           "Update cluster/serve_patch.py.")
    if not getattr(original, "tandem_narrowed", False):
        replica.add_port_to_grpc_server = narrowed(original, host)
    return True
