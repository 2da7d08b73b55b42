"""The prefill pool: a real vLLM engine as NIXL producer. It computes a prompt's KV
(max_tokens=1), keeps the blocks for a decode engine to pull, and returns the handoff."""

from __future__ import annotations

from ray import serve

from cluster.config import ClusterConfig
from cluster.engine import VLLMEngine
from cluster.serve_patch import bind_replica_grpc_on_node_address
from cluster.protocol import EngineRequest, PrefillResult
from cluster.worker import EngineReplica, build_engine_spec


@serve.deployment(name="PrefillWorker")
class PrefillWorker(EngineReplica):
    def __init__(self, cfg: ClusterConfig, tier: str):
        bind_replica_grpc_on_node_address()
        self.engine = VLLMEngine(build_engine_spec(cfg, tier, "kv_producer"))
        self.export_metrics(tier)

    async def prefill(self, request: EngineRequest) -> PrefillResult:
        with self.signals.pending_prompt(len(request.prompt_token_ids)):  # autoscaling signal
            return await self.engine.prefill(request)
