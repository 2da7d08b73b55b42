"""The prefill pool: a real vLLM engine as NIXL producer. It computes a prompt's KV
(max_tokens=1), keeps the blocks for a decode engine to pull, and returns the handoff (with
first-token reuse also the answer's first token)."""

from __future__ import annotations

import dataclasses

from ray import serve

from cluster.config import ClusterConfig
from cluster.engine import VLLMEngine
from cluster.serve_patch import bind_replica_grpc_on_node_address
from cluster.protocol import EngineRequest, PrefillResult
from cluster.worker import EngineReplica, build_engine_spec
from kv_transfer.handoff import lease_deadline


@serve.deployment(name="PrefillWorker")
class PrefillWorker(EngineReplica):
    def __init__(self, cfg: ClusterConfig, tier: str):
        bind_replica_grpc_on_node_address()
        self.engine = VLLMEngine(build_engine_spec(cfg, tier, "kv_producer"))
        self.export_metrics(tier)

    async def prefill(self, request: EngineRequest, first_token: bool = False) -> PrefillResult:
        """`first_token`: sample the answer's first token here (kv_transfer/first_token.py)."""
        with self.signals.pending_prompt(len(request.prompt_token_ids)):  # autoscaling signal
            result = await self.engine.prefill(request, first_token=first_token)
        # The engine's lease on the blocks started as the prefill finished: stamp it now.
        return dataclasses.replace(result, lease_deadline=lease_deadline())
