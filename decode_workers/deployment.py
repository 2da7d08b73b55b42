"""The decode pool: an engine (VLLMEngine in the app) as NIXL consumer. It checks the
prefill's Handoff against its own engine, pulls the prompt's KV from the prefill engine named
in it (or computes the prompt itself when there is none, or it does not fit) and streams
tokens with continuous batching."""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Optional

from ray import serve

from cluster.config import ClusterConfig
from cluster.coalesce import coalesced
from cluster.engine.replica import EngineFactory, EngineReplica, build_engine_spec
from cluster.serve_patch import bind_replica_grpc_on_node_address
from cluster.protocol import EngineRequest
from cluster.tracing import joined, replica_span, replica_tracing, timed_first_output
from cluster.metrics import Counter
from cluster.engine.outbox import Outboxes, WrongReplica
from kv_transfer.handoff import Handoff, HandoffExpired, HandoffMismatch, adapter_key

log = logging.getLogger(__name__)

HANDOFFS_EXPIRED = Counter(
    "tandem_handoffs_expired",
    "Handoffs that reached decode after the prefill's KV lease (minus a margin): recomputed, never pulled.",
    ["tier"],
)


HANDOFFS_MISMATCHED = Counter(
    "tandem_handoffs_mismatched",
    "Handoffs decode could not use (another model, dtype, block size or LoRA adapter): recomputed, never pulled.",
    ["tier"],
)


@serve.deployment(name="DecodeWorker")
class DecodeWorker(EngineReplica):
    def __init__(self, cfg: ClusterConfig, tier: str, engine_cls: EngineFactory):
        bind_replica_grpc_on_node_address()
        self.tier = tier
        self.start_engine(engine_cls(build_engine_spec(cfg, tier, "kv_consumer")), tier)
        HANDOFFS_EXPIRED.labels(tier=tier).inc(0)  # 0, not "no data", on the dashboard until one expires
        HANDOFFS_MISMATCHED.labels(tier=tier).inc(0)
        self.tracing = replica_tracing(cfg, "decode")  # None when observability.tracing is off

    def start_engine(self, engine, tier: str) -> None:
        super().start_engine(engine, tier)
        # Each gateway's streams leave this replica as one Ray item per step (cluster/engine/outbox.py).
        self.outboxes = Outboxes(self.engine.merge_outputs)

    def kv_params(self, request: EngineRequest, handoff: Optional[Handoff]) -> Optional[dict[str, Any]]:
        """vLLM's kv_transfer_params from the handoff, when this engine can pull them; None:
        compute the prompt here."""
        if handoff is None:
            return None
        try:
            return handoff.decode_params(self.info.identity, adapter=adapter_key(request.adapter))
        except HandoffMismatch as exc:
            # Fail fast on an incompatible peer (or KV of another adapter): compute the prompt here instead.
            HANDOFFS_MISMATCHED.labels(tier=self.tier).inc()
            log.warning("request %s: %s (from %s); recomputing locally", request.request_id, exc,
                        handoff.producer_id or "?")
        except HandoffExpired as exc:
            # Its blocks may hold another request's KV by now: never pull them.
            HANDOFFS_EXPIRED.labels(tier=self.tier).inc()
            log.warning("request %s: %s; recomputing locally", request.request_id, exc)
        return None

    def span_attributes(self, request: EngineRequest, handoff: Optional[Handoff] = None,
                        params: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """The KV handoff on the span: pulled (how many blocks) or the prompt computed here, and
        why (no handoff: local prefill or a failed prefill hop; refused: expired or mismatched)."""
        attributes = super().span_attributes(request)
        attributes["tandem.kv.pull"] = params is not None
        if params is not None:
            blocks = len(params.get("remote_block_ids") or ())
            attributes["tandem.kv.blocks"] = blocks
            if self.info.kv_block_bytes is not None:
                attributes["tandem.kv.bytes"] = blocks * self.info.kv_block_bytes
        else:
            attributes["tandem.kv.recompute"] = "no_handoff" if handoff is None else "handoff_refused"
        return attributes

    async def generate(self, request: EngineRequest, handoff: Optional[Handoff]) -> AsyncIterator[Any]:
        params = self.kv_params(request, handoff)
        with replica_span(self.tracing, "tandem.decode", request,
                          lambda: self.span_attributes(request, handoff, params)) as span:
            # Tokens that pile up while the gateway is busy go out as one Ray item (cluster/coalesce.py).
            stream = self.engine.generate(joined(request, span), params)
            async for chunk in coalesced(timed_first_output(stream, span), self.engine.merge_outputs):
                yield chunk

    async def run(self, request: EngineRequest, handoff: Optional[Handoff], gateway: str,
                  stream_id: str) -> AsyncIterator[str]:
        """The request's own Serve call (its queue place, pin, cancellation): yields this
        replica's worker id once accepted, then runs the engine stream, whose outputs go out
        through `gateway`'s subscription under `stream_id` (cluster/engine/outbox.py).
        Cancelled (the client left), it closes the engine stream, which aborts the request in
        the engine."""
        params = self.kv_params(request, handoff)
        box = self.outboxes.open(gateway)
        box.start(stream_id)
        error: Optional[BaseException] = None
        with replica_span(self.tracing, "tandem.decode", request,
                          lambda: self.span_attributes(request, handoff, params)) as span:
            try:
                yield self.info.worker_id
                async for output in timed_first_output(self.engine.generate(joined(request, span), params), span):
                    box.put(stream_id, output)
            except Exception as exc:
                error = exc
                raise
            finally:
                box.end(stream_id, error)

    async def subscribe(self, subscription_id: str, gateway: str, worker_id: str) -> AsyncIterator[list]:
        """`gateway`'s outputs from this replica, a batch per item (cluster/engine/outbox.py);
        refused when Serve routed it to another replica than the one asked for. The id is the
        call's own, for the gateway's pin (router/routing/serve_router.py request_id_of)."""
        if worker_id != self.info.worker_id:
            raise WrongReplica(f"subscription for {worker_id} reached {self.info.worker_id}")
        async for batch in self.outboxes.subscribe(gateway):
            yield batch

    def routing_stats(self) -> dict:
        self.outboxes.reap()  # Serve asks for these every second: the outboxes' clock
        return super().routing_stats()
