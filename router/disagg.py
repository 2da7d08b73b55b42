"""DisaggregatedBackend: one request's path through the pools, behind the OpenAI edge.

prefill pool (max_tokens=1, returns a Handoff) → decode pool (pulls the KV over NIXL, streams).

Which prefill and decode replica, and whether to prefill remotely at all, is the KVRouter's
decision (router/routing/service.py); it never fails a request: when it cannot decide, Serve
picks the replica as before.

Failure policy, in order of what can go wrong:
- the prefill hop raises, times out, or returns no handoff → decode computes the prompt
  itself ("fallback_recompute", counted by reason). Latency, not a lost request.
- the KV pull fails inside decode → vLLM's kv_load_failure_policy=recompute handles it.
- the decode hop fails before the first token → retried once on the decode pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, AsyncIterator, Optional

from prometheus_client import Counter

from cluster.protocol import EngineRequest, TierPools, TokenChunk
from kv_transfer.handoff import Handoff, HandoffMismatch
from router.routing.types import RouteDecision

log = logging.getLogger(__name__)

ROUTES = Counter(
    "tandem_route_total",
    "Requests by serving path: disaggregated, or recomputed on decode and why.",
    ["path", "reason"],
)
DECODE_RETRIES = Counter("tandem_decode_retries_total", "Decode hops retried before the first token.")

HEALTH_TIMEOUT_S = 5.0


class DisaggregatedBackend:
    """Implements router.openai's OpenAIBackend over Ray Serve handles to the two pools."""

    def __init__(self, *, model_id: str, max_model_len: int, tokenizer: Any, pools: dict[str, TierPools],
                 default_tier: str, prefill_timeout_s: float, router: Any = None):
        self.model_id = model_id
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer
        self._pools = pools
        self._default_tier = default_tier
        self._prefill_timeout_s = prefill_timeout_s
        self._router = router  # a KVRouter, or None: Serve's own replica choice

    def _tier(self, request: EngineRequest) -> TierPools:
        return self._pools[request.tier or self._default_tier]

    async def _handoff(self, request: EngineRequest, prefill: Any) -> Optional[Handoff]:
        """Run the prefill hop; None means: decode computes the prompt itself."""
        reason = None
        try:
            result = await asyncio.wait_for(prefill.prefill.remote(request), timeout=self._prefill_timeout_s)
            handoff = Handoff.from_prefill(self.model_id, result.kv_transfer_params)
        except asyncio.TimeoutError:
            reason = "prefill_timeout"
            prefill.abort.remote(request.request_id)
        except HandoffMismatch as exc:
            reason = "bad_handoff"
            log.warning("request %s: %s", request.request_id, exc)
        except Exception as exc:  # a dead or missing replica: any Ray error lands here
            reason = "prefill_error"
            log.warning("request %s: prefill failed (%s: %s); recomputing on decode",
                        request.request_id, type(exc).__name__, exc)
        if reason is not None:
            ROUTES.labels(path="fallback_recompute", reason=reason).inc()
            return None
        ROUTES.labels(path="disaggregated", reason="").inc()
        return handoff

    async def _route(self, request: EngineRequest) -> Optional[RouteDecision]:
        if self._router is None:
            return None
        try:
            return await self._router.route(request, request.tier or self._default_tier)
        except Exception:  # routing must never fail a request
            log.exception("request %s: routing failed; Serve picks the replicas", request.request_id)
            ROUTES.labels(path="router_error", reason="").inc()
            return None

    def _dispatch(self, decision: Optional[RouteDecision], pool: str, request_id: str):
        if decision is None:
            return contextlib.nullcontext()
        return self._router.dispatch(decision.prefill if pool == "prefill" else decision.decode, request_id)

    async def generate(self, request: EngineRequest) -> AsyncIterator[TokenChunk]:
        pools = self._tier(request)
        decision = await self._route(request)
        if decision is not None and decision.skip_prefill:
            handoff = None  # the P/D decider: decode computes the short uncached part itself
            ROUTES.labels(path="decode_only", reason="").inc()
        else:
            with self._dispatch(decision, "prefill", request.request_id):
                handoff = await self._handoff(request, pools.prefill)
        for attempt in (1, 2):
            # The retry goes wherever Serve sends it: the chosen replica may be the broken one.
            routed = decision if attempt == 1 else None
            started = False
            stream = None
            try:
                with self._dispatch(routed, "decode", request.request_id):
                    stream = pools.decode.options(stream=True).generate.remote(request, handoff)
                    async for chunk in stream:
                        started = True
                        yield chunk
                return
            except (asyncio.CancelledError, GeneratorExit):
                if stream is not None:  # cancelled before the decode call was made: nothing to cancel
                    stream.cancel()
                raise
            except Exception:
                if started or attempt == 2:
                    raise
                DECODE_RETRIES.inc()
                log.warning("request %s: decode failed before the first token; retrying", request.request_id)

    async def abort(self, request_id: str) -> None:
        # The edge does not say which tier a request ran in; aborting an unknown id is a no-op.
        handles = [h for pools in self._pools.values() for h in (pools.decode, pools.prefill)]
        await asyncio.gather(*(h.abort.remote(request_id) for h in handles), return_exceptions=True)

    async def health(self) -> dict[str, Any]:
        """Ready only when every pool of every tier answers."""

        async def probe(handle) -> bool:
            try:
                await asyncio.wait_for(handle.stats.remote(), timeout=HEALTH_TIMEOUT_S)
                return True
            except Exception:
                return False

        names = [(tier, pool) for tier in self._pools for pool in ("prefill", "decode")]
        results = await asyncio.gather(*(probe(getattr(self._pools[t], p)) for t, p in names))
        pools = {f"{t}-{p}": ok for (t, p), ok in zip(names, results)}
        return {"ready": all(results), "pools": pools}
