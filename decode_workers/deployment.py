"""The decode pool: a real vLLM engine as NIXL consumer. It pulls the prompt's KV from the
prefill engine named in the handoff (or computes it itself when there is none) and streams
tokens with continuous batching."""

from __future__ import annotations

import logging
from typing import AsyncIterator, Optional

from ray import serve

from cluster.config import ClusterConfig
from cluster.engine import VLLMEngine
from cluster.serve_patch import bind_replica_grpc_on_node_address
from cluster.protocol import EngineRequest, TokenChunk
from cluster.worker import EngineReplica, build_engine_spec
from kv_transfer.handoff import Handoff, HandoffMismatch

log = logging.getLogger(__name__)


@serve.deployment(name="DecodeWorker")
class DecodeWorker(EngineReplica):
    def __init__(self, cfg: ClusterConfig, tier: str):
        bind_replica_grpc_on_node_address()
        self.model = cfg.model.served_name
        self.engine = VLLMEngine(build_engine_spec(cfg, tier, "kv_consumer"))
        self.export_metrics(tier)

    async def generate(self, request: EngineRequest, handoff: Optional[Handoff]) -> AsyncIterator[TokenChunk]:
        params = None
        if handoff is not None:
            try:
                params = handoff.decode_params(self.model)
            except HandoffMismatch as exc:
                # Fail fast on an incompatible peer: compute the prompt here instead.
                log.warning("request %s: %s; recomputing locally", request.request_id, exc)
        async for chunk in self.engine.decode(request, params):
            yield chunk
