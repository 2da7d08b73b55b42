"""KVAwareRequestRouter: Ray Serve's request router for the engine pools.

It runs inside the caller's process (the gateway), one per deployment handle. It decides
nothing itself: the gateway's KVRouter picks the replica and pins it in the PoolDirectory;
this router sends the request there when that replica is among Serve's candidates, and
otherwise (no pin, replica gone, or it rejected the request because it is full) behaves like
Serve's default power-of-two-choices. So routing can only change where a request runs,
never whether it runs.

It also publishes the live replicas and their routing stats into the PoolDirectory: that
is how a new replica (autoscaling, restart) joins routing without a manual step.
Configured per pool in cluster/app.py (`request_router_config`).
"""

from __future__ import annotations

import random
from typing import Any, List, Optional

# Serve's public request-router surface (Ray 2.60). Two private members of RequestRouter are
# still read below, `_deployment_id` and `_replica_queue_len_cache`, as Serve's own routers
# do (UPSTREAM.md; tests/unit/test_upstream_seams.py checks both).
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from cluster.types import RoutingStats
from router.routing.directory import PoolDirectory, ReplicaInfo, directory_of

def request_id_of(pending_request: Optional[PendingRequest]) -> Optional[str]:
    """Our request id: the first argument of prefill(request) / generate(request, handoff),
    or abort(request_id) itself (an abort is pinned to the replica holding the request)."""
    if pending_request is None or not pending_request.args:
        return None
    first = pending_request.args[0]
    if isinstance(first, str):
        return first
    return getattr(first, "request_id", None)


class KVAwareRequestRouter(RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        self._directory: PoolDirectory = directory_of(self._deployment_id.app_name, self._deployment_id.name)

    def update_replicas(self, replicas: List[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._directory.set_replicas([
            ReplicaInfo(r.replica_id.unique_id, r.max_ongoing_requests, RoutingStats.from_dict(r.routing_stats))
            for r in replicas
        ])

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        if pending_request is not None:
            # Back off between rounds when every candidate refused (all full), instead of spinning.
            pending_request.routing_context.should_backoff = True
        request_id = request_id_of(pending_request)
        target = self._directory.take_pin(request_id) if request_id else None
        preferred = [r for r in candidate_replicas if r.replica_id.unique_id == target]
        others = [r for r in candidate_replicas if r.replica_id.unique_id != target]
        return [rank for rank in (preferred, self._two_least_loaded(others)) if rank]

    def _two_least_loaded(self, replicas: List[RunningReplica]) -> List[RunningReplica]:
        """Serve's default fallback: two random replicas, the shorter queue first."""
        sample = random.sample(replicas, min(2, len(replicas)))
        return sorted(sample, key=lambda r: self._replica_queue_len_cache.get(r.replica_id) or 0)
