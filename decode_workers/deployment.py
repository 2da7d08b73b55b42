"""The decode pool: a real vLLM engine as NIXL consumer. It pulls the prompt's KV from the
prefill engine named in the handoff (or computes it itself when there is none) and streams
tokens with continuous batching."""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Optional

from ray import serve

from cluster.config import ClusterConfig
from cluster.engine import VLLMEngine
from cluster.coalesce import coalesced
from cluster.serve_patch import bind_replica_grpc_on_node_address
from cluster.protocol import EngineRequest, merge_outputs
from cluster.worker import EngineReplica, build_engine_spec
from cluster.metrics import Counter
from kv_transfer.handoff import Handoff, HandoffExpired, HandoffMismatch

log = logging.getLogger(__name__)

HANDOFFS_EXPIRED = Counter(
    "tandem_handoffs_expired",
    "Handoffs that reached decode after the prefill's KV lease (minus a margin): recomputed, never pulled.",
    ["tier"],
)


@serve.deployment(name="DecodeWorker")
class DecodeWorker(EngineReplica):
    def __init__(self, cfg: ClusterConfig, tier: str):
        bind_replica_grpc_on_node_address()
        self.model = cfg.model.served_name
        self.tier = tier
        self.engine = VLLMEngine(build_engine_spec(cfg, tier, "kv_consumer"))
        self.export_metrics(tier)

    async def generate(self, request: EngineRequest, handoff: Optional[Handoff]) -> AsyncIterator[Any]:
        params = None
        if handoff is not None:
            try:
                params = handoff.decode_params(self.model)
            except HandoffMismatch as exc:
                # Fail fast on an incompatible peer: compute the prompt here instead.
                log.warning("request %s: %s; recomputing locally", request.request_id, exc)
            except HandoffExpired as exc:
                # Its blocks may hold another request's KV by now: never pull them.
                HANDOFFS_EXPIRED.labels(tier=self.tier).inc()
                log.warning("request %s: %s; recomputing locally", request.request_id, exc)
        # Tokens that pile up while the gateway is busy go out as one Ray item (cluster/coalesce.py).
        async for chunk in coalesced(self.engine.decode(request, params), merge_outputs):
            yield chunk
