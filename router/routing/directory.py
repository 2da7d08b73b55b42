"""PoolDirectory: what the gateway knows about one pool's replicas, and per-request pins.

Why a process-level registry: Ray Serve builds the request router of each deployment handle
itself (`KVAwareRequestRouter`, serve_router.py) inside the gateway's process, from a class
path, so no object can be handed to it. It and the gateway's `KVRouter` meet here, under the
key "<app>/<deployment>":

- the Serve router writes the live replicas (id, max_ongoing_requests, the routing stats
  each replica reports: worker id, KV-event endpoints, cache layout, KV usage);
- the gateway reads them to score workers and pins `request_id → replica_id` before it sends
  a request; the Serve router takes the pin when it routes that request.

Both sides run in one process but on different threads (Serve's router loop and the
gateway's loop); every method is a single dict operation under a lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Optional

from cluster.types import APP_NAME, PoolId, RoutingStats


@dataclass(frozen=True)
class ReplicaInfo:
    replica_id: str
    capacity: int
    stats: RoutingStats = field(default_factory=RoutingStats)  # the replica's record_routing_stats()


class PoolDirectory:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._replicas: dict[str, ReplicaInfo] = {}
        self._pins: dict[str, str] = {}

    def set_replicas(self, replicas: list[ReplicaInfo]) -> None:
        with self._lock:
            self._replicas = {r.replica_id: r for r in replicas}

    def replicas(self) -> list[ReplicaInfo]:
        with self._lock:
            return list(self._replicas.values())

    def pin(self, request_id: str, replica_id: str) -> None:
        with self._lock:
            self._pins[request_id] = replica_id

    def take_pin(self, request_id: str) -> Optional[str]:
        with self._lock:
            return self._pins.pop(request_id, None)

    def unpin(self, request_id: str) -> None:
        self.take_pin(request_id)


_DIRECTORIES: dict[str, PoolDirectory] = {}
_DIRECTORIES_LOCK = threading.Lock()


def pool_directory(pool: PoolId, app_name: str = APP_NAME) -> PoolDirectory:
    """The directory of one pool's deployment in this process (created on first use by either side)."""
    return directory_of(app_name, pool.deployment_name)


def directory_of(app_name: str, deployment: str) -> PoolDirectory:
    """The directory under Serve's own names (the Serve router knows its deployment id only)."""
    key = f"{app_name}/{deployment}"
    with _DIRECTORIES_LOCK:
        return _DIRECTORIES.setdefault(key, PoolDirectory())
