"""The prefill pool: an engine (VLLMEngine in the app) as NIXL producer. It computes a
prompt's KV (max_tokens=1), keeps the blocks for a decode engine to pull, and returns the
Handoff it made and stamped: its own engine's identity and the lease's deadline (with
first-token reuse also the answer's first token). A request with a short answer may run here
whole (`generate`, the P/D decider's "whole" path): no handoff, no decode hop."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, AsyncIterator

from ray import serve

from cluster.coalesce import coalesced
from cluster.config import ClusterConfig
from cluster.engine.replica import EngineFactory, EngineReplica, build_engine_spec
from cluster.serve_patch import bind_replica_grpc_on_node_address
from cluster.protocol import EngineRequest, PrefillResult
from cluster.tracing import joined, replica_span, replica_tracing
from kv_transfer.handoff import Handoff, adapter_key, lease_deadline
from prefill_workers.lease_drain import drain_leases

log = logging.getLogger(__name__)


@serve.deployment(name="PrefillWorker")
class PrefillWorker(EngineReplica):
    _last_lease_deadline = 0.0  # wall clock: the latest deadline of a handoff this replica made

    def __init__(self, cfg: ClusterConfig, tier: str, engine_cls: EngineFactory):
        bind_replica_grpc_on_node_address()
        self.start_engine(engine_cls(build_engine_spec(cfg, tier, "kv_producer")), tier)
        self.tracing = replica_tracing(cfg, "prefill")  # None when observability.tracing is off

    async def prefill(self, request: EngineRequest, first_token: bool = False) -> PrefillResult:
        """`first_token`: sample the answer's first token here (kv_transfer/first_token.py)."""
        with replica_span(self.tracing, "tandem.prefill", request,
                          lambda: self.span_attributes(request)) as span:
            with self.signals.pending_prompt(len(request.prompt_token_ids)):  # autoscaling signal
                result = await self.engine.prefill(joined(request, span), first_token=first_token)
            result = dataclasses.replace(result, handoff=self.handoff(result, request))
            if span is not None:
                span.set_attributes({"tandem.handoff": result.handoff is not None,
                                     "tandem.first_token": result.first is not None})
            return result

    async def generate(self, request: EngineRequest) -> AsyncIterator[Any]:
        """The whole request, streamed (as a decode replica streams, cluster/coalesce.py)."""
        with replica_span(self.tracing, "tandem.whole", request,
                          lambda: self.span_attributes(request)) as span:
            stream = coalesced(self.engine.generate(joined(request, span), None), self.engine.merge_outputs)
            try:
                with self.signals.pending_prompt(len(request.prompt_token_ids)):  # autoscaling signal
                    first = await anext(stream, None)
                if first is None:
                    return
                yield first
                async for chunk in stream:
                    yield chunk
            finally:
                await stream.aclose()

    def handoff(self, result: PrefillResult, request: EngineRequest) -> Handoff | None:
        """The envelope decode checks. None when the answer ended on its first token (nothing
        to hand over); HandoffMismatch (the gateway recomputes) when the engine returned
        params that are no remote-prefill handoff."""
        if result.first is not None and result.first.finished:
            return None
        # The engine's lease on the blocks started as the prefill finished: stamp it now.
        deadline = lease_deadline()
        self._last_lease_deadline = max(self._last_lease_deadline, deadline)
        return Handoff.from_prefill(self.info.identity, result.kv_transfer_params, deadline,
                                    producer_id=self.info.worker_id, adapter=adapter_key(request.adapter))

    async def __del__(self):
        """Serve's teardown (it awaits an async `__del__`, once its ongoing calls have ended):
        the decodes' pulls of what this replica handed out finish first (lease_drain.py), then
        the engine stops. The pool's drain_timeout_s (cluster/app.py) leaves room for the last
        lease. Only Serve calls it: the interpreter's own finalizer would not await it."""
        engine = getattr(self, "engine", None)
        if engine is not None:
            drained = await drain_leases(engine.holds_kv, self._last_lease_deadline)
            if drained.outcome != "none":
                log.info("%s: KV leases %s after %.1f s", self.info.worker_id, drained.outcome, drained.waited_s)
        EngineReplica.__del__(self)
